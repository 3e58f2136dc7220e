"""The pod cache's rows (issue 26, `--only cache`): API requests per ADD with the node's pod
cache on and off, and what the whole agent costs with 100 watched pods idle and under churn.

The API is tests/support/kubewatch.py's list/watch stand-in (it records every request) on
127.0.0.1 of a node netns of its own; the plugin's kubeconfig is the file install-cni writes
(its own renderer), the agent's `--kubeconfig` the stand-in's (another file with the same
server and CA: the cache answers only when the two name the same cluster, docs/pod-cache.md
rule 2). Pods are upstream's injected emojivoto golden, bound to NODE under distinct names
and UIDs; every ADD names its pod's UID (K8S_POD_UID, as containerd and CRI-O pass it), which
the cache needs (rule 1).

  cache ADD, pod cache on / off   two agents at once (keeper off), one with `--pod-cache
                  off`; each ADD of a pod the cache holds through one, then through the other,
                  alternating (both see the same load); wall time of the launcher, and the
                  GETs of one object the stand-in saw during that ADD (LIST and WATCH carry a
                  query), per ADD (goal 0 with the cache on; upstream's plugin makes 2)
  cache agent idle / churn        one agent with the keeper in mode repair and the cache on,
                  `pods` meshed sandboxes ADDed through it; CPU of its whole process tree
                  (parent, workers, the keeper and the pod cache process with their
                  supervisors; reaped workers through the parent's cutime) per 1 s, first
                  while nothing changes, then while pods are replaced at `rate` per second:
                  DEL through the agent, netns removed, the pod deleted from the API, a new
                  pod (new name and UID) applied, a new netns, its ADD through the agent (the
                  watch delivers both changes to the cache meanwhile). Memory: the tree's
                  proportional set size (PSS: forked workers share pages, which a sum of RSS
                  counts once per process), sampled each second, its peak.
  churn ADD       each replacement's ADD (wall time); failures: an ADD or DEL that failed,
                  and at the end every current pod's nat table not upstream's
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.agent_rows import agent_metrics, agent_plugin, agent_running
from bench.keeper_rows import _net_dir, _wait
from bench.measure import Row
from bench.paths import GOLDEN, NETNS_DIR, PREV_RESULT
from bench.plugin_runs import Bench, Cluster, Plugin
from bench.spawn import Exit
from bench.upstream import golden_table, nat_table
from multicall.core.installer.config import render_kubeconfig
from multicall.effects.ns import entered_netns
from tests.support.kubeapi import TOKEN, pods_from_golden
from tests.support.kubewatch import WatchApi
from tests.support.pki import make_pki

NODE = "node-a"
MODE = "nft"
NAMESPACE = "emojivoto"  # the golden's
SYNC_TIMEOUT = 60.0
CACHED = 'cnibox_agent_pod_cache_objects{resource="pods"}'


@dataclass
class CacheNode:
    """The stand-in, the node netns it listens in, and the pods it holds."""

    bench: Bench  # whose cluster is this node (the plugin's kubeconfig, the prevResult)
    api: WatchApi
    agent_kubeconfig: Path
    uids: dict[str, str] = field(default_factory=dict)  # pod name: its UID
    seq: int = 0

    def gets(self) -> int:
        """GETs of one object so far (the plugin's pod and namespace reads)."""
        return len(self.api.object_gets())

    def bind(self, name: str) -> None:
        pod = copy.deepcopy(pods_from_golden(GOLDEN)[0])
        pod["metadata"].update(name=name, uid=str(uuid.uuid4()))
        pod["spec"]["nodeName"] = NODE
        self.uids[name] = self.api.apply(pod)["metadata"]["uid"]

    def unbind(self, name: str) -> None:
        self.api.delete(NAMESPACE, name)
        self.uids.pop(name, None)

    def run(self, plugin: Plugin, command: str, netns: str, name: str, cid: str) -> Exit:
        """One invocation as the runtime makes it, with the pod's UID."""
        cl = self.bench.cluster
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": "/opt/cni/bin:/usr/lib/cni",
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={name};"
            f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={self.uids.get(name, '')}",
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            **plugin.env,
        }
        stdin = cl.stdin(netns, MODE)
        with entered_netns(cl.node):
            return self.bench.spawner.run(plugin.argv, env, stdin)

    def add(
        self, plugin: Plugin, netns: str, name: str, *, check: bool = True
    ) -> tuple[Exit, bool]:
        self.seq += 1
        done = self.run(plugin, "ADD", netns, name, f"cache{self.seq:08d}")
        if check:
            return done, self.bench.verify(done, MODE, netns, plugin.name)
        return done, done.status == 0


