"""RunPodSandbox through Debian's containerd: bridge only against bridge + linkerd-cni, the
plugin one-shot and through the node agent, in alternating blocks of one run on one node.

The node's containerd is told the agent's socket (CNIBOX_AGENT_SOCKET, as the chart's default
path is to a runtime that sets nothing). The agent, started from the same file where
containerd runs (tests/cri/modes.py: as the chart's hostNetwork DaemonSet sees the node),
runs during the agent blocks and is stopped (SIGTERM: it removes its socket) before each
one-shot block, so those ADDs find no socket and run one-shot at once, as on a node without
an agent or during an upgrade's gap. Each agent block starts a fresh agent and sends it one
untimed pod first (a long-running agent has its workers forked and its API connection warm);
its /metrics must then count every pod of the block as served, else the block's pods count
as failures.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.measure import Row
from bench.upstream import golden_table
from tests.cri.cluster import CriCluster
from tests.cri.modes import AGENT_ADMIN_PORT, AGENT_SOCKET, AGENT_START, PluginMode
from tests.cri.node import CriNode
from tests.support import agent as agent_metrics
from tests.support.kubeapi import KubeApi
from tests.support.pki import make_pki
from tests.support.pods import MESHED
from tests.support.rig import Rig

# ----------------------------------------------------------------------------- CRI


CRI_BRIDGE = "CRI RunPodSandbox: bridge only"
CRI_CHAINED = "CRI RunPodSandbox: bridge + linkerd-cni"
CRI_AGENT = "CRI RunPodSandbox: bridge + linkerd-cni/agent"
CRI_BLOCK = 5  # pods per block; blocks alternate so drift hits every row alike


class NodeAgent:
    """`cnibox agent` on the CRI node, started and stopped between blocks."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def setup(self, node: CriNode) -> Mapping[str, str]:
        """The node's setup (before containerd starts): containerd's plugins look for the
        agent at AGENT_SOCKET; the agent itself starts with the first agent block."""
        return {"CNIBOX_AGENT_SOCKET": AGENT_SOCKET}

    def start(self, node: CriNode) -> None:
        argv = [node.plugin, "agent", "--socket", AGENT_SOCKET,
                "--admin-addr", f"127.0.0.1:{AGENT_ADMIN_PORT}"]  # fmt: skip
        self.proc = node.spawn(argv)  # nsenter and sh exec it: proc is the agent itself
        deadline = time.monotonic() + AGENT_START
        while not node.inside(AGENT_SOCKET).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the node agent did not start:\n{node.log_text()[-2000:]}")
            time.sleep(0.02)

    def stop(self, node: CriNode) -> None:
        """SIGTERM: the agent removes its socket first, then drains (nothing in flight here)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.proc = None
        if node.inside(AGENT_SOCKET).exists():
            raise RuntimeError("the stopped agent left its socket: one-shot rows would hang")

    def served(self, node: CriNode) -> tuple[int, int]:
        """(ADDs served ok, requests handed back) so far, from the agent's /metrics."""
        metrics = agent_metrics.scrape(AGENT_ADMIN_PORT, node.netns.path)
        return agent_metrics.served(metrics), agent_metrics.fallbacks(metrics)


def cri_rows(binary: Path, workdir: Path, n: int) -> tuple[list[Row], list[str]]:
    """n RunPodSandbox calls per row on one containerd node (tests/cri/node.py), in
    alternating blocks (module docstring); each pod is checked and ended (Stop, Remove)
    outside the timed call."""
    note = "the CRI call's wall time"
    names = (CRI_BRIDGE, CRI_CHAINED, CRI_AGENT)
    rows = {name: Row(name, note=note) for name in names}
    problems: list[str] = []
    rig = Rig()
    api = KubeApi(make_pki(workdir / "cri-pki"))
    api.add_pod(MESHED)
    agent = NodeAgent()
    try:
        mode = PluginMode("bench", agent.setup)  # its blocks check the agent themselves
        with CriNode(rig, str(binary), setup=mode.setup) as node:
            api.start(node.netns.path)
            cl = CriCluster(node, api, mode)
            cl.write_kubeconfig()
            confs = {CRI_BRIDGE: cl.bridge_only(), CRI_CHAINED: cl.chained(),
                     CRI_AGENT: cl.chained()}  # fmt: skip
            for name in (CRI_BRIDGE, CRI_CHAINED):  # warm-up, not counted: the binary unpacks
                cl.use(confs[name])
                _cri_sample(cl, name, Row(name), problems)
            while any(len(r.samples_ms) < n for r in rows.values()):
                for name, row in rows.items():
                    count = min(CRI_BLOCK, n - len(row.samples_ms))
                    cl.use(confs[name])
                    if name == CRI_AGENT:
                        _agent_block(cl, agent, row, count, problems)
                    else:
                        for _ in range(count):
                            _cri_sample(cl, name, row, problems)
    finally:
        api.stop()
        rig.cleanup()
    return list(rows.values()), problems[:20]


def _agent_block(
    cl: CriCluster, agent: NodeAgent, row: Row, count: int, problems: list[str]
) -> None:
    """`count` timed pods through a freshly started agent after one untimed pod; the agent
    must have served each of them (its /metrics), and is stopped again afterwards."""
    if count <= 0:
        return
    agent.start(cl.node)
    try:
        _cri_sample(cl, row.name, Row(row.name), problems)  # warm: workers, API connection
        ok_before, back_before = agent.served(cl.node)
        first = len(row.samples_ms)
        failures = row.failures
        for _ in range(count):
            _cri_sample(cl, row.name, row, problems)
        ok, back = agent.served(cl.node)
        timed_ok = count - (row.failures - failures)
        if ok - ok_before != timed_ok or back != back_before:
            row.failures += len(row.samples_ms) - first
            problems.append(
                f"{row.name}: the agent served {ok - ok_before} of {timed_ok} good sandboxes "
                f"and handed {back - back_before} back"
            )
    finally:
        agent.stop(cl.node)


