"""A repair programs the node's linkerd-cni entry as it is now (agent/keeper.py `follow`):
when the entry's mode changed since the pod's ADD, the record follows what the repair
programmed, so the next comparison is against that and the sandbox is not re-programmed on
every check until the back-off stops it. No root: the repairer and the pod lookup are fakes
and `watch` (which opens the netns) is replaced by a recorder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from multicall.agent.keeper import Keeper, Watched
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.keeper import Reason, SandboxRecord
from multicall.effects.sandbox_records import RecordStore
from multicall.plugin.recording import Programmed

NETNS = "/var/run/netns/cni-0f1e"


class Repairer:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.calls = 0

    def repair_sandbox(self, found: object, ips: tuple[str, ...]) -> Programmed:
        self.calls += 1
        return Programmed(
            netns=cast(Any, None), options=ProxyInitOptions(), mode=self.mode,
            families=(Family.IPV4,),
        )  # fmt: skip


class Finder:
    def plugin_config(self, network: str) -> bytes:
        return b"{}"


class Pods:
    def gone(self, record: SandboxRecord) -> None:
        return None


class RecordingKeeper(Keeper):
    """`watch` recorded instead of opening the netns."""

    calls: list[tuple[SandboxRecord, tuple[float, ...]]]

    def watch(self, record: SandboxRecord, repairs: tuple[float, ...] = ()) -> None:
        self.calls.append((record, repairs))


class Events:
    def post(self, record: SandboxRecord, action: str, note: str) -> bool:
        return False


def setup(tmp_path: Path, now: Mode) -> tuple[RecordingKeeper, RecordStore, Watched, list[Any]]:
    store = RecordStore(str(tmp_path / "records"))
    store.ready()
    record = SandboxRecord(
        container_id="c0f1e", ifname="eth0", network="cbxnet", netns=NETNS,
        args={"K8S_POD_NAMESPACE": "app", "K8S_POD_NAME": "web"}, ips=("10.89.0.7",),
        mode=Mode.LEGACY, families=(Family.IPV4,), options=ProxyInitOptions(),
    )  # fmt: skip
    store.write(record)
    k = RecordingKeeper(
        store=store,
        finder=cast(Any, Finder()),
        repairer=cast(Any, Repairer(now)),
        firewall=cast(Any, None),
        events=Events(),
        pods=Pods(),
        log=lambda level, line: None,
    )
    watched = Watched(record, NETNS, (1, 2), repairs=(5.0,))
    k.watched[record.key] = watched
    k.calls = []
    return k, store, watched, k.calls


def test_the_record_follows_a_repair_in_another_mode(tmp_path: Path) -> None:
    k, store, watched, calls = setup(tmp_path, now=Mode.NFT)
    k.repair(watched, (Reason.CHANGED,), since=0.0)
    stored = store.read(watched.record.key)
    assert stored is not None
    assert stored.mode is Mode.NFT
    assert [(rec.mode, len(repairs)) for rec, repairs in calls] == [(Mode.NFT, 2)]
    assert watched.record.key not in k.watched  # replaced by the new watch


def test_a_repair_in_the_records_mode_keeps_the_record(tmp_path: Path) -> None:
    k, store, watched, calls = setup(tmp_path, now=Mode.LEGACY)
    k.repair(watched, (Reason.CHANGED,), since=0.0)
    assert store.read(watched.record.key) == watched.record
    assert calls == []
    assert k.watched[watched.record.key] is watched
