"""Which records the keeper removes when it cannot watch their sandbox (agent/keeper.py
`watch`): a netns missing from a directory it sees is gone (a reboot, a DEL it never saw);
one in a directory it does not see (a mount missing from the agent's pod) is kept. No root:
the "node" is a directory (SandboxFinder's host root)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from multicall.agent.keeper import Keeper
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.keeper import SandboxRecord
from multicall.effects.pod_sandbox import SandboxFinder
from multicall.effects.sandbox_records import RecordStore

NETNS = "/var/run/netns/cni-0f1e"


def keeper(tmp_path: Path) -> tuple[Keeper, RecordStore, SandboxRecord, list[str]]:
    store = RecordStore(str(tmp_path / "records"))
    store.ready()
    record = SandboxRecord(
        container_id="c0f1e", ifname="eth0", network="cbxnet", netns=NETNS,
        args={"K8S_POD_NAMESPACE": "app", "K8S_POD_NAME": "web"}, ips=("10.89.0.7",),
        mode=Mode.NFT, families=(Family.IPV4,), options=ProxyInitOptions(),
    )  # fmt: skip
    store.write(record)
    logs: list[str] = []
    unused = cast(Any, None)  # not reached: nothing is compared or repaired here
    k = Keeper(
        store=store,
        finder=SandboxFinder("", "", str(tmp_path / "node")),
        repairer=unused,
        firewall=unused,
        events=unused,
        pods=unused,
        log=lambda level, line: logs.append(f"{level} {line}"),
    )
    return k, store, record, logs


def test_a_netns_gone_from_a_directory_the_keeper_sees_is_pruned(tmp_path: Path) -> None:
    k, store, record, logs = keeper(tmp_path)
    (tmp_path / "node" / "var" / "run" / "netns").mkdir(parents=True)
    k.watch(record)
    assert list(store.keys()) == []
    assert k.metrics.pruned == 1
    assert not k.watched
    assert any("removed" in line for line in logs), logs


def test_a_file_that_is_no_netns_any_more_is_pruned(tmp_path: Path) -> None:
    """After a reboot on a disk-backed /var/run/netns: the bind mount is gone, the file stays."""
    k, store, record, _logs = keeper(tmp_path)
    stale = tmp_path / "node" / NETNS.lstrip("/")
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"")
    k.watch(record)
    assert list(store.keys()) == []
    assert k.metrics.pruned == 1


def test_a_directory_the_keeper_does_not_see_keeps_the_record(tmp_path: Path) -> None:
    k, store, record, logs = keeper(tmp_path)
    (tmp_path / "node").mkdir()  # no var/run/netns: the agent's pod lacks the mount
    k.watch(record)
    assert list(store.keys()) == [record.key]
    assert k.metrics.pruned == 0
    assert any("not watching" in line for line in logs), logs
