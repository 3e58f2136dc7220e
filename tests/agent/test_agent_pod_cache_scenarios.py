"""Every plugin scenario answered from the node's pod cache gives the one-shot plugin's exact
result (issue 26, "the rules are byte-identical to the one-shot path's in every plugin
scenario"; docs/pod-cache.md "Proven identical").

One agent for the module, run from source in a throwaway node netns with `--kubeconfig` and
NODE_NAME against the list/watch stand-in (tests/support/kubewatch.py). Each scenario is a
pod, its own namespace and a config, as the one-shot suite (tests/netns/test_linkerd_cni.py)
and upstream's injected goldens have them: its pod and namespace are put into the stand-in,
the test waits until the cache holds both, the ADD goes through the agent (tests' client
of the launcher's protocol) in a fresh pod netns, and must have read neither from the API
(the stand-in saw no GET of them; the agent counted a cache answer). The one-shot plugin
from source, with its GETs, then runs the same ADD in another fresh pod netns: exit code,
stdout, log lines and every save tool's nat table (IPv4 and IPv6, nft and legacy) must be
the same bytes; where upstream's run is recorded (tests/fixtures/derived/linkerd-iptables)
the tables are that too."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, require_root, require_tool
from tests.support.agent import AgentProcess
from tests.support.kubeapi import service_doc
from tests.support.kubewatch import WatchApi
from tests.support.libcni import CHART_LINKERD
from tests.support.oracles import save_text
from tests.support.pki import Pki
from tests.support.pods import MESHED, NOT_INJECTED, WITH_INIT, golden_pod
from tests.support.rig import Netns, Rig
from tests.support.scenarios import fixture_text

pytestmark = pytest.mark.netns
NODE = "node-a"
PREV = {"cniVersion": "1.0.0", "ips": [{"address": "10.89.0.7/24"}]}
CACHE = 'cnibox_agent_pod_cache_adds_total{source="cache"}'
API = 'cnibox_agent_pod_cache_adds_total{source="api"}'
REQUESTS = "cnibox_agent_add_api_requests_total"
OBJECTS = 'cnibox_agent_pod_cache_objects{{resource="{}"}}'
# Every table either backend holds, in both families: a scenario that programmed the other
# backend or family than the one-shot plugin differs in one of them.
TOOLS = ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save")
SERVICE = "/api/v1/namespaces/default/services/kubernetes"
ONE_SHOT = [sys.executable, "-m", "multicall", "linkerd-cni"]
SKIP_OUT = "config.linkerd.io/skip-outbound-ports"
SKIP_IN = "config.linkerd.io/skip-inbound-ports"
SKIP_SUBNETS = "config.linkerd.io/skip-subnets"
UID = "config.linkerd.io/proxy-uid"
GID = "config.linkerd.io/proxy-gid"


@dataclass
class Node:
    rig: Rig
    netns: Netns
    api: WatchApi
    kubeconfig: Path
    agent: AgentProcess
    pods: int = 0  # bound to NODE and in the stand-in: what the cache must hold
    namespaces: int = 0

    def gets(self) -> list[str]:
        """GETs of one object so far (LIST and WATCH carry a query)."""
        return self.api.object_gets()

    def put_namespace(self, name: str, annotations: dict[str, str] | None) -> None:
        meta: dict[str, Any] = {"name": name}
        if annotations is not None:
            meta["annotations"] = annotations
        new = name not in self.api.namespaces
        self.api.apply({"kind": "Namespace", "apiVersion": "v1", "metadata": meta})
        self.namespaces += new

    def put_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        meta = pod["metadata"]
        new = (meta["namespace"], meta["name"]) not in self.api.pods
        stored = self.api.apply(pod)
        self.pods += new
        return stored

    def barrier(self, what: str) -> None:
        """One more object through the watch of `what`: a watch delivers in order, and the
        cache process forwards in order, so once the cache holds it, it holds every change
        made before it (a MODIFIED moves no count)."""
        if what == "namespaces":
            self.put_namespace(f"barrier-{self.namespaces}", None)
        else:
            self.put_pod(bound(MESHED, "barrier", f"barrier-{self.pods}"))
        self.wait_cached()

    def wait_cached(self, timeout: float = 30) -> None:
        want = {
            OBJECTS.format("pods"): self.pods,
            OBJECTS.format("namespaces"): self.namespaces,
            OBJECTS.format("services"): 1,  # default/kubernetes
        }
        end = time.monotonic() + timeout
        while True:
            metrics = self.agent.metrics()
            if all(metrics.get(k) == v for k, v in want.items()):
                return
            assert time.monotonic() < end, (want, "".join(self.agent.log[-30:]))
            time.sleep(0.05)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Node]:
    require_root()
    for tool in TOOLS:
        require_tool(tool)
    tmp = tmp_path_factory.mktemp("cachescen")
    rig, api = Rig(), WatchApi(pki)
    try:
        netns = rig.node()
        api.start(netns.path)
        api.services[("default", "kubernetes")] = service_doc(
            [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]
        )
        kubeconfig = tmp / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig_text())
        agent = AgentProcess(
            tmp / "run" / "agent.sock",
            argv=[sys.executable, "-m", "multicall"],
            env={"PYTHONPATH": str(REPO), "NODE_NAME": NODE},
            extra=["--kubeconfig", str(kubeconfig), "--keeper", "off"],
            netns=netns.path,
        )
        with agent:
            yield Node(rig, netns, api, kubeconfig, agent)
    finally:
        api.stop()
        rig.cleanup()


# ----------------------------------------------------------------------------- pods


def bound(base: dict[str, Any], namespace: str, name: str, **annotations: str) -> dict[str, Any]:
    """`base` as the API holds it once bound to this node, in `namespace`, named `name`."""
    pod = copy.deepcopy(base)
    meta = pod["metadata"]
    meta.update(name=name, namespace=namespace)
    meta.pop("uid", None)
    meta.setdefault("annotations", {}).update(annotations)
    pod["spec"]["nodeName"] = NODE
    return pod


def classic_sidecar() -> dict[str, Any]:
    """linkerd-proxy as an ordinary container (the injector without native sidecars)."""
    pod = copy.deepcopy(MESHED)
    spec = pod["spec"]
    proxy = [c for c in spec["initContainers"] if c["name"] == "linkerd-proxy"]
    spec["initContainers"] = [c for c in spec["initContainers"] if c["name"] != "linkerd-proxy"]
    spec["containers"] = proxy + spec["containers"]
    return pod


def config_overrides() -> dict[str, Any]:
    """Upstream's config-overrides golden (skip-inbound 7777,8888, skip-outbound 9999, admin
    port, proxy resources) as the injector makes it with the CNI: the validator in place of
    linkerd-init."""
    pod = golden_pod("_config_overrides")
    spec = pod["spec"]
    spec["initContainers"] = [
        {"name": "linkerd-network-validator"} if c["name"] == "linkerd-init" else c
        for c in spec["initContainers"]
    ]
    return pod


def labeled(base: dict[str, Any], **labels: str) -> dict[str, Any]:
    pod = copy.deepcopy(base)
    pod["metadata"].setdefault("labels", {}).update(labels)
    return pod


def host_network() -> dict[str, Any]:
    pod = copy.deepcopy(MESHED)
    pod["spec"]["hostNetwork"] = True
    return pod


@dataclass(frozen=True)
class Scenario:
    name: str
    base: Callable[[], dict[str, Any]] = lambda: MESHED
    pod: dict[str, str] = field(default_factory=dict)  # the pod's annotations
    namespace: dict[str, str] | None = None  # its namespace's (None: none)
    linkerd: dict[str, Any] = field(default_factory=dict)  # the config's `linkerd` block
    code: int = 0
    fixtures: dict[str, str] = field(default_factory=dict)  # save tool -> upstream's run
    # What must be in the tables (or the log), so the scenario is the one it claims to be.
    expect: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    service: bool = False  # the ADD reads `default/kubernetes` (the cache answers it too)


DEFAULT_NFT = {"iptables-nft-save": "default-nft"}
NO_RULES = ("PROXY_INIT",)
SCENARIOS = [
    Scenario("default-nft", fixtures=DEFAULT_NFT),
    Scenario("default-legacy", linkerd={"iptables-mode": "legacy"},
             fixtures={"iptables-legacy-save": "default-legacy"}),
    Scenario("plain-mode", linkerd={"iptables-mode": "plain"}, fixtures=DEFAULT_NFT),
    Scenario("ipv6", linkerd={"ipv6": True},
             fixtures={**DEFAULT_NFT, "ip6tables-nft-save": "default-ipv6-nft"}),
    Scenario("ipv6-legacy", linkerd={"ipv6": True, "iptables-mode": "legacy"},
             # upstream's IPv6 table is its IPv4 one (default-ipv6-nft is default-nft)
             fixtures={"iptables-legacy-save": "default-legacy",
                       "ip6tables-legacy-save": "default-legacy"}),
    Scenario("classic-sidecar", base=classic_sidecar, fixtures=DEFAULT_NFT),
    Scenario("pod-skip-ports", pod={SKIP_IN: "7777,8888", SKIP_OUT: "9999"},
             linkerd={"outbound-ports-to-ignore": ["25"]},
             expect=("--dports 4191,4190,7777,8888 ", "--dports 9999 "), absent=("--dports 25 ",)),
    Scenario("pod-port-ranges", pod={SKIP_IN: "6000-6010", SKIP_OUT: "4000-5000,6000"},
             expect=("--dports 4191,4190,6000:6010 ", "--dports 4000:5000,6000 ")),
    Scenario("config-overrides-golden", base=config_overrides,
             expect=("--dports 4191,4190,7777,8888 ", "--dports 9999 ")),
    Scenario("pod-skip-subnets", pod={SKIP_SUBNETS: "10.0.0.0/8,192.168.0.0/16"},
             expect=("-s 10.0.0.0/8 ", "-s 192.168.0.0/16 ")),
    Scenario("pod-proxy-uid-gid", pod={UID: "1234", GID: "4321"},
             expect=("--uid-owner 1234 ", "--gid-owner 4321 ")),
    Scenario("namespace-annotations",
             namespace={SKIP_OUT: "5432", SKIP_IN: "6000", UID: "3000", GID: "3001",
                        SKIP_SUBNETS: "172.16.0.0/12"},
             expect=("--dports 5432 ", "--dports 4191,4190,6000 ", "--uid-owner 3000 ",
                     "--gid-owner 3001 ", "-s 172.16.0.0/12 ")),
    # The pod's value wins; an empty one on the pod is read from the namespace.
    Scenario("pod-over-namespace", pod={SKIP_OUT: "9999", UID: ""},
             namespace={SKIP_OUT: "5432", UID: "3000"},
             expect=("--dports 9999 ", "--uid-owner 3000 "), absent=("5432",)),
    Scenario("dual-stack-subnets", pod={SKIP_SUBNETS: "10.0.0.0/8,fd00::/8"},
             linkerd={"ipv6": True}, expect=("-s 10.0.0.0/8 ", "-s fd00::/8 ")),
    Scenario("proxy-init-config-legacy",
             pod={SKIP_IN: "9000"},
             linkerd={"iptables-mode": "legacy", "incoming-proxy-port": 4243,
                      "outgoing-proxy-port": 4240, "proxy-uid": 2103,
                      "ports-to-redirect": [8080, 9090], "use-wait-flag": True,
                      "outbound-ports-to-ignore": ["3306"]},
             expect=("--to-ports 4243", "--to-ports 4240", "--uid-owner 2103 ",
                     "--dports 4191,4190,9000 ", "--dports 3306 ")),
    Scenario("control-plane", base=lambda: labeled(
                 MESHED, **{"linkerd.io/control-plane-component": "destination"}),
             expect=("--dports 443,6443 ",), service=True),
    Scenario("control-plane-with-skip-outbound", base=lambda: labeled(
                 MESHED, **{"linkerd.io/control-plane-component": "identity"}),
             namespace={SKIP_OUT: "4567"}, expect=("--dports 4567,443,6443 ",),
             service=True),
    Scenario("host-network", base=host_network, fixtures=DEFAULT_NFT),
    Scenario("simulate", linkerd={"simulate": True}, absent=NO_RULES),
    Scenario("linkerd-init", base=lambda: WITH_INIT, namespace={SKIP_OUT: "5432"},
             absent=NO_RULES),
    Scenario("not-injected", base=lambda: NOT_INJECTED, absent=NO_RULES),
    Scenario("invalid-pod-annotation", pod={UID: "21O2"}, code=1,
             expect=('strconv.Atoi: parsing \\"21O2\\": invalid syntax',), absent=NO_RULES),
    Scenario("invalid-namespace-annotation", namespace={GID: "-x"}, code=1,
             expect=('strconv.Atoi: parsing \\"-x\\": invalid syntax',), absent=NO_RULES),
    # What the API may hold that the cache's JSON pipe (cache process, parent, worker) must
    # carry unchanged: non-ASCII in an error text, control characters, a record near the
    # cache's bound (MAX_RECORD, 64 KiB) in ASCII and as escaped non-ASCII.
    Scenario("invalid-unicode-annotation", pod={UID: "\uff12\uff11\u0e50\u00e9"}, code=1,
             absent=NO_RULES),
    Scenario("control-characters", pod={SKIP_OUT: "9999\n,\u2028\t80\u0000"}, code=1,
             absent=NO_RULES),
    Scenario("large-record", pod={"filler": "z" * 60_000, SKIP_OUT: "9999"},
             expect=("--dports 9999 ",)),
    Scenario("large-escaped-record", pod={"filler": "\u00e9\"" * 5_000, SKIP_OUT: "9998"},
             namespace={"filler": "\u2603" * 10_000, SKIP_IN: "7000"},
             expect=("--dports 9998 ", "--dports 4191,4190,7000 ")),
]  # fmt: skip


# ----------------------------------------------------------------------------- running


def conf(node: Node, linkerd: dict[str, Any], kubernetes: dict[str, str] | None = None) -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "name": "cbxnet", "type": "linkerd-cni", "log_level": "debug",
        "kubernetes": kubernetes or {"kubeconfig": str(node.kubeconfig)},
        "linkerd": {**CHART_LINKERD, **linkerd}, "prevResult": PREV,
    })  # fmt: skip


@dataclass
class Outcome:
    code: int
    stdout: str
    log: list[str]
    tables: dict[str, str]


def invoke(
    node: Node,
    argv: list[str],
    command: str,
    pod_ns: Netns,
    pod: dict[str, Any],
    *,
    linkerd: dict[str, Any],
    kubernetes: dict[str, str] | None = None,
) -> Outcome:
    """`command` for `pod` in `pod_ns`, as the runtime calls it (the pod's UID in CNI_ARGS),
    and the tables it left there."""
    meta = pod["metadata"]
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": str(REPO),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "cbxscenario",
        "CNI_NETNS": pod_ns.path,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={meta['namespace']};"
        f"K8S_POD_NAME={meta['name']};K8S_POD_UID={meta['uid']}",
    }
    proc = subprocess.run(
        ["ip", "netns", "exec", node.netns.name, *argv],
        env=env, input=conf(node, linkerd, kubernetes), capture_output=True, text=True, timeout=120,
        cwd=REPO, check=False,
    )  # fmt: skip
    # The netns's name is the only input that differs between the two paths' runs.
    log = [re.sub(r'time="[^"]*"', "time=T", line) for line in proc.stderr.splitlines()]
    return Outcome(
        proc.returncode,
        proc.stdout.replace(pod_ns.name, "POD"),
        [line.replace(pod_ns.name, "POD") for line in log],
        {tool: save_text(pod_ns, tool) for tool in TOOLS},
    )


@dataclass
class Run:
    add: Outcome
    check: Outcome  # CHECK after that ADD, in the same netns


def run(node: Node, argv: list[str], pod: dict[str, Any], linkerd: dict[str, Any]) -> Run:
    """ADD then CHECK of `pod` in a fresh pod netns, removed after."""
    pod_ns = node.rig.pod().netns
    try:
        added = invoke(node, argv, "ADD", pod_ns, pod, linkerd=linkerd)
        return Run(added, invoke(node, argv, "CHECK", pod_ns, pod, linkerd=linkerd))
    finally:
        node.rig.remove(pod_ns)


def through_cache(node: Node, pod: dict[str, Any], linkerd: dict[str, Any]) -> Run:
    """ADD and CHECK through the agent, answered by the cache: no GET of the pod, its
    namespace or the `default/kubernetes` service, the ADD counted as a cache answer."""
    before, metrics = len(node.gets()), node.agent.metrics()
    client = [sys.executable, "-m", "tests.support.agent_client", node.agent.socket]
    outcome = run(node, client, pod, linkerd)
    assert node.gets()[before:] == [], outcome.add.log
    after = node.agent.metrics()
    assert after[CACHE] == metrics[CACHE] + 1, outcome.add.log
    assert after[API] == metrics[API]
    assert after[REQUESTS] == metrics[REQUESTS]
    return outcome


def one_shot(
    node: Node, pod: dict[str, Any], linkerd: dict[str, Any], service: bool = False
) -> Run:
    """The same ADD and CHECK by the one-shot plugin, which reads the pod (and, `service`,
    the `default/kubernetes` service) from the API."""
    before = len(node.gets())
    outcome = run(node, ONE_SHOT, pod, linkerd)
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    assert node.gets()[before:].count(path) == 2
    assert node.gets()[before:].count(SERVICE) == (2 if service else 0)
    return outcome


def same(cached: Outcome, api: Outcome) -> None:
    assert (cached.code, cached.stdout) == (api.code, api.stdout), cached.log
    assert cached.log == api.log
    for tool in TOOLS:
        assert cached.tables[tool] == api.tables[tool], tool


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_scenario_answered_by_the_cache_is_the_one_shot_result(
    node: Node, case: Scenario
) -> None:
    namespace = f"cbx-{case.name}"
    node.put_namespace(namespace, case.namespace)
    pod = node.put_pod(bound(case.base(), namespace, "web-0", **case.pod))
    node.wait_cached()
    cached = through_cache(node, pod, case.linkerd)
    api = one_shot(node, pod, case.linkerd, case.service)
    same(cached.add, api.add)
    same(cached.check, api.check)
    assert cached.add.code == case.code, cached.add.log
    for tool, fixture in case.fixtures.items():
        assert cached.add.tables[tool] == fixture_text(fixture), tool
    tables = "".join(cached.add.tables.values())
    text = tables + cached.add.stdout + "\n".join(cached.add.log)
    assert [e for e in case.expect if e not in text] == []
    assert [a for a in case.absent if a in tables] == []
    if not case.absent:  # a meshed pod: its rules are there, and CHECK passes
        assert "PROXY_INIT_REDIRECT" in tables
        assert cached.check.code == 0, cached.check.log


@pytest.mark.parametrize("source", ["namespace", "pod"])
def test_an_annotation_changed_between_two_adds_is_followed(node: Node, source: str) -> None:
    """`kubectl annotate` of the namespace (or of the running pod) between two ADDs of the
    same pod (its sandbox re-created): the second ADD gets the new value from the cache,
    and the one-shot plugin's tables; with the annotation removed, the defaults."""
    namespace = f"cbx-change-{source}"
    annotated = {SKIP_OUT: "5432"}
    node.put_namespace(namespace, annotated if source == "namespace" else None)
    pod = node.put_pod(bound(MESHED, namespace, "web-0", **(annotated if source == "pod" else {})))
    node.wait_cached()
    steps: list[tuple[dict[str, str], str]] = [
        ({SKIP_OUT: "5432"}, "--dports 5432 "),
        ({SKIP_OUT: "6543"}, "--dports 6543 "),
        ({}, ""),
    ]
    for number, (values, expect) in enumerate(steps):
        if number:  # the change, through the watch
            if source == "namespace":
                node.put_namespace(namespace, values)
            else:
                changed = copy.deepcopy(pod)
                changed["metadata"]["annotations"].pop(SKIP_OUT)
                changed["metadata"]["annotations"].update(values)
                pod = node.put_pod(changed)
            node.barrier(f"{source}s")
        cached = through_cache(node, pod, {})
        api = one_shot(node, pod, {})
        same(cached.add, api.add)
        same(cached.check, api.check)
        nat = cached.add.tables["iptables-nft-save"]
        if expect:
            assert expect in nat, values
        else:
            assert nat == fixture_text("default-nft")
        stale = [port for port in ("5432", "6543") if port not in expect]
        assert [p for p in stale if f"--dports {p} " in nat] == [], values


def test_a_kubeconfig_verifying_another_server_name_is_not_answered_by_the_cache(
    node: Node, tmp_path: Path
) -> None:
    """The same server and CA, but TLS verifies another name (`tls-server-name`): that is
    trusting the server another way (docs/pod-cache.md rule 2). The one-shot plugin fails
    the ADD (the certificate is not valid for that name); through the agent the cache must
    not answer it either, and the ADD reads the API and fails in the same words."""
    namespace = "cbx-server-name"
    node.put_namespace(namespace, None)
    pod = node.put_pod(bound(MESHED, namespace, "web-0"))
    node.wait_cached()
    text = node.kubeconfig.read_text()
    server = next(line for line in text.splitlines() if line.strip().startswith("server:"))
    other = tmp_path / "kubeconfig"
    other.write_text(text.replace(server, f"{server}\n    tls-server-name: wrong.example"))
    kube = {"kubeconfig": str(other)}
    metrics = node.agent.metrics()
    client = [sys.executable, "-m", "tests.support.agent_client", node.agent.socket]
    pod_ns = node.rig.pod().netns
    try:
        cached = invoke(node, client, "ADD", pod_ns, pod, linkerd={}, kubernetes=kube)
    finally:
        node.rig.remove(pod_ns)
    pod_ns = node.rig.pod().netns
    try:
        api = invoke(node, ONE_SHOT, "ADD", pod_ns, pod, linkerd={}, kubernetes=kube)
    finally:
        node.rig.remove(pod_ns)
    assert api.code == 1
    assert "tls: failed to verify certificate: x509: " in api.stdout, api.stdout
    assert "wrong.example" in api.stdout
    same(cached, api)
    after = node.agent.metrics()
    assert after[CACHE] == metrics[CACHE]
    miss = 'cnibox_agent_pod_cache_misses_total{reason="other cluster"}'
    assert after[miss] == metrics[miss] + 1
