"""The CRI suite's one-node cluster: a CriNode, the Kubernetes API stand-in inside the node's
netns serving upstream's injected pods, the chained conflist as the chart configures it, and
what every case checks (the rules a pod got, that nothing leaked).

Shared by tests/cri and bench/bench.py (the RunPodSandbox row).
"""

from __future__ import annotations

import difflib
import ipaddress
import itertools
import subprocess
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.cri.client import PodRef, SandboxInfo
from tests.cri.modes import PluginMode, Served
from tests.cri.node import BRIDGE, KUBECONFIG, POD_SUBNET, CriNode
from tests.support import require_root, require_tool
from tests.support.kubeapi import KubeApi
from tests.support.libcni import conflist, primary_plugin
from tests.support.pki import Pki
from tests.support.pods import MESHED, NOT_INJECTED, WITH_INIT
from tests.support.rig import Rig
from tests.support.scenarios import comparable_save, fixture_text

NETWORK = "cbxnet"
CHART_LOG_LEVEL = "info"  # the chart's default; DEL is logged at info


@dataclass(frozen=True)
class MeshedCase:
    """A meshed pod under one plugin configuration and the upstream tables it must get."""

    name: str
    linkerd: Mapping[str, Any]  # conflist overrides of the chart's values
    # (Debian's save tool, scenario in tests/fixtures/derived/linkerd-iptables)
    tables: tuple[tuple[str, str], ...]


NFT = MeshedCase("nft", {"iptables-mode": "nft"}, (("iptables-nft-save", "default-nft"),))
LEGACY = MeshedCase(
    "legacy", {"iptables-mode": "legacy"}, (("iptables-legacy-save", "default-legacy"),)
)
IPV6 = MeshedCase(
    "ipv6",
    {"iptables-mode": "nft", "ipv6": True},
    (("iptables-nft-save", "default-nft"), ("ip6tables-nft-save", "default-ipv6-nft")),
)
MESHED_CASES = (NFT, LEGACY, IPV6)


