"""RunPodSandbox through Debian's containerd: bridge only against bridge + linkerd-cni."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.measure import Row
from bench.upstream import golden_table
from tests.cri.cluster import CriCluster
from tests.cri.modes import DIRECT
from tests.cri.node import CriNode
from tests.support.kubeapi import KubeApi
from tests.support.pki import make_pki
from tests.support.pods import MESHED
from tests.support.rig import Rig

# ----------------------------------------------------------------------------- CRI


CRI_BRIDGE = "CRI RunPodSandbox: bridge only"
CRI_CHAINED = "CRI RunPodSandbox: bridge + linkerd-cni"
CRI_BLOCK = 5  # pods per block; blocks alternate so drift hits both rows alike


def cri_rows(binary: Path, workdir: Path, n: int) -> tuple[list[Row], list[str]]:
    """n RunPodSandbox calls per conflist on one containerd node (tests/cri/node.py), in
    alternating blocks; each pod is checked and ended (Stop, Remove) outside the timed call."""
    note = "the CRI call's wall time"
    rows = {name: Row(name, note=note) for name in (CRI_BRIDGE, CRI_CHAINED)}
    problems: list[str] = []
    rig = Rig()
    api = KubeApi(make_pki(workdir / "cri-pki"))
    api.add_pod(MESHED)
    try:
        with CriNode(rig, str(binary), setup=DIRECT.setup) as node:
            api.start(node.netns.path)
            cl = CriCluster(node, api, DIRECT)
            cl.write_kubeconfig()
            confs = {CRI_BRIDGE: cl.bridge_only(), CRI_CHAINED: cl.chained()}
            for name, conf in confs.items():  # warm-up, not counted: the binary unpacks
                cl.use(conf)
                _cri_sample(cl, name, Row(name), problems)
            while any(len(r.samples_ms) < n for r in rows.values()):
                for name, row in rows.items():
                    cl.use(confs[name])
                    for _ in range(min(CRI_BLOCK, n - len(row.samples_ms))):
                        _cri_sample(cl, name, row, problems)
    finally:
        api.stop()
        rig.cleanup()
    return list(rows.values()), problems[:20]


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
    elif name == CRI_CHAINED and cl.nat(sandbox, "iptables-nft-save") != golden_table("nft"):
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
    """Added latency per pod (median and p90 differences) and its share of bridge-only."""
    if CRI_BRIDGE not in rows or CRI_CHAINED not in rows:
        return None
    bridge, chained = rows[CRI_BRIDGE], rows[CRI_CHAINED]
    added = chained.median - bridge.median
    return {
        "bridge_median_ms": bridge.median,
        "bridge_p90_ms": bridge.p90,
        "chained_median_ms": chained.median,
        "chained_p90_ms": chained.p90,
        "added_median_ms": added,
        "added_p90_ms": chained.p90 - bridge.p90,
        "added_over_bridge": added / bridge.median,
    }


def report_cri(rows: dict[str, Row], extra: dict[str, Any]) -> None:
    if (summary := cri_summary(rows)) is not None:
        extra["cri"] = summary
        print()
        print(format_cri(summary))


def format_cri(summary: dict[str, float]) -> str:
    return "\n".join(
        [
            f"{'RunPodSandbox (containerd CRI)':<44}{'median ms':>10}{'p90 ms':>9}",
            f"{'bridge only':<44}{summary['bridge_median_ms']:>10.1f}"
            f"{summary['bridge_p90_ms']:>9.1f}",
            f"{'bridge + linkerd-cni':<44}{summary['chained_median_ms']:>10.1f}"
            f"{summary['chained_p90_ms']:>9.1f}",
            f"{'added per pod':<44}{summary['added_median_ms']:>10.1f}"
            f"{summary['added_p90_ms']:>9.1f}",
            f"added latency / bridge-only sandbox time: {summary['added_over_bridge']:.2f}",
        ]
    )
