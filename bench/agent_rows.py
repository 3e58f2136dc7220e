"""The rows through a node agent, its metrics and CPU."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench.interleaved import interleaved, oneshot_rows
from bench.measure import Row
from bench.plugin_runs import Bench, Cluster, Plugin
from multicall.effects.ns import entered_netns


def agent_plugin(workdir: Path, socket_path: Path) -> Plugin:
    """The launcher with an agent answering: CNIBOX_CACHE is empty and stays so."""
    cache = workdir / "cache-agent-caller"
    cache.mkdir(mode=0o700, exist_ok=True)
    argv = [str(workdir / "bin" / "linkerd-cni")]
    env = {"CNIBOX_CACHE": str(cache), "CNIBOX_AGENT_SOCKET": str(socket_path)}
    return Plugin("agent", argv, env)


@contextmanager
def agent_running(
    binary: Path, cl: Cluster, workdir: Path, extra: Sequence[str] = (), name: str = "agent"
) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes]]]:
    """`cnibox agent` in the node netns (a DaemonSet pod with hostNetwork); (socket, log,
    process). `extra`: more flags; `name`: its socket directory and log (one per agent).
    The socket directory, and with it the keeper's records beside the socket, is on a tmpfs,
    as the node's /var/run is: on the bench's own disk each meshed ADD's record write paid
    an fsync (3 ms nft, 6 ms legacy here) that no node pays."""
    run = _tmpfs_dir(workdir)
    sock = run / name / "agent.sock"
    log = workdir / f"{name}.log"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNIBOX_CACHE": str(workdir / "cache-warm")}
    argv = [str(binary), "agent", "--socket", str(sock), "--admin-addr", "127.0.0.1:0",
            *extra, *os.environ.get("BENCH_AGENT_ARGS", "").split()]  # fmt: skip
    with open(log, "wb") as out, entered_netns(cl.node):
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while b"agent ready" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not start: {log.read_text()[-500:]}")
            time.sleep(0.05)
        yield sock, log, proc
    finally:
        proc.terminate()
        proc.wait(30)
        if run != workdir:
            shutil.rmtree(run, ignore_errors=True)


def _tmpfs_dir(workdir: Path) -> Path:
    """A fresh directory on /dev/shm (a tmpfs, as the node's /run), else `workdir`."""
    with contextlib.suppress(OSError):
        if os.statvfs("/dev/shm") and _is_tmpfs("/dev/shm"):
            return Path(tempfile.mkdtemp(prefix="cnibox-bench-run-", dir="/dev/shm"))
    return workdir


def _is_tmpfs(path: str) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        return any(
            line.split(" - ", 1)[1].startswith("tmpfs ") and line.split()[4] == path
            for line in mounts
            if " - " in line
        )


def agent_rows(  # noqa: PLR0917 - the bench's state, passed down as run_bench has it
    bench: Bench,
    binary: Path,
    impls: dict[str, Plugin],
    workdir: Path,
    n: int,
    burst: int,
    add: Any,
    *,
    oneshot: bool = True,
) -> dict[str, Any]:
    """The node agent's rows (issue 11), and (`oneshot`) the one-shot rows they are compared
    with."""
    if oneshot:
        add(bench.add_row("cnibox ADD unmeshed, binary, nft", impls["binary"], "nft", n,
                          meshed=False))  # fmt: skip
        after = Plugin("binary after install", impls["binary first start"].argv,
                       impls["binary first start"].env, impls["binary first start"].fresh_cache,
                       unpack_first=True)  # fmt: skip
        add(bench.add_row("cnibox ADD, binary after install, nft", after, "nft", n))
        oneshot_rows(bench, impls, n, add)
    with agent_running(binary, bench.cluster, workdir) as (sock, log, proc):
        plugin = agent_plugin(workdir, sock)
        calls = 0

        def measured(row_of: Callable[[], Row], count: int) -> None:
            """A row whose CPU column adds the agent's (its workers are reaped by it, so
            their time is in its cutime/cstime) to each caller's, averaged over the row."""
            before = _agent_cpu_ms(proc.pid)
            row = row_of()
            _settle(proc.pid)
            per_add = (_agent_cpu_ms(proc.pid) - before) / count
            row.cpu_ms = [c + per_add for c in row.cpu_ms]
            row.note = f"{row.note}; agent CPU {per_add:.1f} ms/ADD".lstrip("; ")
            add(row)

        # Each agent ADD right after one upstream replay: on a shared machine both see the
        # same load, so their ratio holds even when the load moves during the run. The
        # unmeshed row follows the nft one, as on a node of an nft cluster: after legacy
        # ADDs the agent forks a worker per request for any pod (docs/agent.md, x_tables
        # preload), which `--only agent` after a legacy row would measure instead.
        for mode, meshed in (("nft", True), ("nft", False), ("legacy", True)):
            pair: list[Row] = []
            measured(partial(interleaved, bench, plugin, mode, n, meshed=meshed, pair=pair), n + 1)
            add(pair[0])
            calls += n + 1
        if burst:
            measured(
                lambda: bench.concurrency("concurrency: agent, nft", plugin, "nft", burst), burst
            )
            calls += burst
        metrics = agent_metrics(bench.cluster.node, log)
    served = int(sum(v for k, v in metrics.items() if k.startswith(SERVED_ADD)))
    handed = {k.split('"')[1]: int(v) for k, v in metrics.items() if k.startswith(FALLBACKS)}
    caller_cache = Path(plugin.env["CNIBOX_CACHE"])
    unpacked = any(caller_cache.iterdir())
    own = calls - served - sum(handed.values())
    forks = int(metrics.get("cnibox_agent_workers_started_total", 0))
    reuses = int(metrics.get("cnibox_agent_worker_reuses_total", 0))
    print(f"agent served {served} of {calls} ADDs; handed back {dict(handed)}; "
          f"callers that fell back on their own (no ACCEPT in time, connect failed): {own}; "
          f"caller cache unpacked: {unpacked}; "
          f"workers forked {forks}, reused {reuses}")  # fmt: skip
    if served != calls or unpacked:
        bench.problems.append(f"agent served {served} of {calls} ADDs (unpacked: {unpacked})")
    return {"served": served, "calls": calls, "handed_back": dict(handed), "own_fallbacks": own,
            "workers_forked": forks, "worker_reuses": reuses}  # fmt: skip


SERVED_ADD = 'cnibox_agent_requests_total{command="ADD",result="ok"'
FALLBACKS = "cnibox_agent_fallbacks_total{"


def agent_metrics(node: str, log: Path) -> dict[str, float]:
    """The agent's /metrics samples (its admin server is on 127.0.0.1 of the node netns)."""
    import re
    import urllib.request

    port = re.search(rb"admin endpoints on \S+ \(port (\d+)\)", log.read_bytes())
    if port is None:
        return {}
    with entered_netns(node):
        url = f"http://127.0.0.1:{int(port.group(1))}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def _agent_cpu_ms(pid: int) -> float:
    """The CPU the agent used so far, in ms: its own and its reaped children's (utime + stime
    + cutime + cstime, /proc/PID/stat) plus the same of its live children (workers serve
    several requests: most are alive when a row ends)."""
    ticks = _cpu_ticks(pid)
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            ticks += _cpu_ticks(int(child))
    return 1000 * ticks / os.sysconf("SC_CLK_TCK")


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15])


def _settle(pid: int) -> None:
    """Wait (briefly) until the agent has reaped the workers of the row's requests."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if len(children) <= 4 + 1:  # the idle pool (plus one being forked)
            return
        time.sleep(0.05)