@dataclass
class CriCluster:
    node: CriNode
    api: KubeApi
    mode: PluginMode
    current: dict[str, Any] | None = None
    kubeconfig_port: int | None = None  # None: the stand-in's own port
    # RunPodSandbox calls whose chain ran linkerd-cni's ADD, and those that succeeded
    linkerd_adds: int = 0
    linkerd_ok: int = 0
    _uids: itertools.count[int] = field(default_factory=itertools.count)
    _count: threading.Lock = field(default_factory=threading.Lock)

    # -- configuration

    def primary(self) -> dict[str, Any]:
        """bridge + host-local, both inside the node netns (the IPAM state in the node's dir)."""
        return primary_plugin("bridge", self.node.dirs.ipam, POD_SUBNET, BRIDGE)

    def chained(self, **linkerd: Any) -> dict[str, Any]:
        """The primary network with linkerd-cni appended as the chart's installer leaves it
        (the chart's values, its kubeconfig beside the conflist), with `linkerd` overrides."""
        doc = conflist(self.primary(), self.node.dirs.conf / KUBECONFIG, linkerd=linkerd,
                       log_level=CHART_LOG_LEVEL)  # fmt: skip
        doc["name"] = NETWORK
        return doc

    def bridge_only(self) -> dict[str, Any]:
        return {"cniVersion": "1.0.0", "name": NETWORK, "plugins": [self.primary()]}

    def use(self, doc: dict[str, Any]) -> None:
        """Make `doc` containerd's network (no-op if it already is)."""
        if doc != self.current:
            self.node.use_conflist(doc)
            self.current = doc

    def write_kubeconfig(self, port: int | None = None) -> None:
        """The installer's kubeconfig for the API stand-in (or a port of your choosing)."""
        staging = self.node.dirs.base / "kubeconfig.staging"
        self.api.kubeconfig(staging, port=port)
        self.node.write_conf(KUBECONFIG, staging.read_bytes())
        self.kubeconfig_port = port

    def restore_api(self) -> None:
        """The stand-in answers again and the kubeconfig points at it."""
        self.api.mode = "ok"
        if self.kubeconfig_port is not None:
            self.write_kubeconfig()

    # -- pods

    def ref(self, pod: Mapping[str, Any]) -> PodRef:
        meta = pod["metadata"]
        if (meta["namespace"], meta["name"]) not in self.api.pods:
            self.api.add_pod(pod)
        return PodRef.of(pod, f"0c9b6f0e-cbx-{next(self._uids)}")

    def run(self, pod: Mapping[str, Any]) -> SandboxInfo:
        """RunPodSandbox for `pod` (served by the API stand-in); its status."""
        return self.start(self.ref(pod))

    def start(self, ref: PodRef) -> SandboxInfo:
        """RunPodSandbox for a pod `ref` made; its status. Safe from several threads."""
        chained = self.chains_linkerd()
        with self._count:
            self.linkerd_adds += chained
        sandbox_id = self.node.cri.run_pod_sandbox(ref, self.node.cgroup_parent)
        with self._count:
            self.linkerd_ok += chained
        return self.node.cri.sandbox(sandbox_id)

    def chains_linkerd(self) -> bool:
        plugins = (self.current or {}).get("plugins", [])
        return any(plugin.get("type") == "linkerd-cni" for plugin in plugins)

    # -- the mode's agent

    def agent_served(self) -> Served | None:
        """What the mode's node agent counted so far (None: the mode has no agent)."""
        return self.mode.served(self.node) if self.mode.served is not None else None

    def assert_served_by_agent(self, before: Served | None, adds: int, ok: int) -> None:
        """Every linkerd-cni ADD since `before` (the cluster's counters were `adds`, `ok`)
        was answered by the agent, none handed back: the case passed through the agent, not
        through the launcher's fallback."""
        after = self.agent_served()
        if before is None or after is None:
            return
        expected = Served(self.linkerd_adds - adds, self.linkerd_ok - ok, 0)
        got = Served(after.adds - before.adds, after.ok - before.ok,
                     after.fallbacks - before.fallbacks)  # fmt: skip
        assert got == expected, f"the agent served {got}, the case made {expected}"

    def end(self, sandbox_id: str) -> None:
        """What kubelet does when a pod goes: StopPodSandbox, then RemovePodSandbox."""
        self.node.cri.stop(sandbox_id)
        self.node.cri.remove(sandbox_id)

    def end_all(self) -> None:
        for sandbox_id in self.node.cri.sandbox_ids():
            self.end(sandbox_id)

    # -- what a pod got

    def nat(self, sandbox: SandboxInfo, tool: str) -> str:
        """The pod's nat table as Debian's `tool` prints it, comment lines dropped."""
        return comparable_save(self.node.in_pod(sandbox.netns, [tool, "-t", "nat"]))

    def proxy_init_lines(self, sandbox: SandboxInfo) -> list[str]:
        lines = []
        for tool in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save"):
            lines += [line for line in self.nat(sandbox, tool).splitlines() if "PROXY_INIT" in line]
        return lines

    def leaks(self) -> list[str]:
        """What a pod that is gone (or never started) may have left on the node."""
        found = []
        if ids := self.node.cri.sandbox_ids():
            found.append(f"sandboxes still listed: {ids}")
        netns = self.node.inside(str(self.node.dirs.netns_dir))
        if netns.is_dir() and (names := sorted(p.name for p in netns.iterdir())):
            found.append(f"pod netns still mounted: {names}")
        ipam = self.node.dirs.ipam / NETWORK
        if ipam.is_dir() and (ips := sorted(p.name for p in ipam.iterdir() if _is_ip(p.name))):
            found.append(f"host-local still holds {ips}")
        links = subprocess.run(["ip", "-n", self.node.netns.name, "-o", "link", "show"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        links_left = {line.split(": ")[1].split("@")[0] for line in links.splitlines()}
        if extra := sorted(links_left - {"lo", BRIDGE}):
            found.append(f"links left in the node netns: {extra}")
        pods = self.node.tracking_cgroup
        if extra := sorted(p.name for p in pods.iterdir() if p.is_dir() and p.name != "daemon"):
            found.append(f"pod cgroups left: {extra}")
        results = self.node.inside("/var/lib/cni/results")
        if results.is_dir() and (cached := sorted(p.name for p in results.iterdir())):
            found.append(f"libcni result cache entries left: {cached}")
        return found


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_meshed(
    cluster: CriCluster, case: MeshedCase, pod: Mapping[str, Any] = MESHED
) -> SandboxInfo:
    """Start a meshed pod under `case`'s configuration; assert containerd reports it ready with
    an address from the bridge (the chain's result, passed through linkerd-cni) and that its
    netns holds exactly upstream's tables. Raises AssertionError with a diff otherwise."""
    cluster.use(cluster.chained(**case.linkerd))
    sandbox = cluster.run(pod)
    assert sandbox.ready, sandbox
    assert ipaddress.ip_address(sandbox.ip) in ipaddress.ip_network(POD_SUBNET), sandbox
    for tool, fixture in case.tables:
        actual, expected = cluster.nat(sandbox, tool), fixture_text(fixture)
        if actual != expected:
            diff = "".join(difflib.unified_diff(
                expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                f"upstream {fixture}.iptables-save.txt", f"{tool} -t nat in the pod"))  # fmt: skip
            raise AssertionError(
                f"pod {sandbox.id[:12]} ({case.name}): the rules differ from upstream's\n{diff}"
            )
    return sandbox


def require_oracles() -> None:
    require_root()
    for tool in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save"):
        require_tool(tool)


def start_cluster(pki: Pki, plugin: str, mode: PluginMode) -> Iterator[CriCluster]:
    """A started node with its API stand-in and kubeconfig; removed however the module ends."""
    rig = Rig()
    api = KubeApi(pki)
    for pod in (MESHED, WITH_INIT, NOT_INJECTED):
        api.add_pod(pod)
    try:
        with CriNode(rig, plugin, setup=mode.setup) as node:
            api.start(node.netns.path)
            cluster = CriCluster(node, api, mode)
            cluster.write_kubeconfig()
            yield cluster
    finally:
        api.stop()
        rig.cleanup()
