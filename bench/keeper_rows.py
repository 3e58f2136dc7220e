"""The keeper's rows (issue 26): what watching costs while nothing changes, and how long a
changed table stays wrong.

`cnibox agent` (its keeper in mode repair, the node's conflist in a directory of the bench's)
serves the ADDs of `pods` fresh sandboxes per mode, each holding the prevResult's address (a
repair checks it). Then:

  keeper idle      the keeper process's CPU (utime + stime of /proc/PID/stat) per 10 s window
                   while nothing changes any table, `windows` windows; its RSS in the peak
                   column. nft: the kernel notifies, nothing is dumped; legacy: a sweep every
                   10 s dumps and compares each table.
  drift to repair  from a change (one transaction by Debian's tool: the redirect chain
                   flushed) to the pod's nat table equal to upstream's again, as Debian's save
                   tool prints it (polled; each poll is one nsenter + save, ~5-10 ms, so that
                   is the resolution). A different pod each time: the back-off (docs/keeper.md)
                   delays a second repair of one sandbox. nft: notified; legacy: the next
                   sweep (10 s), so its numbers are mostly the sweep's phase.

The keeper is found as the agent's only grandchild (agent -> supervisor -> keeper; workers
have no children). Host tools are oracles here; the keeper uses none.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.agent_rows import agent_plugin, agent_running
from bench.measure import Row
from bench.paths import NETNS_DIR
from bench.plugin_runs import Bench
from bench.upstream import golden_table, nat_table
from tests.support.libcni import CHART_LINKERD

WINDOW = 10.0  # seconds per idle sample (the legacy sweep's period: one sweep per window)
CHANGE = {  # the redirect chain flushed, one transaction
    "nft": ["nft", "flush", "chain", "ip", "nat", "PROXY_INIT_REDIRECT"],
    "legacy": ["iptables-legacy", "-w", "-t", "nat", "-F", "PROXY_INIT_REDIRECT"],
}
REPAIR_TIMEOUT = 30.0


def keeper_rows(  # noqa: PLR0917 - the bench's state, passed down as run_only has it
    bench: Bench,
    binary: Path,
    workdir: Path,
    pods: int,
    repairs: int,
    windows: int,
    add: Callable[[Row], None],
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for mode in ("nft", "legacy"):
        net_dir = _net_dir(bench, workdir, mode)
        extra = ["--keeper", "repair", "--cni-net-dir", str(net_dir)]
        with agent_running(binary, bench.cluster, workdir, extra, f"keeper-{mode}") as (
            sock,
            log,
            proc,
        ):
            plugin = agent_plugin(workdir, sock)
            names = bench.namespaces.make(pods)
            try:
                netns = [f"{NETNS_DIR}/{name}" for name in names]
                address = bench.cluster.prev["ips"][0]["address"].split("/")[0]
                for name in names:
                    subprocess.run(["ip", "-n", name, "addr", "add", f"{address}/32", "dev",
                                    "lo"], check=True)  # fmt: skip
                for path in netns:
                    _done, ok = bench.add_once(plugin, mode, path)
                    if not ok:
                        raise RuntimeError(f"ADD through the agent failed: {bench.problems[-1:]}")
                _wait(sock.parent / "sandboxes", pods)
                keeper = _keeper_pid(proc.pid)
                time.sleep(2.0)  # inotify seen, every record watched (and compared once)
                idle = Row(f"keeper idle, {pods} pods, {mode}")
                for _ in range(windows):
                    before = _cpu_ms(keeper)
                    time.sleep(WINDOW)
                    idle.samples_ms.append(_cpu_ms(keeper) - before)
                idle.peak_rss_kb = _rss_kb(keeper)
                idle.note = f"CPU ms per {WINDOW:.0f} s window (not wall time)"
                add(idle)
                latency = _latency_row(mode, names, netns, repairs)
                add(latency)
                if latency.failures:  # what the keeper said about it
                    lines = log.read_text(errors="replace").splitlines()
                    said = [line for line in lines if "keeper" in line][-10:]
                    bench.problems.append(f"keeper {mode}: not repaired in time: {said}")
                summary[mode] = {"keeper_pid": keeper, "pods": pods}
            finally:
                bench.namespaces.remove(names)
    return summary


def _latency_row(mode: str, names: list[str], netns: list[str], repairs: int) -> Row:
    row = Row(f"keeper drift to repair, {mode}")
    golden = golden_table(mode)
    for i in range(repairs):
        name, path = names[i % len(names)], netns[i % len(netns)]
        subprocess.run(["ip", "netns", "exec", name, *CHANGE[mode]], check=True)
        changed = time.monotonic()
        while (table := nat_table(path, mode)) != golden:
            if time.monotonic() - changed > REPAIR_TIMEOUT:
                row.failures += 1
                break
            if mode == "legacy":
                time.sleep(0.02)  # seconds to the next sweep: no need to spawn save flat out
        row.samples_ms.append(1000 * (time.monotonic() - changed))
        if table == golden and mode == "legacy":
            time.sleep(0.1)  # out of the sweep that repaired it before the next change
    started = time.monotonic()
    nat_table(netns[0], mode)
    poll = 1000 * (time.monotonic() - started)
    row.note = f"change committed to upstream's table read back (polled; one read {poll:.0f} ms)"
    return row


def _net_dir(bench: Bench, workdir: Path, mode: str) -> Path:
    """The node's CNI config dir: a conflist whose linkerd-cni entry the repair runs (in
    `mode`: a repair programs what the node's entry says now, not what the record holds)."""
    net_dir = workdir / f"keeper-net.d-{mode}"
    net_dir.mkdir(exist_ok=True)
    entry = {"type": "linkerd-cni", "log_level": "info",
             "kubernetes": {"kubeconfig": str(bench.cluster.kubeconfig)},
             "linkerd": {**CHART_LINKERD, "iptables-mode": mode}}  # fmt: skip
    conflist = {"cniVersion": "1.0.0", "name": "cbxnet", "plugins": [entry]}
    (net_dir / "10-cbxnet.conflist").write_text(json.dumps(conflist))
    return net_dir


def _keeper_pid(agent: int) -> int:
    for child in _children(agent):
        grandchildren = _children(child)
        if grandchildren:
            return grandchildren[0]
    raise RuntimeError("no keeper process under the agent")


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return 1000 * (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _wait(records: Path, count: int, timeout: float = 30.0) -> None:
    """Until `records` holds `count` records (the workers write them after each ADD)."""
    deadline = time.monotonic() + timeout
    while len(list(records.iterdir())) != count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench: {records} does not hold {count} records")
        time.sleep(0.05)
