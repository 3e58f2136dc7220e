"""The node agent's keeper (agent/keeper.py) in throwaway network namespaces, against the
list/watch API stand-in: the real libcni runs the node's chain for "pods" (netns), the
keeper runs on a thread inside the node netns, as the agent's keeper process would.

1. A pod started while linkerd-cni was missing from the conflist is found in the runtime's
   CNI cache and programmed in place (upstream's exact nat table), with an Event.
2. Drift while the keeper runs: flush, one rule deleted, a foreign rule before the redirect,
   another proxy port, the chain deleted (each one transaction, iptables-restore --noflush):
   each is detected and repaired (nft: within 1 s of the change, by the kernel's
   notification; legacy: within one sweep), with an Event and the metrics.
3. DEL (the record removed) stops the watch; idle pods are never repaired.
4. With the agent's pod cache (agent/pod_cache.py rule 4, asked over a channel as the
   agent's parent answers it): discovery and repairs of pods the cache holds make no GET.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from multicall.agent.identity import FollowedKube
from multicall.agent.keeper import ApiEvents, ApiPods, CachedPods, Keeper
from multicall.agent.pod_cache import Ask, CachedControllerKube, CacheFeed, ClusterOf, ask_parent
from multicall.core.keeper import BackOff, KeeperMode
from multicall.effects.kube.stream import Session
from tests.netns.test_repair_controller import (  # noqa: F401 - fixtures
    NODE,
    Node,
    driver,
    nat,
    node,
)
from tests.support import require_tool
from tests.support.kubewatch import pod_doc
from tests.support.rig import Netns
from tests.support.scenarios import fixture_text
from tests.support.waiting import wait_for

pytestmark = pytest.mark.netns

SWEEP = 0.5
CHANGES = {  # what an operator or another tool might do to a running pod's nat table
    "flush": ["-F PROXY_INIT_REDIRECT"],
    "delete one rule": ["-D PROXY_INIT_OUTPUT 1"],
    "foreign rule before the redirect": ["-I PROXY_INIT_REDIRECT 1 -p tcp -j RETURN"],
    "another proxy port": [
        "-R PROXY_INIT_OUTPUT 3 -p tcp -m comment --comment "
        '"proxy-init/redirect-all-outgoing-to-proxy-port" -j REDIRECT --to-ports 4999'
    ],
    "chain deleted": [
        "-D PREROUTING -m comment --comment "
        '"proxy-init/install-proxy-init-prerouting" -j PROXY_INIT_REDIRECT',
        "-F PROXY_INIT_REDIRECT",
        "-X PROXY_INIT_REDIRECT",
    ],
}


@dataclass
class Running:
    keeper: Keeper
    thread: threading.Thread
    stop_w: int
    failed: list[BaseException]
    session: Session

    def stop(self) -> None:
        os.close(self.stop_w)
        self.thread.join(10)
        self.session.close()
        assert not self.thread.is_alive()
        assert not self.failed, self.failed


def start_keeper(
    node: Node,  # noqa: F811
    net_dir: Path,
    mode: KeeperMode = KeeperMode.REPAIR,
    ask: Ask | None = None,
) -> Running:
    from multicall.effects import ns
    from multicall.effects.kube.stream import ClientOptions, Token, load_config
    from multicall.effects.pod_sandbox import SandboxFinder
    from multicall.effects.sandbox_records import RecordStore
    from multicall.plugin.in_place import ControllerKube, Repairer
    from multicall.plugin.ports import RealFirewall

    if node.mode == "legacy":
        from multicall.effects.firewall.legacy.loading import iptc

        iptc()  # its import stubs subprocess.Popen process-wide: not while the test runs tools
    options = ClientOptions(kubeconfig=str(node.kubeconfig))
    config = load_config(options, {})
    session = Session(config, Token(config), options)
    finder = SandboxFinder(str(net_dir), str(node.tmp / "cache"), "")
    firewall = RealFirewall()
    logs = node.logs
    kube: ControllerKube | CachedControllerKube = ControllerKube(config)
    pods: ApiPods | CachedPods = ApiPods(lambda: session)
    if ask is not None:  # as agent/keeper_process.py `build_keeper` wraps them
        current = lambda: (config, 0)  # noqa: E731
        kube = CachedControllerKube(FollowedKube(current), ask, ClusterOf(current))
        pods = CachedPods(ApiPods(lambda: session), ask, ClusterOf(current))
    keeper = Keeper(
        store=RecordStore(str(node.tmp / "records")),
        finder=finder,
        repairer=Repairer(finder, kube, logs.append, firewall),
        firewall=firewall,
        events=ApiEvents(lambda: session, "keeper-test"),
        pods=pods,
        log=lambda level, line: logs.append(f"{level} {line}"),
        mode=mode,
        sweep_every=SWEEP,
        backoff=BackOff(attempts=20, window=60.0, next_delay=0.0),
    )
    stop_r, stop_w = os.pipe()
    failed: list[BaseException] = []

    def body() -> None:
        try:
            fd = os.open(node.netns.path, os.O_RDONLY)
            ns.setns(fd, ns.CLONE_NEWNET)  # this thread only: the node's netns
            os.close(fd)
            keeper.run(stop_r)
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
            failed.append(exc)
        finally:
            os.close(stop_r)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return Running(keeper, thread, stop_w, failed, session)


def repaired(keeper: Keeper, count: int) -> bool:
    return keeper.metrics.repaired >= count


def restore(netns: Netns, mode: str, lines: list[str]) -> None:
    tool = {"nft": "iptables-nft-restore", "legacy": "iptables-legacy-restore"}[mode]
    text = "*nat\n" + "\n".join(lines) + "\nCOMMIT\n"
    subprocess.run(["ip", "netns", "exec", netns.name, tool, "--noflush"], input=text,
                   text=True, check=True, capture_output=True)  # fmt: skip


@pytest.mark.parametrize("mode", ["nft", "legacy"])
def test_keeper_programs_a_pod_found_without_rules_and_repairs_every_drift(
    node: Node,  # noqa: F811
    mode: str,
) -> None:
    require_tool(f"iptables-{mode}-restore")
    node.mode = mode
    upstream = fixture_text(f"default-{mode}")
    pod, netns = node.sandbox("web-5d8-k1", with_linkerd=False)  # before install-cni re-chained
    assert "PROXY_INIT" not in nat(netns, mode)
    net_dir = node.fix_chain_on_disk()
    running = start_keeper(node, net_dir)
    try:
        wait_for(lambda: nat(netns, mode) == upstream, "the pod programmed in place", timeout=10)
        wait_for(lambda: len(node.api.events) == 1, "the adoption's Event")
        assert node.api.events[0]["action"] == "Repairing"
        assert node.api.events[0]["regarding"]["name"] == "web-5d8-k1"
        keeper = running.keeper
        assert keeper.metrics.repairs["never_programmed"] == 1
        wait_for(lambda: bool(keeper.watched), "the adopted sandbox watched")
        assert keeper.metrics.watched == ({"events": 1, "sweep": 0} if mode == "nft"
                                          else {"events": 0, "sweep": 1})  # fmt: skip
        records = list((node.tmp / "records").iterdir())
        assert len(records) == 1
        assert json.loads(records[0].read_bytes())["source"] == "repair"
        took = {}
        for n, (what, lines) in enumerate(CHANGES.items(), start=1):
            restore(netns, mode, lines)
            changed = time.monotonic()
            wait_for(partial(repaired, keeper, n + 1), f"the repair of: {what}", timeout=10)
            took[what] = time.monotonic() - changed
            assert nat(netns, mode) == upstream, what
        assert keeper.metrics.repair_failures == 0
        wait_for(lambda: len(node.api.events) == 1 + len(CHANGES), "one Event per repair")
        notes = [e["note"] for e in node.api.events[1:]]
        assert all(e["action"] == "Repairing" for e in node.api.events[1:])
        assert any("missing_chain" in note for note in notes), notes
        assert any("changed" in note for note in notes), notes
        assert any("foreign_rule" in note for note in notes), notes
        bound = 1.0 if mode == "nft" else SWEEP + 1.0  # nft: notified; legacy: one sweep
        assert max(took.values()) < bound, took
        assert keeper.metrics.detection.state.count == len(CHANGES)  # the adoption is none
        text = keeper.metrics.render()
        assert 'cnibox_agent_keeper_drift_total{reason="missing_chain"}' in text
        # DEL (the runtime's: its cache entry goes; the agent's worker removes the record):
        # the watch goes; a later change to the netns is left alone
        proc = node.runtime.run("del", node.chain(with_linkerd=True), netns.path,
                                container_id=f"c{netns.name}", pod=("app", "web-5d8-k1"),
                                pod_uid=pod["metadata"]["uid"])  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        records[0].unlink()
        wait_for(lambda: not keeper.watched, "the watch dropped after DEL")
        restore(netns, mode, CHANGES["flush"])
        time.sleep(2 * SWEEP + 0.5)
        assert "PROXY_INIT_REDIRECT -p tcp" not in nat(netns, mode)
        assert keeper.metrics.repaired == 1 + len(CHANGES)  # the adoption too
    finally:
        running.stop()
    print(f"\n{mode}: seconds from change to repaired: {took}")


def test_report_mode_reports_and_never_repairs(node: Node) -> None:  # noqa: F811
    _pod, netns = node.sandbox("web-5d8-r1", with_linkerd=True)
    net_dir = node.fix_chain_on_disk()
    upstream = fixture_text("default-nft")
    assert nat(netns) == upstream
    running = start_keeper(node, net_dir, KeeperMode.REPORT)
    try:
        time.sleep(1.0)
        assert running.keeper.metrics.repaired == 0  # report mode programs nothing
        # a record as the agent's worker writes it after the ADD it served
        from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
        from multicall.core.keeper import encode, record_from_sandbox
        from multicall.core.repair.sandbox import parse_cache_entry

        cached = next((node.tmp / "cache" / "results").iterdir()).read_bytes()
        entry = parse_cache_entry(cached)
        assert entry is not None
        options = ProxyInitOptions(inbound_ports_to_ignore=("4191", "4190"))
        record = record_from_sandbox(entry, mode=Mode.NFT, families=(Family.IPV4,), options=options)
        assert record is not None
        (node.tmp / "records" / record.key).write_bytes(encode(record))
        wait_for(lambda: bool(running.keeper.watched), "the record watched")
        time.sleep(0.5)
        assert not any(running.keeper.metrics.drift.values())  # the rules are there
        restore(netns, "nft", CHANGES["flush"])
        wait_for(lambda: bool(node.api.events), "the report's Event")
        assert node.api.events[0]["action"] == "Reporting"
        assert "missing_rule" in node.api.events[0]["note"]
        time.sleep(1.0)
        assert nat(netns) != upstream  # left alone
        assert running.keeper.metrics.repaired == 0
        assert running.keeper.metrics.refused["mode_report"] >= 1
    finally:
        running.stop()


class Parent:
    """The agent's parent as the keeper's channel sees it (agent/keeper_process.py rule 5):
    a cache filled with the stand-in's objects, answering "Q" with `CacheFeed.answer`, on a
    thread; every message counts as the cache process's beat."""

    def __init__(self, kubeconfig: Path) -> None:
        from multicall.effects.kube.stream import ClientOptions, load_config

        self.feed_r, self.feed_w = os.pipe()
        self.feed = CacheFeed(self.feed_r)
        config = load_config(ClientOptions(kubeconfig=str(kubeconfig)), {})
        self.cluster = ClusterOf(lambda: (config, 0))()
        self.mine, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.asked: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def fill(self, pods: list[dict[str, Any]], namespaces: list[str]) -> None:
        now = time.monotonic()
        self.put({"k": "cluster", "id": self.cluster}, now)
        for watch, docs in (("pods", pods), ("namespaces", [
            {"kind": "Namespace", "metadata": {"name": n}} for n in namespaces
        ])):  # fmt: skip
            self.put({"k": "init", "w": watch}, now)
            for doc in docs:
                self.put({"k": "put", "w": watch, "o": doc}, now)
            self.put({"k": "done", "w": watch}, now)

    def put(self, message: dict[str, Any], now: float | None = None) -> None:
        self.feed.cache.feed(message, time.monotonic() if now is None else now)

    def serve(self) -> None:
        while msg := self.theirs.recv(1 << 17):
            self.put({"k": "beat"})
            self.asked.append(json.loads(msg[1:]))
            self.theirs.send(self.feed.answer(msg[1:], time.monotonic()))

    def ask(self) -> Ask:
        numbers = iter(range(1, 1 << 30))
        return lambda question: ask_parent(self.mine, question, next(numbers))

    def close(self) -> None:
        self.mine.close()
        self.thread.join(5)
        self.theirs.close()
        os.close(self.feed_r)
        os.close(self.feed_w)