@contextlib.contextmanager
def cache_node(bench: Bench, workdir: Path) -> Any:
    """The stand-in in a node netns of its own, with the namespace of the golden's pod."""
    (node_name,) = bench.namespaces.make()
    node = f"{NETNS_DIR}/{node_name}"
    subprocess.run(["ip", "-n", node_name, "link", "set", "lo", "up"], check=True)
    api = WatchApi(make_pki(workdir / "pki-watch"))
    api.start(node)
    try:
        plugin_kc = workdir / "ZZZ-linkerd-cni-kubeconfig-watch"
        plugin_kc.write_bytes(render_kubeconfig(
            TOKEN.encode(), api.pki.ca_cert.read_bytes(), "127.0.0.1", str(api.port)))  # fmt: skip
        agent_kc = workdir / "agent-kubeconfig-watch"
        agent_kc.write_text(api.kubeconfig_text())
        api.apply({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": NAMESPACE}})
        cl = Cluster(node, plugin_kc, (NAMESPACE, "web-0"), workdir,
                     json.loads(PREV_RESULT.read_text()))  # fmt: skip
        yield CacheNode(Bench(bench.spawner, bench.namespaces, cl), api, agent_kc)
    finally:
        api.stop()
        bench.namespaces.remove([node_name])


def cache_rows(  # noqa: PLR0917 - the bench's state, passed down as run_only has it
    bench: Bench,
    binary: Path,
    workdir: Path,
    n: int,
    pods: int,
    idle_s: int,
    churn: tuple[float, int],
    add: Callable[[Row], None],
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    with cache_node(bench, workdir) as cn:
        summary["api"] = _api_rows(cn, binary, workdir, n, add)
        summary["churn"] = _churn_rows(cn, binary, workdir, pods, idle_s, churn, add)
        bench.problems += cn.bench.problems
    return summary


def _agent_flags(cn: CacheNode) -> list[str]:
    return ["--kubeconfig", str(cn.agent_kubeconfig), "--node-name", NODE]


def _synced(cn: CacheNode, log: Path, pods: int) -> dict[str, float]:
    """The agent's metrics once its cache listed and holds `pods` pods."""
    deadline = time.monotonic() + SYNC_TIMEOUT
    while True:
        metrics = agent_metrics(cn.bench.cluster.node, log)
        synced = all(metrics.get(f'cnibox_agent_pod_cache_synced{{resource="{r}"}}') == 1
                     for r in ("pods", "namespaces"))  # fmt: skip
        if synced and metrics.get(CACHED) == pods:
            return metrics
        if time.monotonic() > deadline:
            raise RuntimeError(f"pod cache not synced with {pods} pods: {log.read_text()[-800:]}")
        time.sleep(0.1)


def _served(metrics: dict[str, float]) -> dict[str, float]:
    """What the agent says of its ADDs: by source, misses by reason, its API requests."""
    keep = ("cnibox_agent_pod_cache_adds_total", "cnibox_agent_pod_cache_misses_total",
            "cnibox_agent_add_api_requests_total")  # fmt: skip
    return {k: v for k, v in metrics.items() if k.startswith(keep) and v}


def _api_rows(
    cn: CacheNode, binary: Path, workdir: Path, n: int, add: Callable[[Row], None]
) -> dict[str, Any]:
    names = [f"api-{i}" for i in range(n + 1)]
    for name in names:
        cn.bind(name)
    keeper_off = ["--keeper", "off", *_agent_flags(cn)]
    cl = cn.bench.cluster
    rows = {"on": Row(f"cache ADD, pod cache on, {MODE}"),
            "off": Row(f"cache ADD, pod cache off, {MODE}")}  # fmt: skip
    gets: dict[str, list[int]] = {"on": [], "off": []}
    out: dict[str, Any] = {}
    with (
        agent_running(binary, cl, workdir, keeper_off, "cache-on") as (s_on, l_on, p_on),
        agent_running(binary, cl, workdir, [*keeper_off, "--pod-cache", "off"],
                      "cache-off") as (s_off, l_off, p_off),
    ):  # fmt: skip
        _synced(cn, l_on, len(names))
        plugins = {"on": agent_plugin(workdir, s_on), "off": agent_plugin(workdir, s_off)}
        plugins["on"].name, plugins["off"].name = "agent, cache on", "agent, cache off"
        pids = {"on": p_on.pid, "off": p_off.pid}
        cpu = {which: tree(pid).total for which, pid in pids.items()}
        for i, name in enumerate(names):
            # the same pod through each, one right after the other, which first alternating
            for which in ("on", "off") if i % 2 else ("off", "on"):
                with cn.bench.namespaces.fresh() as netns:
                    before = cn.gets()
                    done, ok = cn.add(plugins[which], netns, name)
                    if i:  # the first pair warms both up
                        rows[which].add(done.ms, ok, done.cpu_ms)
                        gets[which].append(cn.gets() - before)
        for which, log in (("on", l_on), ("off", l_off)):
            per_add = sum(gets[which]) / max(1, len(gets[which]))
            # the whole agent's CPU over the row (its beats and watches included), per ADD
            agent_cpu = (tree(pids[which]).total - cpu[which]) / len(names)
            rows[which].note = (f"{per_add:.2f} API GETs per ADD (stand-in); "
                                f"agent tree CPU {agent_cpu:.1f} ms per ADD")  # fmt: skip
            out[which] = {"api_gets_per_add": per_add, "api_gets": sum(gets[which]),
                          "agent_tree_cpu_ms_per_add": agent_cpu,
                          "adds": len(gets[which]),
                          "agent": _served(agent_metrics(cn.bench.cluster.node, log))}  # fmt: skip
            add(rows[which])
    for name in names:
        cn.unbind(name)
    return out


# ----------------------------------------------------------------------------- the tree


def _stat(pid: int) -> tuple[list[str], int]:
    """/proc/PID/stat's fields after the command, and its start time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields, int(fields[19])


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _pss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    return 0


def _rss_kb(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


@dataclass
class Tree:
    """The agent's processes by part: CPU ms so far (user + system, live processes and the
    children each reaped), and memory now."""

    cpu_ms: dict[str, float]
    pss_kb: int
    rss_kb: int

    @property
    def total(self) -> float:
        return sum(self.cpu_ms.values())


PARTS = ("parent", "workers", "keeper", "pod cache")


def tree(agent: int) -> Tree:
    """The parent's children are its workers and two supervisors (the pod cache's forked
    first, then the keeper's: linkerd_cni_agent.main), each supervisor with one child. A
    worker has no children; what the parent reaped (workers that exited) is in its cutime."""
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    cpu = dict.fromkeys(PARTS, 0.0)
    pss = rss = 0
    fields, _ = _stat(agent)
    cpu["parent"] += tick * (int(fields[11]) + int(fields[12]))
    cpu["workers"] += tick * (int(fields[13]) + int(fields[14]))
    pss, rss = _pss_kb(agent), _rss_kb(agent)
    supervisors: list[tuple[int, list[int]]] = []
    for child in _children(agent):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields, start = _stat(child)
            own = tick * sum(int(x) for x in fields[11:15])
            below = _children(child)
            pss, rss = pss + _pss_kb(child), rss + _rss_kb(child)
            if not below:
                cpu["workers"] += own
                continue
            for pid in below:
                gfields, _ = _stat(pid)
                own += tick * sum(int(x) for x in gfields[11:15])
                pss, rss = pss + _pss_kb(pid), rss + _rss_kb(pid)
            supervisors.append((start, [child, *below]))
            cpu[f"sup{child}"] = own
    # by start: the pod cache's supervisor first, then the keeper's
    for part, (_, pids) in zip(("pod cache", "keeper"), sorted(supervisors), strict=False):
        cpu[part] += cpu.pop(f"sup{pids[0]}")
    for key in [k for k in cpu if k.startswith("sup")]:
        cpu["keeper"] += cpu.pop(key)  # never: two supervisors at most
    return Tree(cpu, pss, rss)


@dataclass
class Sampler:
    """Per-second CPU of the tree and its memory, sampled by `tick` between the bench's own
    steps (the churn loop calls it; so does the idle wait)."""

    agent: int
    per_s: list[float] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    peak_pss_kb: int = 0
    peak_rss_kb: int = 0
    _last: Tree | None = None
    _at: float = 0.0

    def start(self) -> None:
        self._last, self._at = tree(self.agent), time.monotonic()

    def tick(self, final: bool = False) -> None:
        now = time.monotonic()
        if self._last is None or (now - self._at < 1.0 and not final):
            return
        current = tree(self.agent)
        if now - self._at >= 0.5:  # a last remainder shorter than that is a tick or two
            self.per_s.append((current.total - self._last.total) / (now - self._at))
        for part in PARTS:
            self.parts[part] += current.cpu_ms[part] - self._last.cpu_ms[part]
        self.peak_pss_kb = max(self.peak_pss_kb, current.pss_kb)
        self.peak_rss_kb = max(self.peak_rss_kb, current.rss_kb)
        self._last, self._at = current, now

    def row(self, name: str, seconds: float) -> Row:
        row = Row(name, samples_ms=list(self.per_s))
        row.peak_rss_kb = self.peak_pss_kb
        # per-second samples move in clock ticks (10 ms): the mean over the row says more
        share = ", ".join(f"{p} {v / seconds:.1f}" for p, v in self.parts.items())
        mean = sum(self.parts.values()) / seconds
        row.note = (f"tree CPU ms/s, mean {mean:.1f} ({share}); peak PSS (RSS summed "
                    f"{self.peak_rss_kb / 1024:.1f} MiB)")  # fmt: skip
        return row


# ----------------------------------------------------------------------------- churn


@dataclass
class Sandbox:
    name: str  # the pod's
    netns: str
    cid: str


def _sandbox(cn: CacheNode, plugin: Plugin, name: str) -> tuple[Sandbox, Exit, bool]:
    """A new netns holding the prevResult's address (a repair checks it), its ADD."""
    (ns_name,) = cn.bench.namespaces.make()
    address = cn.bench.cluster.prev["ips"][0]["address"].split("/")[0]
    subprocess.run(["ip", "-n", ns_name, "addr", "add", f"{address}/32", "dev", "lo"],
                   check=True)  # fmt: skip
    netns = f"{NETNS_DIR}/{ns_name}"
    done, ok = cn.add(plugin, netns, name, check=False)
    return Sandbox(name, netns, f"cache{cn.seq:08d}"), done, ok


@dataclass
class Replaced:
    adds: Row
    dels: Row
    cycles: int
    took: float  # s, first replacement's start to the last one's end
    late: float  # s, the most a replacement started after its time (the bench fell behind)


def _sleep_until(when: float, sampler: Sampler) -> None:
    while (left := when - time.monotonic()) > 0:
        time.sleep(min(0.05, left))
        sampler.tick()


def _replace(
    cn: CacheNode, plugin: Plugin, sandboxes: list[Sandbox], churn: tuple[float, int],
    busy: Sampler,
) -> Replaced:  # fmt: skip
    """Replace pods at `rate` per second for `seconds` (round robin over `sandboxes`, which
    it updates): DEL, netns gone, pod deleted from the API; a new pod (new name and UID)
    applied, a new netns, its ADD. A replacement that is due while the previous one still
    runs starts at once (`late` says by how much the bench fell behind)."""
    rate, seconds = churn
    out = Replaced(Row(f"churn ADD, {rate:g}/s, {MODE}"), Row(f"churn DEL, {rate:g}/s, {MODE}"),
                   int(rate * seconds), 0.0, 0.0)  # fmt: skip
    busy.start()
    started = time.monotonic()
    for k in range(out.cycles):
        due = started + k / rate
        out.late = max(out.late, time.monotonic() - due)
        _sleep_until(due, busy)
        i = k % len(sandboxes)
        old = sandboxes[i]
        done = cn.run(plugin, "DEL", old.netns, old.name, old.cid)
        out.dels.add(done.ms, done.status == 0, done.cpu_ms)
        cn.bench.namespaces.remove([os.path.basename(old.netns)])
        cn.unbind(old.name)
        name = f"web-{i}-g{k + 1}"
        cn.bind(name)  # the watch delivers the DELETED and the ADDED meanwhile
        box, done, ok = _sandbox(cn, plugin, name)
        sandboxes[i] = box
        out.adds.add(done.ms, ok, done.cpu_ms)
        busy.tick()
    busy.tick(final=True)
    out.took = time.monotonic() - started
    return out


def _churn_rows(  # noqa: PLR0917 - one scenario, its steps in order
    cn: CacheNode,
    binary: Path,
    workdir: Path,
    pods: int,
    idle_s: int,
    churn: tuple[float, int],
    add: Callable[[Row], None],
) -> dict[str, Any]:
    rate, seconds = churn
    flags = ["--keeper", "repair", "--cni-net-dir", str(_net_dir(cn.bench, workdir, MODE)),
             *_agent_flags(cn)]  # fmt: skip
    names = [f"web-{i}-g0" for i in range(pods)]
    for name in names:
        cn.bind(name)
    sandboxes: list[Sandbox] = []
    out: dict[str, Any] = {}
    try:
        with agent_running(binary, cn.bench.cluster, workdir, flags, "cache-churn") as (
            sock, log, proc,
        ):  # fmt: skip
            plugin = agent_plugin(workdir, sock)
            plugin.name = "agent, cache on, keeper repair"
            _synced(cn, log, pods)
            setup_fail = 0
            for name in names:
                box, _done, ok = _sandbox(cn, plugin, name)
                sandboxes.append(box)
                setup_fail += 0 if ok else 1
            _wait(sock.parent / "sandboxes", pods)
            time.sleep(2.0)  # every record watched and compared once
            base = _served(agent_metrics(cn.bench.cluster.node, log))
            gets0 = cn.gets()
            idle = Sampler(proc.pid)
            idle.start()
            _sleep_until(time.monotonic() + idle_s, idle)
            idle.tick(final=True)
            add(idle.row(f"cache agent idle, {pods} pods (CPU ms/s)", idle_s))
            idle_gets = cn.gets() - gets0

            busy = Sampler(proc.pid)
            gets0 = cn.gets()
            run = _replace(cn, plugin, sandboxes, churn, busy)
            adds, dels, took, late, cycles = run.adds, run.dels, run.took, run.late, run.cycles
            churn_gets = cn.gets() - gets0
            time.sleep(2.0)  # the last changes seen by the keeper
            golden = golden_table(MODE)
            wrong = [b.name for b in sandboxes if nat_table(b.netns, MODE) != golden]
            adds.failures += len(wrong) + setup_fail
            adds.note = (f"{churn_gets / max(1, cycles):.2f} API GETs per ADD; "
                         f"{len(wrong)} of {pods} pods not redirected at the end")  # fmt: skip
            add(busy.row(f"cache agent churn, {rate:g}/s, {pods} pods (CPU ms/s)", took))
            add(adds)
            add(dels)
            metrics = agent_metrics(cn.bench.cluster.node, log)
            keeper = {k: v for k, v in metrics.items() if v and "_bucket" not in k
                      and k.startswith("cnibox_agent_keeper_")}  # fmt: skip
            out = {
                "pods": pods, "rate": rate, "seconds": seconds, "cycles": cycles,
                "achieved_rate": cycles / took, "max_late_s": round(late, 3),
                "idle": {"cpu_ms_per_s": idle.per_s, "by_part_ms": idle.parts,
                         "peak_pss_kb": idle.peak_pss_kb, "peak_rss_sum_kb": idle.peak_rss_kb,
                         "api_gets": idle_gets},
                "churn": {"cpu_ms_per_s": busy.per_s, "by_part_ms": busy.parts,
                          "peak_pss_kb": busy.peak_pss_kb, "peak_rss_sum_kb": busy.peak_rss_kb,
                          "api_gets": churn_gets},
                "not_redirected": wrong, "setup_failures": setup_fail,
                "agent_before_churn": base, "agent": _served(metrics), "keeper": keeper,
            }  # fmt: skip
            print(f"churn: {cycles} replacements in {took:.1f} s ({cycles / took:.2f}/s, "
                  f"latest start {late:.2f} s behind); API GETs idle {idle_gets}, "
                  f"churn {churn_gets}; agent {_served(metrics)}; keeper {keeper}")  # fmt: skip
    finally:
        cn.bench.namespaces.remove([os.path.basename(b.netns) for b in sandboxes])
    return out
