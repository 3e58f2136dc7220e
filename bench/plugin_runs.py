"""cnibox's side: the plugin as the runtime invokes it, against a test API, checked outside
the timed region."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.measure import Row
from bench.netns import Namespaces
from bench.paths import GOLDEN, NETNS_DIR, PREV_RESULT, UNMESHED_GOLDEN, UNMESHED_NAME
from bench.spawn import Exit, Reaped, Spawner
from bench.upstream import TIME_RSS, golden_table, nat_table, parse_rss
from multicall.core.installer.config import render_kubeconfig
from multicall.effects.ns import entered_netns
from tests.support.kubeapi import TOKEN, KubeApi, pods_from_golden
from tests.support.libcni import CHART_LINKERD
from tests.support.pki import make_pki

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
        # `cnibox iptables-verify` and the pod file: how a native ADD is checked
        # (bench/native_rows.py), set by the rows that make them
        self.native_verifier: tuple[list[str], Path] | None = None

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
        elif meshed and mode == "nftables":
            from bench.native_rows import native_problem

            problem = native_problem(self, netns)
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
