"""`make bench`: pod-start cost of cnibox against upstream's approach, side by side.

Every case runs in throwaway network namespaces this script creates and removes (also on
Ctrl-C, SIGTERM or an exception); nothing touches the machine's own network namespace: the
test Kubernetes API (tests/support/kubeapi.py) listens on 127.0.0.1 of a bench "node" netns, the
plugin runs in that node netns (like a runtime on the host) and programs a fresh pod netns.
Speed is reported here, never asserted in tests.

Rows:
  upstream replay  the exact argv sequence upstream's Go plugin runs for a meshed pod with the
                   chart defaults (save, rule commands, save), each as
                   `nsenter --net=<netns> -- <argv>` with Debian's real binaries
  cnibox ADD       a full plugin invocation as the container runtime makes it (CNI_* env,
                   chained config with prevResult on stdin, API server on loopback TLS):
                   source mode (`python -m multicall linkerd-cni`), the built binary through a
                   `linkerd-cni` symlink warm, and its first start after install (empty
                   CNIBOX_CACHE each time); legacy and nft
  agent ADD        the same invocation through the built file's launcher with `cnibox agent`
                   answering (docs/agent.md): meshed (nft, legacy) and unmeshed; the agent
                   runs in the node netns, as a DaemonSet pod with hostNetwork would
  after install    the first ADD of a new version when the installer unpacked it first
                   (CNIBOX_UNPACK_ONLY=1, untimed), no agent
  one-shot binary  the warm binary ADD again, each right after one upstream replay (the
                   issue-11 ratio of the one-shot path, both sides under the same load)
  bare start       `cnibox --version`, `python -m multicall --version`, `python3 -c pass`
  concurrency      N ADDs launched at once against N fresh netns (also through the agent)
  CRI sandbox      RunPodSandbox through Debian's containerd (the node of tests/cri, binary
                   plugin): bridge only vs bridge + linkerd-cni chained as the chart does,
                   in alternating blocks of the same run; the call's wall time (containerd
                   makes the netns, starts the pause container, runs the chain)

Each ADD is checked outside the timed region: exit status 0, stdout is the prevResult, and
the pod's nat table (Debian's iptables-save) equals upstream's golden for the mode.
`--profile` instead runs one source-mode ADD under `-X importtime` and cProfile; `--only
agent|oneshot` runs one group of interleaved rows with their ratios (a quick measurement of
one path).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from multicall.core.installer.config import render_kubeconfig  # noqa: E402
from multicall.effects.ns import entered_netns  # noqa: E402
from tests.cri.cluster import CriCluster  # noqa: E402
from tests.cri.modes import DIRECT  # noqa: E402
from tests.cri.node import CriNode  # noqa: E402
from tests.support import FIXTURES  # noqa: E402
from tests.support.kubeapi import TOKEN, KubeApi, pods_from_golden  # noqa: E402
from tests.support.libcni import CHART_LINKERD  # noqa: E402
from tests.support.pki import make_pki  # noqa: E402
from tests.support.pods import MESHED  # noqa: E402
from tests.support.rig import Rig  # noqa: E402

SCENARIOS = FIXTURES / "derived" / "linkerd-iptables"
PREV_RESULT = (
    FIXTURES / "derived" / "reference-plugin-oracle" / "ptp-host-local-ADD-1.0.0.stdout.json"
)
GOLDEN = (
    FIXTURES
    / "upstream"
    / "linkerd2"
    / "inject-goldens"
    / ("inject_emojivoto_deployment_no_init_container.golden.yml")
)
UNMESHED_GOLDEN = GOLDEN.with_name("inject_emojivoto_deployment_overridden_noinject.golden.yml")
UNMESHED_NAME = "web-plain"  # the golden's pod renamed beside the meshed one
RESULTS = REPO / "bench" / "results"
NETNS_DIR = "/var/run/netns"
SAVE = {"nft": "iptables-nft-save", "legacy": "iptables-legacy-save"}
PREFIX = "cbxbench"


# ----------------------------------------------------------------------------- numbers


@dataclass
class Row:
    name: str
    samples_ms: list[float] = field(default_factory=list)
    failures: int = 0
    # /usr/bin/time's %M for one extra run (wait4 of a posix_spawn child would count the
    # bench's own memory: vfork's child carries the parent's high-water mark into exec)
    peak_rss_kb: int | None = None
    cpu_ms: list[float] = field(default_factory=list)  # user + system of the process tree
    wall_ms: float | None = None  # concurrency rows: first spawn to last reaping
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    @property
    def p90(self) -> float:
        return percentile(self.samples_ms, 0.90)

    @property
    def p99(self) -> float:
        return percentile(self.samples_ms, 0.99)

    def add(self, ms: float, ok: bool, cpu_ms: float) -> None:
        self.samples_ms.append(ms)
        self.failures += 0 if ok else 1
        self.cpu_ms.append(cpu_ms)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 30 samples is the largest)."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n*q)
    return ordered[int(rank) - 1]


# ----------------------------------------------------------------------------- processes


@dataclass
class Exit:
    ms: float
    status: int
    cpu_ms: float
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True)
class Reaped:
    pid: int
    end: float
    status: int
    cpu_ms: float


class Spawner:
    """posix_spawn + wait4: one child's wall time and peak RSS, stdio through files."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.live: set[int] = set()
        self._seq = 0

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], stdin: Path | None = None
    ) -> tuple[int, float, Path]:
        self._seq += 1
        out = self.workdir / f"out{self._seq}"
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, str(stdin or os.devnull), os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, f"{out}.1", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, f"{out}.2", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        ]
        start = time.perf_counter()
        # posix_spawnp would search the bench's own PATH (pyenv shims first), not the child's.
        path = shutil.which(argv[0], path=env.get("PATH")) if "/" not in argv[0] else argv[0]
        pid = os.posix_spawn(path or argv[0], list(argv), dict(env), file_actions=actions)
        self.live.add(pid)
        return pid, start, out

    def reap(self, pid: int) -> Reaped:
        """Wait for `pid` (-1: any child)."""
        got, status, usage = os.wait4(pid, 0)
        end = time.perf_counter()
        self.live.discard(got)
        cpu_ms = 1000 * (usage.ru_utime + usage.ru_stime)
        return Reaped(got, end, os.waitstatus_to_exitcode(status), cpu_ms)

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: Path | None = None) -> Exit:
        pid, start, out = self.start(argv, env, stdin)
        return self.collect(start, self.reap(pid), out)

    @staticmethod
    def collect(start: float, reaped: Reaped, out: Path) -> Exit:
        stdout, stderr = Path(f"{out}.1"), Path(f"{out}.2")
        result = Exit(
            (reaped.end - start) * 1000,
            reaped.status,
            reaped.cpu_ms,
            stdout.read_bytes(),
            stderr.read_bytes(),
        )
        stdout.unlink()
        stderr.unlink()
        return result

    def kill_all(self) -> None:
        for pid in list(self.live):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.live.discard(pid)