def test_the_keeper_reads_the_pod_cache_for_discovery_and_repairs(
    node: Node,  # noqa: F811
) -> None:
    """N unrecorded sandboxes (meshed, and not: linkerd-cni missing from the chain when they
    started), their pods and namespace in the cache: discovery programs the meshed ones and
    passes over the others with 0 GETs; a drift repair (the pod asked for first) makes 0
    GETs; a pod the cache does not hold is read from the API (its GET, the namespace still
    from the cache); a terminating pod in the cache is refused as the API's object is."""
    upstream = fixture_text("default-nft")
    meshed = [node.sandbox(f"web-{i}", with_linkerd=False) for i in range(3)]
    plain = [sandbox_of(node, f"plain-{i}", meshed=False) for i in range(2)]
    missed = node.sandbox("web-missed", with_linkerd=False)
    net_dir = node.fix_chain_on_disk()
    parent = Parent(node.kubeconfig)
    parent.fill([pod for pod, _ in meshed + plain], ["app"])
    before = len(node.api.object_gets())
    running = start_keeper(node, net_dir, ask=parent.ask())
    try:
        wait_for(partial(repaired, running.keeper, 4), "the 4 meshed sandboxes programmed")
        assert all(nat(netns) == upstream for _, netns in [*meshed, missed])
        assert all("PROXY_INIT" not in nat(netns) for _, netns in plain)
        assert node.api.object_gets()[before:] == ["/api/v1/namespaces/app/pods/web-missed"]
        asked = [(q["what"], q["name"]) for q in parent.asked]
        assert sorted(set(asked)) == sorted(
            {("pod", f"web-{i}") for i in range(3)} | {("pod", "web-missed")}
            | {("pod", f"plain-{i}") for i in range(2)} | {("namespace", "app")}
        )  # fmt: skip
        # drift: the pod asked for, then the ADD in place, all from the cache
        before = len(node.api.object_gets())
        restore(meshed[0][1], "nft", CHANGES["flush"])
        wait_for(partial(repaired, running.keeper, 5), "the drift repaired")
        assert nat(meshed[0][1]) == upstream
        assert node.api.object_gets()[before:] == []
        # terminating: refused from the cache's record, as from the API's object
        terminating = {**meshed[1][0], "metadata": {
            **meshed[1][0]["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}  # fmt: skip
        parent.put({"k": "put", "w": "pods", "o": terminating})
        restore(meshed[1][1], "nft", CHANGES["flush"])
        wait_for(lambda: running.keeper.metrics.refused["pod_terminating"] == 1, "the refusal")
        assert node.api.object_gets()[before:] == []
        assert nat(meshed[1][1]) != upstream
    finally:
        running.stop()
        parent.close()


def sandbox_of(
    node: Node,  # noqa: F811
    name: str,
    *,
    meshed: bool,
) -> tuple[dict[str, Any], Netns]:
    """`Node.sandbox` of a pod the proxy injector left alone (`meshed` False)."""
    doc = pod_doc(name, None, node=NODE)
    if not meshed:
        doc["spec"]["initContainers"] = []
        doc["spec"]["containers"] = [{"name": "app"}]
    stored = node.api.apply(doc)
    netns = node.rig.pod().netns
    proc = node.runtime.run(
        "add", node.chain(with_linkerd=False), netns.path,
        container_id=f"c{netns.name}", pod=("app", name), pod_uid=stored["metadata"]["uid"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return stored, netns