def _cri_sample(cl: CriCluster, name: str, row: Row, problems: list[str]) -> None:
    ref = cl.ref(MESHED)
    started = time.perf_counter()
    try:
        sandbox = cl.start(ref)
    except Exception as e:  # noqa: BLE001 - a failed call is a counted failure, not an abort
        row.samples_ms.append((time.perf_counter() - started) * 1000)
        row.failures += 1
        problems.append(f"{name}: {e}")
        return
    row.samples_ms.append((time.perf_counter() - started) * 1000)
    problem = ""
    if not sandbox.ready or not sandbox.ip:
        problem = f"sandbox not ready or without an address: {sandbox}"
    elif name != CRI_BRIDGE and cl.nat(sandbox, "iptables-nft-save") != golden_table("nft"):
        problem = "the pod's nat table differs from default-nft"
    elif name == CRI_BRIDGE and cl.proxy_init_lines(sandbox):
        problem = "bridge only, yet PROXY_INIT rules"
    if problem:
        row.failures += 1
        problems.append(f"{name}: {problem}")
    cl.end(sandbox.id)


def add_cri_rows(
    enabled: bool, binary: Path | None, workdir: Path, n: int, add: Callable[[Row], None]
) -> list[str]:
    if not enabled:
        return []
    if binary is None or shutil.which("containerd") is None:
        print("CRI rows skipped: they need the built binary and containerd (make deps)")
        return []
    found, problems = cri_rows(binary, workdir, n)
    for row in found:
        add(row)
    return problems


def cri_summary(rows: dict[str, Row]) -> dict[str, float] | None:
    """Added latency per pod (p50, p90 and p99 differences) and its share of bridge-only's,
    one-shot (`chained_`, `added_`) and through the agent (`agent_`, `agent_added_`)."""
    if CRI_BRIDGE not in rows or CRI_CHAINED not in rows:
        return None
    bridge, chained = rows[CRI_BRIDGE], rows[CRI_CHAINED]
    added = chained.median - bridge.median
    summary = {
        "bridge_median_ms": bridge.median,
        "bridge_p90_ms": bridge.p90,
        "bridge_p99_ms": bridge.p99,
        "chained_median_ms": chained.median,
        "chained_p90_ms": chained.p90,
        "chained_p99_ms": chained.p99,
        "added_median_ms": added,
        "added_p90_ms": chained.p90 - bridge.p90,
        "added_p99_ms": chained.p99 - bridge.p99,
        "added_over_bridge": added / bridge.median,
        "added_p99_over_bridge": (chained.p99 - bridge.p99) / bridge.p99,
    }
    if CRI_AGENT in rows:
        through = rows[CRI_AGENT]
        summary |= {
            "agent_median_ms": through.median,
            "agent_p90_ms": through.p90,
            "agent_p99_ms": through.p99,
            "agent_added_median_ms": through.median - bridge.median,
            "agent_added_p90_ms": through.p90 - bridge.p90,
            "agent_added_p99_ms": through.p99 - bridge.p99,
            "agent_added_over_bridge": (through.median - bridge.median) / bridge.median,
            "agent_added_p99_over_bridge": (through.p99 - bridge.p99) / bridge.p99,
        }
    return summary


def report_cri(rows: dict[str, Row], extra: dict[str, Any]) -> None:
    if (summary := cri_summary(rows)) is not None:
        extra["cri"] = summary
        print()
        print(format_cri(summary))


# Issue 24: through the agent, the added RunPodSandbox latency at most these shares of
# bridge-only's (p50, p99). Reported against, never asserted (speed lives here, not in tests).
AGENT_TARGET_P50 = 0.2
AGENT_TARGET_P99 = 0.3


def format_cri(summary: dict[str, float]) -> str:
    def line(label: str, prefix: str) -> str:
        return (
            f"{label:<44}{summary[prefix + 'median_ms']:>10.1f}"
            f"{summary[prefix + 'p90_ms']:>9.1f}{summary[prefix + 'p99_ms']:>9.1f}"
        )

    lines = [
        f"{'RunPodSandbox (containerd CRI)':<44}{'p50 ms':>10}{'p90 ms':>9}{'p99 ms':>9}",
        line("bridge only", "bridge_"),
        line("bridge + linkerd-cni, one-shot", "chained_"),
    ]
    if "agent_median_ms" in summary:
        lines.append(line("bridge + linkerd-cni, agent", "agent_"))
    lines.append(line("added per pod, one-shot", "added_"))
    if "agent_median_ms" in summary:
        lines.append(line("added per pod, agent", "agent_added_"))
    lines.append(
        f"added / bridge-only, one-shot: p50 {summary['added_over_bridge']:.2f}, "
        f"p99 {summary['added_p99_over_bridge']:.2f}"
    )
    if "agent_median_ms" in summary:
        p50, p99 = summary["agent_added_over_bridge"], summary["agent_added_p99_over_bridge"]
        verdict = "met" if p50 <= AGENT_TARGET_P50 and p99 <= AGENT_TARGET_P99 else "NOT met"
        lines.append(
            f"added / bridge-only, agent: p50 {p50:.2f}, p99 {p99:.2f} (issue 24 target "
            f"<= {AGENT_TARGET_P50} and <= {AGENT_TARGET_P99}: {verdict})"
        )
    return "\n".join(lines)