# ----------------------------------------------------------------------------- netns


class Namespaces:
    """Every netns the bench makes, removed by `remove_all` whatever happens."""

    def __init__(self) -> None:
        self.made: set[str] = set()
        self._seq = 0

    def make(self, count: int = 1) -> list[str]:
        names = []
        for _ in range(count):
            self._seq += 1
            names.append(f"{PREFIX}{os.getpid()}x{self._seq}")
        self.made.update(names)
        _ip_batch([f"netns add {name}" for name in names])
        return names

    def remove(self, names: Sequence[str]) -> None:
        _ip_batch([f"netns del {name}" for name in names], check=False)
        self.made.difference_update(names)

    def remove_all(self) -> None:
        if self.made:
            self.remove(sorted(self.made))

    @contextmanager
    def fresh(self) -> Iterator[str]:
        (name,) = self.make()
        try:
            yield f"{NETNS_DIR}/{name}"
        finally:
            self.remove([name])


def _ip_batch(commands: Sequence[str], *, check: bool = True) -> None:
    proc = subprocess.run(
        ["ip", "-force", "-batch", "-"],
        input="".join(f"{c}\n" for c in commands).encode(),
        capture_output=True,
        check=False,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip -batch failed: {proc.stderr.decode().strip()}")


def remove_stale() -> None:
    """Namespaces left by a bench run that was SIGKILLed (its pid is gone)."""
    stale = []
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []:
        pid = name.removeprefix(PREFIX).split("x")[0]
        if name.startswith(PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.append(name)
    if stale:
        _ip_batch([f"netns del {name}" for name in stale], check=False)


# ----------------------------------------------------------------------------- upstream rows


def load_argv(scenario: str) -> list[list[str]]:
    lines = (SCENARIOS / f"{scenario}.argv.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def upstream_commands(mode: str) -> list[list[str]]:
    save = [SAVE[mode], "-t", "nat"]
    return [save, *load_argv(f"default-{mode}"), save]


def nat_table(netns: str, mode: str) -> str:
    """The pod's nat table as Debian's save tool prints it, without its comment lines."""
    proc = subprocess.run(
        ["nsenter", f"--net={netns}", "--", SAVE[mode], "-t", "nat"],
        capture_output=True,
        text=True,
        check=False,
    )
    return comparable_save(proc.stdout)


def comparable_save(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if line and line[0] != "#")


def golden_table(mode: str) -> str:
    return comparable_save((SCENARIOS / f"default-{mode}.iptables-save.txt").read_text())


# ----------------------------------------------------------------------------- the plugin


@dataclass
class Plugin:
    """One way of running linkerd-cni (argv prefix), with its environment additions."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    fresh_cache: Path | None = None  # set: an empty CNIBOX_CACHE under it per invocation
    unpack_first: bool = False  # with fresh_cache: unpack it untimed first (as install-cni)


@dataclass
class Cluster:
    """The node netns with the API server, and how to make one ADD's inputs."""

    node: str  # netns path
    kubeconfig: Path
    pod: tuple[str, str]  # namespace, name
    workdir: Path
    prev: dict[str, Any]

    def prev_for(self, netns: str) -> dict[str, Any]:
        """The primary plugin's result for this pod (its eth0 in `netns`)."""
        ifaces = [{**i, "sandbox": netns} if "sandbox" in i else i for i in self.prev["interfaces"]]
        return {**self.prev, "interfaces": ifaces}

    def stdin(self, netns: str, mode: str) -> Path:
        prev = self.prev_for(netns)
        conf = {
            "cniVersion": "1.0.0",
            "name": "cbxnet",
            "type": "linkerd-cni",
            "log_level": "info",
            "kubernetes": {"kubeconfig": str(self.kubeconfig)},
            "linkerd": {**CHART_LINKERD, "iptables-mode": mode},
            "prevResult": prev,
        }
        path = self.workdir / f"stdin-{os.path.basename(netns)}"
        path.write_text(json.dumps(conf))
        return path

    def env(
        self, netns: str, plugin: Plugin, seq: int, pod: tuple[str, str] | None = None
    ) -> dict[str, str]:
        namespace, name = pod or self.pod
        env = {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": f"bench{seq:08d}",
            "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
            "CNI_ARGS": (
                f"IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};"
                f"K8S_POD_INFRA_CONTAINER_ID=bench{seq:08d}"
            ),
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            **plugin.env,
        }
        if plugin.fresh_cache is not None:
            env["CNIBOX_CACHE"] = tempfile.mkdtemp(dir=plugin.fresh_cache)
            if plugin.unpack_first:  # what install-cni does for a new version (untimed)
                subprocess.run([plugin.argv[-1]], env={**env, "CNIBOX_UNPACK_ONLY": "1"},
                               check=True, capture_output=True)  # fmt: skip
        return env


@contextmanager
def cluster(namespaces: Namespaces, workdir: Path) -> Iterator[Cluster]:
    (node_name,) = namespaces.make()
    node = f"{NETNS_DIR}/{node_name}"
    subprocess.run(["ip", "-n", node_name, "link", "set", "lo", "up"], check=True)
    api = KubeApi(make_pki(workdir / "pki"))
    pod = pods_from_golden(GOLDEN)[0]
    api.add_pod(pod)
    unmeshed = pods_from_golden(UNMESHED_GOLDEN)[0]
    unmeshed["metadata"] = {**unmeshed["metadata"], "name": UNMESHED_NAME}
    api.add_pod(unmeshed)
    api.start(node)
    # A real API server's backlog is somaxconn; the test server's 16 would drop the SYNs of a
    # 100-pod burst and add TCP's 1 s retransmit to the concurrency row.
    if api._server is not None:
        api._server.socket.listen(1024)
    # The file install-cni writes on a node (its own renderer), pointing at the test API.
    kubeconfig = workdir / "ZZZ-linkerd-cni-kubeconfig"
    kubeconfig.write_bytes(
        render_kubeconfig(TOKEN.encode(), api.pki.ca_cert.read_bytes(), "127.0.0.1", str(api.port))
    )
    try:
        yield Cluster(
            node,
            kubeconfig,
            (pod["metadata"]["namespace"], pod["metadata"]["name"]),
            workdir,
            json.loads(PREV_RESULT.read_text()),
        )
    finally:
        api.stop()


class Bench:
    def __init__(self, spawner: Spawner, namespaces: Namespaces, cl: Cluster) -> None:
        self.spawner = spawner
        self.namespaces = namespaces
        self.cluster = cl
        self.seq = 0
        self.problems: list[str] = []

    def add_once(
        self, plugin: Plugin, mode: str, netns: str, *, meshed: bool = True
    ) -> tuple[Exit, bool]:
        """One timed ADD, then (untimed) the proof that it programmed upstream's rules."""
        self.seq += 1
        stdin = self.cluster.stdin(netns, mode)
        pod = None if meshed else (self.cluster.pod[0], UNMESHED_NAME)
        env = self.cluster.env(netns, plugin, self.seq, pod)
        with entered_netns(self.cluster.node):
            done = self.spawner.run(plugin.argv, env, stdin)
        ok = self.verify(done, mode, netns, plugin.name, meshed=meshed)
        self.drop_cache(plugin, env)
        return done, ok

    def verify(self, done: Exit, mode: str, netns: str, who: str, *, meshed: bool = True) -> bool:
        problem = ""
        if done.status != 0:
            problem = f"exit {done.status}: {done.stdout[:300]!r} {done.stderr[-300:]!r}"
        elif not _passes_on(_parsed(done.stdout), self.cluster.prev_for(netns)):
            problem = f"stdout is not the prevResult: {done.stdout!r}"
        elif meshed and nat_table(netns, mode) != golden_table(mode):
            problem = f"nat table differs from default-{mode}: {done.stderr[-300:]!r}"
        elif not meshed and "PROXY_INIT" in nat_table(netns, mode):
            problem = "an unmeshed pod got rules"
        if problem and len(self.problems) < 20:
            self.problems.append(f"{who} {mode}: {problem}")
        return not problem

    @staticmethod
    def drop_cache(plugin: Plugin, env: Mapping[str, str]) -> None:
        """Remove a first-start run's private CNIBOX_CACHE (never the warm one)."""
        if plugin.fresh_cache is not None:
            shutil.rmtree(env["CNIBOX_CACHE"], ignore_errors=True)

    def add_row(
        self, name: str, plugin: Plugin, mode: str, iterations: int, *, meshed: bool = True
    ) -> Row:
        row = Row(name)
        with self.namespaces.fresh() as netns:  # warm-up, not counted: its peak RSS
            timed = Plugin(plugin.name, [*TIME_RSS, *plugin.argv], plugin.env, plugin.fresh_cache,
                           plugin.unpack_first)  # fmt: skip
            done, _ = self.add_once(timed, mode, netns, meshed=meshed)
            row.peak_rss_kb = parse_rss(done.stderr)
        for _ in range(iterations):
            with self.namespaces.fresh() as netns:
                done, ok = self.add_once(plugin, mode, netns, meshed=meshed)
            row.add(done.ms, ok, done.cpu_ms)
        return row

    def concurrency(self, name: str, plugin: Plugin, mode: str, count: int) -> Row:
        """`count` ADDs spawned back to back, each timed from its spawn to its reaping."""
        names = self.namespaces.make(count)
        row = Row(name)
        try:
            started: dict[int, Started] = {}
            inputs = []
            for netns in (f"{NETNS_DIR}/{n}" for n in names):
                self.seq += 1
                env = self.cluster.env(netns, plugin, self.seq)
                inputs.append((netns, self.cluster.stdin(netns, mode), env))
            with entered_netns(self.cluster.node):
                for netns, stdin, env in inputs:
                    pid, start, out = self.spawner.start(plugin.argv, env, stdin)
                    started[pid] = Started(start, out, netns, env)
            reaped: list[Reaped] = []
            while len(reaped) < len(started):
                child = self.spawner.reap(-1)
                if child.pid in started:
                    reaped.append(child)
            for child in reaped:
                run = started[child.pid]
                done = Spawner.collect(run.start, child, run.out)
                ok = self.verify(done, mode, run.netns, plugin.name)
                row.add(done.ms, ok, done.cpu_ms)
                self.drop_cache(plugin, run.env)
            first = min(run.start for run in started.values())
            row.wall_ms = 1000 * (max(child.end for child in reaped) - first)
            row.note = f"wall {row.wall_ms:.0f} ms for {count} ADDs"
        finally:
            self.namespaces.remove(names)
        return row


@dataclass(frozen=True)
class Started:
    start: float
    out: Path
    netns: str
    env: dict[str, str]


def _passes_on(result: object, prev: dict[str, Any]) -> bool:
    """A chained plugin's output carries the primary's interfaces and IPs unchanged."""
    if not isinstance(result, dict):
        return False
    keys = ("cniVersion", "interfaces", "ips")
    return all(result.get(k) == prev.get(k) for k in keys)


def _parsed(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return None


# ----------------------------------------------------------------------------- other rows

# GNU time's last stderr line: the child's peak resident set in KiB.
TIME_RSS = ["/usr/bin/time", "-f", "%M"]


def parse_rss(stderr: bytes) -> int | None:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return int(lines[-1]) if lines and lines[-1].isdigit() else None


def upstream_row(name: str, spawner: Spawner, namespaces: Namespaces, mode: str, n: int) -> Row:
    row = Row(name)
    for i in range(n + 1):
        # the uncounted first pass warms the page cache and modules, and measures memory
        total, cpu, ok, rss = replay_once(spawner, namespaces, mode, [] if i else TIME_RSS)
        if i:
            row.add(total, ok, cpu)
        else:
            row.peak_rss_kb = rss
    row.note = f"{len(upstream_commands(mode))} processes"
    return row


def replay_once(
    spawner: Spawner, namespaces: Namespaces, mode: str, wrap: list[str]
) -> tuple[float, float, bool, int]:
    """Upstream's command sequence once, on a fresh pod netns: (wall ms, CPU ms, table right,
    peak RSS KiB when `wrap` is TIME_RSS)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    total, cpu, ok, rss = 0.0, 0.0, True, 0
    with namespaces.fresh() as netns:
        for argv in upstream_commands(mode):
            done = spawner.run([*wrap, "nsenter", f"--net={netns}", "--", *argv], env)
            total += done.ms
            cpu += done.cpu_ms
            rss = max(rss, parse_rss(done.stderr) or 0) if wrap else 0
            ok = ok and done.status == 0
        ok = ok and nat_table(netns, mode) == golden_table(mode)
    return total, cpu, ok, rss


def command_row(
    name: str, spawner: Spawner, argv: list[str], n: int, env: Mapping[str, str]
) -> Row:
    row = Row(name)
    row.peak_rss_kb = parse_rss(spawner.run([*TIME_RSS, *argv], env).stderr)
    for _ in range(n):
        done = spawner.run(argv, env)
        row.add(done.ms, done.status == 0, done.cpu_ms)
    return row


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


# ----------------------------------------------------------------------------- report


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'case':<44}{'n':>4}{'median ms':>10}{'p99 ms':>9}{'cpu ms':>8}{'fail':>5}"
        f"{'RSS MiB':>8}  note"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        rss = r.peak_rss_kb / 1024 if r.peak_rss_kb else float("nan")
        cpu = statistics.median(r.cpu_ms) if r.cpu_ms else float("nan")
        lines.append(
            f"{r.name:<44}{len(r.samples_ms):>4}{r.median:>10.1f}{r.p99:>9.1f}{cpu:>8.1f}"
            f"{r.failures:>5}{rss:>8.1f}  {r.note}"
        )
    return "\n".join(lines)


def machine() -> dict[str, str]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_end": loadavg(),
    }


def loadavg() -> str:
    """1, 5 and 15 minute load averages: the machine may be shared, read numbers with it."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def ratio(rows: dict[str, Row], num: str, den: str, *, cpu: bool = False) -> float | None:
    """Median over median (wall time, or the children's CPU time)."""
    if num not in rows or den not in rows:
        return None
    top, bottom = rows[num], rows[den]
    if cpu:
        if not top.cpu_ms or not bottom.cpu_ms:
            return None
        return statistics.median(top.cpu_ms) / statistics.median(bottom.cpu_ms)
    return top.median / bottom.median if bottom.median > 0 else None


def ratios(rows: dict[str, Row], impl: str) -> dict[str, dict[str, Any]]:
    """The issue's three ratios, by wall time (the goal) and by CPU time (steadier when the
    machine is shared)."""
    out: dict[str, dict[str, Any]] = {}
    bare = (
        "bare start: python -m multicall --version"
        if impl == "source"
        else ("bare start: cnibox --version")
    )
    for mode in ("nft", "legacy"):
        add = f"cnibox ADD, {impl}, {mode}"
        for label, den, goal in (
            (f"cnibox {impl} ADD / upstream replay ({mode})", f"upstream replay, {mode}", 0.25),
            (f"cnibox {impl} ADD / bare start ({mode})", bare, 2.0),
        ):
            out[label] = {
                "value": ratio(rows, add, den),
                "cpu_value": ratio(rows, add, den, cpu=True),
                "goal": goal,
            }
    if impl == "binary":
        out.update(agent_ratios(rows))
    conc = rows.get(f"concurrency: {impl}, nft")
    if conc is not None and conc.samples_ms:
        out[f"concurrency p99 / p50 ({impl})"] = {
            "value": conc.p99 / conc.median,
            "cpu_value": None,
            "goal": 3.0,
        }
    return out


def agent_ratios(rows: dict[str, Row]) -> dict[str, dict[str, Any]]:
    """Issue 11's goals: the agent against upstream's replay, its burst against the one-shot
    burst, the first ADD after install against a warm one-shot ADD."""
    out: dict[str, dict[str, Any]] = {}
    pairs = (
        ("agent ADD / upstream replay (nft)", "cnibox ADD, agent, nft",
         "upstream replay, nft (interleaved with agent ADD)", 0.5),
        ("agent ADD / upstream replay (legacy)", "cnibox ADD, agent, legacy",
         "upstream replay, legacy (interleaved with agent ADD)", 0.5),
        ("agent unmeshed ADD / upstream replay (nft)", "cnibox ADD unmeshed, agent, nft",
         "upstream replay, nft (interleaved with agent ADD unmeshed)", 0.25),
        ("first ADD after install / warm one-shot (nft)", "cnibox ADD, binary after install, nft",
         "cnibox ADD, binary, nft", 1.5),
        ("one-shot binary ADD / upstream replay (nft)", "cnibox ADD, binary, nft",
         "upstream replay, nft", 1.5),
        ("one-shot binary ADD / replay, interleaved (nft)", f"cnibox ADD, {ONESHOT}, nft",
         f"upstream replay, nft (interleaved with {ONESHOT} ADD)", 1.5),
    )  # fmt: skip
    for label, num, den, goal in pairs:
        out[label] = {
            "value": ratio(rows, num, den),
            "cpu_value": ratio(rows, num, den, cpu=True),
            "goal": goal,
        }
    burst, alone = rows.get("concurrency: agent, nft"), rows.get("concurrency: binary, nft")
    if burst and alone and burst.wall_ms and alone.wall_ms:
        out["agent burst wall / one-shot burst wall (nft)"] = {
            "value": burst.wall_ms / alone.wall_ms,
            "cpu_value": None,
            "goal": 0.2,
        }
    return out


def format_ratios(values: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'ratio':<52}{'wall':>6}{'cpu':>7}  goal"]
    for name, r in values.items():
        v, c = r["value"], r["cpu_value"]
        verdict = "n/a" if v is None else ("ok" if v <= r["goal"] else "MISSED")
        shown = "     -" if v is None else f"{v:6.2f}"
        shown_cpu = "      -" if c is None else f"{c:7.2f}"
        lines.append(f"{name:<52}{shown}{shown_cpu}  <= {r['goal']}  {verdict}")
    return "\n".join(lines)


def save(rows: list[Row], ratio_values: dict[str, Any], extra: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "latest.json"
    data = {
        "machine": machine(),
        "rows": [asdict(r) | {"median": r.median, "p90": r.p90, "p99": r.p99} for r in rows],
        "ratios": ratio_values,
        **extra,
    }
    out.write_text(json.dumps(data, indent=2) + "\n")
    return out


# ----------------------------------------------------------------------------- main


def plugins(workdir: Path, binary: Path | None) -> dict[str, Plugin]:
    found = {"source": Plugin("source", [sys.executable, "-m", "multicall", "linkerd-cni"])}
    if binary is None:
        return found
    links = workdir / "bin"
    links.mkdir()
    (links / "linkerd-cni").symlink_to(binary)
    warm = workdir / "cache-warm"
    warm.mkdir(mode=0o700)
    first = workdir / "cache-first"
    first.mkdir(mode=0o700)
    argv = [str(links / "linkerd-cni")]
    off = {"CNIBOX_AGENT_SOCKET": ""}  # never an agent that happens to run on this machine
    found["binary"] = Plugin("binary", argv, {"CNIBOX_CACHE": str(warm), **off})
    found["binary first start"] = Plugin("binary first start", argv, off, fresh_cache=first)
    return found


def agent_plugin(workdir: Path, socket_path: Path) -> Plugin:
    """The launcher with an agent answering: CNIBOX_CACHE is empty and stays so."""
    cache = workdir / "cache-agent-caller"
    cache.mkdir(mode=0o700)
    argv = [str(workdir / "bin" / "linkerd-cni")]
    env = {"CNIBOX_CACHE": str(cache), "CNIBOX_AGENT_SOCKET": str(socket_path)}
    return Plugin("agent", argv, env)


@contextmanager
def agent_running(
    binary: Path, cl: Cluster, workdir: Path
) -> Iterator[tuple[Path, Path, subprocess.Popen[bytes]]]:
    """`cnibox agent` in the node netns (a DaemonSet pod with hostNetwork); (socket, log,
    process)."""
    sock = workdir / "agent" / "agent.sock"
    log = workdir / "agent.log"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNIBOX_CACHE": str(workdir / "cache-warm")}
    argv = [str(binary), "agent", "--socket", str(sock), "--admin-addr", "127.0.0.1:0",
            *os.environ.get("BENCH_AGENT_ARGS", "").split()]  # fmt: skip
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


def run_bench(args: argparse.Namespace, spawner: Spawner, namespaces: Namespaces) -> int:
    n = args.iterations
    # resolved: the plugin is a symlink to it, and a relative target would dangle
    binary = Path(args.binary).resolve() if args.binary and Path(args.binary).exists() else None
    workdir = spawner.workdir
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    rows: list[Row] = []
    extra: dict[str, Any] = {
        "iterations": n,
        "concurrency": args.concurrency,
        "loadavg_at_start": loadavg(),
    }

    def add(row: Row) -> None:
        rows.append(row)
        print(format_table([row]).splitlines()[-1], flush=True)

    print(format_table([]).splitlines()[0], flush=True)
    for mode in ("nft", "legacy"):
        add(upstream_row(f"upstream replay, {mode}", spawner, namespaces, mode, n))
    add(command_row("bare start: python3 -c pass", spawner, ["python3", "-c", "pass"], n, env))
    add(command_row("bare start: venv python -c pass", spawner,
                    [sys.executable, "-c", "pass"], n, env))  # fmt: skip
    add(
        command_row(
            "bare start: python -m multicall --version",
            spawner,
            [sys.executable, "-m", "multicall", "--version"],
            n,
            env,
        )
    )
    impls = plugins(workdir, binary)
    if binary is not None:
        cache = {"CNIBOX_CACHE": impls["binary"].env["CNIBOX_CACHE"], **env}
        add(
            command_row(
                "bare start: cnibox --version", spawner, [str(binary), "--version"], n, cache
            )
        )
        extra["binary"] = {"path": str(binary), "size_bytes": binary.stat().st_size}
    with cluster(namespaces, workdir) as cl:
        bench = Bench(spawner, namespaces, cl)
        for impl, plugin in impls.items():
            for mode in ("nft", "legacy"):
                add(bench.add_row(f"cnibox ADD, {impl}, {mode}", plugin, mode, n))
        for impl in ("source", "binary"):
            if impl in impls and args.concurrency:
                add(
                    bench.concurrency(
                        f"concurrency: {impl}, nft", impls[impl], "nft", args.concurrency
                    )
                )
        if binary is not None:
            extra["agent"] = agent_rows(bench, binary, impls, workdir, n, args.concurrency, add)
        extra["problems"] = bench.problems
    extra["problems"] += add_cri_rows(args.cri, binary, workdir, n, add)
    if binary is not None:
        extra["binary"]["extracted_bytes"] = _tree_size(Path(impls["binary"].env["CNIBOX_CACHE"]))
    by_name = {r.name: r for r in rows}
    ratio_values = {}
    for impl in ("binary", "source"):
        if impl in impls:
            ratio_values.update(ratios(by_name, impl))
    print()
    print(format_table(rows))
    print()
    print(format_ratios(ratio_values))
    report_cri(by_name, extra)
    if "binary" in extra:
        b = extra["binary"]
        print(
            f"\nbinary: {b['size_bytes'] / 2**20:.1f} MiB file, "
            f"{b['extracted_bytes'] / 2**20:.1f} MiB unpacked in CNIBOX_CACHE"
        )
    for problem in extra["problems"]:
        print(f"problem: {problem}")
    print(f"load average: {extra['loadavg_at_start']} at start, {loadavg()} at the end")
    print(f"results: {save(rows, ratio_values, extra)}")
    failures = sum(r.failures for r in rows)
    return 1 if failures else 0


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


def interleaved(
    bench: Bench, plugin: Plugin, mode: str, n: int, *, meshed: bool, pair: list[Row]
) -> Row:
    """n ADDs through `plugin` (the agent, or the one-shot binary), each right after one
    upstream replay; returns the plugin's row and puts the replay's (same samples' time
    slots) in `pair`."""
    kind = "ADD" if meshed else "ADD unmeshed"
    replay = Row(f"upstream replay, {mode} (interleaved with {plugin.name} {kind})")
    agent = Row(f"cnibox {kind}, {plugin.name}, {mode}")
    for i in range(n + 1):
        total, cpu, ok, _ = replay_once(bench.spawner, bench.namespaces, mode, [])
        with bench.namespaces.fresh() as netns:
            done, served_ok = bench.add_once(plugin, mode, netns, meshed=meshed)
        if i:  # the first pair warms both up
            replay.add(total, ok, cpu)
            agent.add(done.ms, served_ok, done.cpu_ms)
    replay.note = "11 processes"
    pair.append(replay)
    return agent


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


ONLY = ("agent", "oneshot")


def run_only(args: argparse.Namespace, spawner: Spawner, namespaces: Namespaces) -> int:
    """`--only agent|oneshot`: one group of interleaved rows and their ratios, for measuring a
    change to one path quickly (the full run is `make bench`)."""
    binary = Path(args.binary).resolve() if Path(args.binary).exists() else None
    if binary is None:
        print("bench: --only needs the built binary (make build)", file=sys.stderr)
        return 2
    rows: list[Row] = []
    extra: dict[str, Any] = {"iterations": args.iterations, "loadavg_at_start": loadavg()}

    def add(row: Row) -> None:
        rows.append(row)
        print(format_table([row]).splitlines()[-1], flush=True)

    print(format_table([]).splitlines()[0], flush=True)
    impls = plugins(spawner.workdir, binary)
    with cluster(namespaces, spawner.workdir) as cl:
        bench = Bench(spawner, namespaces, cl)
        if args.only == "oneshot":
            oneshot_rows(bench, impls, args.iterations, add)
        else:
            extra["agent"] = agent_rows(bench, binary, impls, spawner.workdir, args.iterations,
                                        args.concurrency, add, oneshot=False)  # fmt: skip
        extra["problems"] = bench.problems
    ratio_values = agent_ratios({r.name: r for r in rows})
    print()
    print(format_table(rows))
    print()
    print(format_ratios({k: v for k, v in ratio_values.items() if v["value"] is not None}))
    for problem in extra["problems"]:
        print(f"problem: {problem}")
    print(f"load average: {extra['loadavg_at_start']} at start, {loadavg()} at the end")
    print(f"results: {save(rows, ratio_values, extra)}")
    return 1 if any(r.failures for r in rows) else 0


def oneshot_rows(bench: Bench, impls: dict[str, Plugin], n: int, add: Any) -> None:
    """The warm one-shot binary ADD, each right after one upstream replay (same load)."""
    plugin = Plugin(ONESHOT, impls["binary"].argv, impls["binary"].env)
    pair: list[Row] = []
    add(interleaved(bench, plugin, "nft", n, meshed=True, pair=pair))
    add(pair[0])


ONESHOT = "one-shot binary"


def run_cri_only(args: argparse.Namespace, workdir: Path) -> int:
    """`--cri-only`: the two RunPodSandbox rows and their summary, nothing else."""
    rows: list[Row] = []
    extra: dict[str, Any] = {"iterations": args.iterations, "loadavg_at_start": loadavg()}
    binary = Path(args.binary).resolve() if Path(args.binary).exists() else None
    extra["problems"] = add_cri_rows(True, binary, workdir, args.iterations, rows.append)
    print(format_table(rows))
    report_cri({r.name: r for r in rows}, extra)
    for problem in extra["problems"]:
        print(f"problem: {problem}")
    print(f"load average: {extra['loadavg_at_start']} at start, {loadavg()} at the end")
    print(f"results: {save(rows, {}, extra)}")
    return 1 if not rows or any(r.failures for r in rows) else 0


def _tree_size(root: Path) -> int:
    return sum(p.lstat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def run_profile(
    spawner: Spawner, namespaces: Namespaces, mode: str, binary: Path | None, iterations: int
) -> int:
    """One source-mode ADD under `-X importtime`, cProfile and a dataclass counter, then the
    phases of an ADD (source and binary) timed without instrumentation."""
    import pstats

    impl = Plugin("source", [sys.executable, "-m", "multicall", "linkerd-cni"])
    prof = spawner.workdir / "add.prof"
    with cluster(namespaces, spawner.workdir) as cl:
        bench = Bench(spawner, namespaces, cl)
        with namespaces.fresh() as netns:
            bench.add_once(impl, mode, netns)
        runs = {
            "importtime": [sys.executable, "-X", "importtime", "-m", "multicall", "linkerd-cni"],
            "cprofile": [
                sys.executable,
                str(REPO / "bench" / "dcprof.py"),
                "--cprofile",
                str(prof),
                "linkerd-cni",
            ],
        }
        runs["dataclasses"] = [sys.executable, str(REPO / "bench" / "dcprof.py"), "linkerd-cni"]
        for what, argv in runs.items():
            with namespaces.fresh() as netns:
                done, ok = bench.add_once(Plugin(what, argv), mode, netns)
            print(f"== {what}: {done.ms:.1f} ms, verified: {ok}")
            if what == "importtime":
                print_importtime(done.stderr.decode())
            if what == "dataclasses":
                text = done.stderr.decode()
                print(text[text.find("dataclasses:") :])
        stats = pstats.Stats(str(prof))
        stats.sort_stats("cumulative").print_stats(25)
        stats.sort_stats("tottime").print_stats(15)
        rows = []
        for plugin in plugins(spawner.workdir, binary).values():
            rows += phases(bench, plugin, mode, iterations)
        print(format_table(rows))
        for problem in bench.problems:
            print(f"problem: {problem}")
    return 0


def phases(bench: Bench, plugin: Plugin, mode: str, n: int) -> list[Row]:
    """Where one ADD's time goes, without a profiler: the same invocation stopped earlier.

    VERSION: start-up, the dispatcher and the plugin module. ADD without pod args: plus config
    and prevResult handling (no API, no rules). ADD: plus the API GET and the rules.
    """
    cases = {
        "VERSION": {"CNI_COMMAND": "VERSION"},
        "ADD, no K8S_POD_* args": {"CNI_ARGS": "IgnoreUnknown=1"},
        "ADD": {},
    }
    rows = []
    for case, extra in cases.items():
        row = Row(f"{plugin.name}: {case}")
        variant = Plugin(plugin.name, plugin.argv, {**plugin.env, **extra}, plugin.fresh_cache)
        for _ in range(n + 1):
            with bench.namespaces.fresh() as netns:
                bench.seq += 1
                env = bench.cluster.env(netns, variant, bench.seq)
                stdin = bench.cluster.stdin(netns, mode)
                with entered_netns(bench.cluster.node):
                    done = bench.spawner.run(variant.argv, env, stdin)
                bench.drop_cache(variant, env)
            row.add(done.ms, done.status == 0, done.cpu_ms)
        row.samples_ms.pop(0)  # the first run warms caches
        row.cpu_ms.pop(0)
        rows.append(row)
    return rows


def print_importtime(stderr: str, top: int = 25) -> None:
    """`-X importtime` lines ("import time: self | cumulative | name"), largest first."""
    rows: list[tuple[int, int, str]] = []
    for line in stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            fields = line.removeprefix("import time:").split("|")
            rows.append((int(fields[1]), int(fields[0]), fields[2].rstrip()))
    total = sum(row[1] for row in rows)
    print(f"imports: {total / 1000:.1f} ms in total; largest cumulative (self):")
    for cum_us, self_us, module in sorted(rows, reverse=True)[:top]:
        print(f"  {cum_us / 1000:7.1f} ms ({self_us / 1000:5.1f})  {module}")


def executable_file(text: str) -> str:
    """--binary: made absolute, since the bench links plugin names to it from elsewhere (a
    relative target would dangle), and checked, so a typo is not a run without its rows."""
    path = Path(text).resolve()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise argparse.ArgumentTypeError(
            f"{text}: not an executable file (`make build` builds dist/cnibox)"
        )
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", "--iterations", type=int, default=30)
    parser.add_argument("-c", "--concurrency", type=int, default=100)
    parser.add_argument(
        "--binary",
        type=executable_file,
        help="the built single file (default: dist/cnibox, its rows skipped if not built)",
    )
    parser.add_argument("--profile", choices=("nft", "legacy"), help="profile one source ADD")
    parser.add_argument(
        "--no-cri", dest="cri", action="store_false", help="skip the containerd RunPodSandbox rows"
    )
    parser.add_argument("--cri-only", action="store_true", help="only the RunPodSandbox rows")
    parser.add_argument(
        "--only",
        choices=ONLY,
        help="only one issue-11 group of interleaved rows (with their replay): the meshed "
        "and unmeshed ADDs through the agent, or the one-shot binary ADD (no burst unless -c)",
    )
    args = parser.parse_args()
    args.binary = args.binary or str(REPO / "dist" / "cnibox")
    if os.geteuid() != 0:
        print("bench: needs root (network namespaces)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    # Even when started with SIGINT ignored (a background job): Ctrl-C must clean up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    remove_stale()
    namespaces = Namespaces()
    with tempfile.TemporaryDirectory(prefix="cnibox-bench-") as tmp:
        spawner = Spawner(Path(tmp))
        try:
            if args.profile:
                binary = Path(args.binary) if Path(args.binary).exists() else None
                return run_profile(spawner, namespaces, args.profile, binary, args.iterations)
            if args.cri_only:
                return run_cri_only(args, spawner.workdir)
            if args.only:
                return run_only(args, spawner, namespaces)
            return run_bench(args, spawner, namespaces)
        finally:
            spawner.kill_all()
            namespaces.remove_all()


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("bench: interrupted; every netns it made is removed", file=sys.stderr)
        sys.exit(130)
