"""linkerd-cni's ADD/CHECK/DEL/STATUS logic in-process, through the seam the binary and the
node agent use (multicall.plugin.run.run_plugin), with a fake Kubernetes API and an
in-memory firewall (tests/support/fakes.py): no root, no network, no kernel.

The bytes on stdout are the binary's: the same fixtures as the command-level suites.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from multicall.core.cni.skel import VERSION_REPLY
from multicall.core.firewall.diff import diff_tables
from multicall.core.firewall.iptables_save import parse_save
from multicall.core.firewall.model import Family, Mode
from multicall.core.firewall.proxy_init import build_run_argv
from multicall.core.firewall.ruleset import Rule, Table
from multicall.core.kube.pod_policy import effective_options
from multicall.plugin.ports import PluginDeps
from multicall.plugin.run import PluginError, PluginRequest, PluginResult, run_plugin
from tests.support import FIXTURES
from tests.support.fakes import FakeKube, MemoryFirewall
from tests.support.kubeapi import service_doc
from tests.support.libcni import CHART_LINKERD
from tests.support.pods import MESHED, NOT_INJECTED, NS, WITH_INIT, renamed
from tests.support.rulesets import last_table

IPTABLES = FIXTURES / "derived" / "linkerd-iptables"
STDOUT = FIXTURES / "derived" / "linkerd-cni-stdout"
KUBECONFIG = "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"
NETNS = "/var/run/netns/cbx-seam-pod"  # never opened: the fakes enter no namespace
PREV = json.loads((STDOUT / "prev-100.stdin.json").read_text())["prevResult"]


def config(version: str = "1.0.0", linkerd: dict[str, Any] | None = None, **flags: Any) -> bytes:
    """The chart's plugin entry as libcni hands it over: prevResult in it."""
    return json.dumps(
        {
            "cniVersion": version,
            "name": "k8s-pod-network",
            "type": "linkerd-cni",
            "log_level": "debug",
            "kubernetes": {"kubeconfig": KUBECONFIG},
            "linkerd": {**CHART_LINKERD, **(linkerd or {}), **flags},
            "prevResult": PREV,
        }
    ).encode()


def env(command: str, pod: dict[str, Any] | None = MESHED, **extra: str) -> dict[str, str]:
    args = "IgnoreUnknown=1"
    if pod is not None:
        meta = pod["metadata"]
        args += f";K8S_POD_NAMESPACE={meta['namespace']};K8S_POD_NAME={meta['name']}"
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "c0ffee",
        "CNI_NETNS": NETNS,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": args,
        **extra,
    }


class Node:
    """The plugin's world for one test: an API with upstream's pods, an empty firewall."""

    def __init__(self) -> None:
        self.kube = FakeKube()
        for pod in (MESHED, WITH_INIT, NOT_INJECTED):
            self.kube.add_pod(pod)
        self.firewall = MemoryFirewall()
        self.log = io.BytesIO()

    def run(self, command: str, stdin: bytes | None = None, **kw: Any) -> PluginResult:
        request = PluginRequest(
            env=kw.pop("env", None) or env(command, **kw),
            stdin=config() if stdin is None else stdin,
            stderr=self.log,
            netns_fd=kw.pop("netns_fd", None),
        )
        return run_plugin(request, PluginDeps(self.kube, self.firewall))

    def nat(self, family: Family = Family.IPV4) -> Table:
        return self.firewall.table(NETNS, family)

    @property
    def logs(self) -> str:
        return self.log.getvalue().decode()


@pytest.fixture
def node() -> Node:
    return Node()


def fixture_table(name: str) -> Table:
    table = last_table(parse_save((IPTABLES / f"{name}.iptables-save.txt").read_text()), "nat")
    assert table is not None
    return table


def error(code: int, msg: str, details: str = "") -> bytes:
    body: dict[str, Any] = {"code": code, "msg": msg}
    if details:
        body["details"] = details
    return json.dumps(body, indent=4).encode()


# ----------------------------------------------------------------------------- ADD


def test_add_meshed_pod_programs_upstream_rules(node: Node) -> None:
    """ADD prints prevResult unchanged and leaves exactly upstream's nat table."""
    result = node.run("ADD")
    assert result == PluginResult((STDOUT / "prev-100.stdout").read_bytes(), 0)
    assert diff_tables(fixture_table("default-nft"), node.nat(), strict=True).ok
    (applied,) = node.firewall.applied
    assert (applied.netns.path, applied.mode, applied.families) == (NETNS, Mode.NFT, (Family.IPV4,))
    # no override annotation on the pod: its namespace is read once for them
    assert node.kube.requests == [
        f"/api/v1/namespaces/{NS}/pods/{MESHED['metadata']['name']}",
        f"/api/v1/namespaces/{NS}",
    ]
    assert node.kube.closed == node.kube.connections == 1


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (WITH_INIT, "linkerd-init initContainer is present, skipping."),
        (NOT_INJECTED, "linkerd-proxy is not present, skipping."),
        (None, "no Kubernetes namespace or pod name found, skipping."),
    ],
)
def test_pods_that_get_no_rules(node: Node, pod: dict[str, Any] | None, message: str) -> None:
    """linkerd-init, no proxy, or no pod identity: prevResult passes, no rules, logged why."""
    result = node.run("ADD", pod=pod)
    assert result == PluginResult((STDOUT / "prev-100.stdout").read_bytes(), 0)
    assert node.firewall.applied == []
    assert message in node.logs


def test_ipv6_programs_both_families(node: Node) -> None:
    """`ipv6: true` plans and programs IPv4 then IPv6, as upstream runs ip6tables too."""
    assert node.run("ADD", config(ipv6=True)).exit_code == 0
    assert diff_tables(fixture_table("default-ipv6-nft"), node.nat(Family.IPV6), strict=True).ok
    assert node.firewall.applied[0].families == (Family.IPV4, Family.IPV6)


def test_dual_stack_with_ipv4_skip_subnets_starts_the_pod(node: Node) -> None:
    """IPv4 skip-subnets with `ipv6: true`: each family gets its own subnets only
    (linkerd2-proxy-init#696); upstream fails ADD at ip6tables."""
    subnets = {"subnets-to-ignore": ["10.0.0.0/8", "fd00::/8"]}
    assert node.run("ADD", config(linkerd=subnets, ipv6=True)).exit_code == 0
    for family, mine, other in ((Family.IPV4, "10.0.0.0/8", "fd00::/8"),
                                (Family.IPV6, "fd00::/8", "10.0.0.0/8")):  # fmt: skip
        comments = " ".join(" ".join(r.spec) for r in node.nat(family).rules)
        assert f"ignore-subnet-{mine}" in comments
        assert f"ignore-subnet-{other}" not in comments
    assert node.run("CHECK", config(linkerd=subnets, ipv6=True)) == PluginResult(b"", 0)


def test_namespace_annotation_and_a_single_namespace_get(node: Node) -> None:
    """An override found only on the namespace applies; the namespace is read once."""
    node.kube.namespaces[NS] = {
        "kind": "Namespace",
        "metadata": {"name": NS, "annotations": {"config.linkerd.io/skip-outbound-ports": "5432"}},
    }
    assert node.run("ADD").exit_code == 0
    assert node.firewall.applied[0].options.outbound_ports_to_ignore == ("5432",)
    assert node.kube.requests.count(f"/api/v1/namespaces/{NS}") == 1


def test_control_plane_pod_skips_the_api_server_ports(node: Node) -> None:
    """A control-plane pod gets the kubernetes service's port and targetPort skipped."""
    node.kube.services[("default", "kubernetes")] = service_doc(
        [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]
    )
    pod = renamed(MESHED, "destination-0")
    pod["metadata"]["labels"] = {"linkerd.io/control-plane-component": "destination"}
    node.kube.add_pod(pod)
    assert node.run("ADD", pod=pod).exit_code == 0
    assert node.firewall.applied[0].options.outbound_ports_to_ignore[-2:] == ("443", "6443")


def test_unreadable_service_falls_back_and_logs(node: Node) -> None:
    """The service GET failing logs upstream's line and skips 443 and 6443 anyway."""
    node.kube.service_failure = "Unauthorized"
    pod = renamed(MESHED, "identity-0")
    pod["metadata"]["labels"] = {"linkerd.io/control-plane-component": "identity"}
    node.kube.add_pod(pod)
    assert node.run("ADD", pod=pod).exit_code == 0
    assert node.firewall.applied[0].options.outbound_ports_to_ignore[-2:] == ("443", "6443")
    assert "could not retrieve ports from 'kubernetes' service: Unauthorized" in node.logs


@pytest.mark.parametrize(
    ("failure", "pod", "message"),
    [
        ("Unauthorized", MESHED, "Unauthorized"),
        (None, renamed(MESHED, "ghost"), 'pods "ghost" not found'),
    ],
)
def test_api_failure_fails_add_and_programs_nothing(
    node: Node, failure: str | None, pod: dict[str, Any], message: str
) -> None:
    """An API error is CNI error 999 with client-go's text; the firewall is not touched."""
    node.kube.failure = failure
    assert node.run("ADD", pod=pod) == PluginResult(
        error(999, message), 1, PluginError(999, message)
    )
    assert node.firewall.applied == []


def test_invalid_annotation_fails_with_go_text(node: Node) -> None:
    """A proxy-uid Go's Atoi rejects fails ADD with Go's text, before any rule."""
    pod = renamed(MESHED, "bad-uid", **{"config.linkerd.io/proxy-uid": "21O2"})
    node.kube.add_pod(pod)
    result = node.run("ADD", pod=pod)
    message = 'strconv.Atoi: parsing "21O2": invalid syntax'
    assert result == PluginResult(error(999, message), 1, PluginError(999, message))
    assert node.firewall.applied == []


def test_simulate_logs_upstream_commands_and_programs_nothing(node: Node) -> None:
    """`simulate: true` logs the command lines upstream would run, nothing is applied."""
    assert node.run("ADD", config(simulate=True, ipv6=True)).exit_code == 0
    assert node.firewall.applied == []
    base = node.kube.pods[(NS, MESHED["metadata"]["name"])]
    from multicall.core.cni.netconf import base_options, parse_netconf
    from multicall.core.kube.objects import parse_pod

    options = effective_options(
        base_options(parse_netconf(config(simulate=True))), parse_pod(base), {}, None
    )
    for family in Family:
        for argv in build_run_argv(options, family, mode=Mode.NFT, netns=NETNS):
            assert " ".join(argv) in node.logs


def test_simulate_names_nsenter_as_go_resolves_it(node: Node, tmp_path: Path) -> None:
    """Upstream logs Go's cmd.String(): nsenter by the path found in the plugin's $PATH
    (`/usr/bin/nsenter` on most hosts), the bare name only where none is found."""
    tool = tmp_path / "nsenter"
    tool.write_text("")
    tool.chmod(0o755)
    path = f"relative/dir:{tmp_path}:/nonexistent"
    assert node.run("ADD", config(simulate=True), env=env("ADD", PATH=path)).exit_code == 0
    lines = [line for line in node.logs.splitlines() if "--net=" in line]
    assert lines
    assert all(f'"{tool} --net={NETNS} -- ' in line for line in lines), lines


def test_dropped_port_items_are_logged(node: Node) -> None:
    """Invalid port items are dropped with upstream's log line, the rest is programmed."""
    assert (
        node.run("ADD", config(linkerd={"outbound-ports-to-ignore": ["25", " 587"]})).exit_code == 0
    )
    assert 'invalid port configuration of \\" 587\\"' in node.logs
    assert any("--dports 25" in " ".join(r.spec) for r in node.nat().rules)


def test_the_callers_own_netns_is_refused(node: Node) -> None:
    """CNI_NETNS naming the plugin's own netns is CNI error 8 and nothing is programmed."""
    own = env("ADD", CNI_NETNS="/proc/self/ns/net")
    result = node.run("ADD", env=own)
    message = "plugin's netns and netns from CNI_NETNS should not be the same"
    assert result == PluginResult(error(8, message), 1, PluginError(8, message))
    assert node.firewall.applied == []


@pytest.fixture
def fds() -> Iterator[tuple[int, int]]:
    """An fd on our netns, and one on a namespace file that is not a netns (never equal)."""
    net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    uts = os.open("/proc/self/ns/uts", os.O_RDONLY | os.O_CLOEXEC)
    yield net, uts
    os.close(net)
    os.close(uts)


def test_netns_fds_from_the_caller(node: Node, fds: tuple[int, int]) -> None:
    """The node agent's way: the pod's netns as an fd (handed to the firewall as is) and the
    caller's own netns as an fd, which the own-netns refusal compares against."""
    net, other = fds
    request = PluginRequest(
        env=env("ADD", CNI_NETNS="/proc/self/ns/net"),
        stdin=config(),
        stderr=node.log,
        netns_fd=net,
        caller_netns_fd=other,
    )
    assert run_plugin(request, PluginDeps(node.kube, node.firewall)).exit_code == 0
    (applied,) = node.firewall.applied
    assert (applied.netns.fd, applied.netns.own_fd) == (net, other)
    refused = PluginRequest(request.env, request.stdin, node.log, net, caller_netns_fd=net)
    assert run_plugin(refused, PluginDeps(node.kube, node.firewall)).stdout.startswith(
        b'{\n    "code": 8,'
    )
    os.fstat(net)  # borrowed fds stay open


@pytest.mark.parametrize("kind", ["regular file", "uts namespace"])
def test_a_handed_netns_fd_is_checked_as_an_opened_one(
    node: Node, tmp_path: Path, kind: str
) -> None:
    """A descriptor the caller handed over (the node agent's client) gets the check a
    CNI_NETNS opened by run_plugin gets (an nsfs file of a network namespace): one that
    fails it is not used, as an unopenable path is not, and it stays open (borrowed)."""
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    path = str(plain) if kind == "regular file" else "/proc/self/ns/uts"
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert node.run("ADD", netns_fd=fd).exit_code == 0
        (applied,) = node.firewall.applied
        assert applied.netns.fd is None
        os.fstat(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- CHECK, DEL


def test_check_after_add_passes(node: Node) -> None:
    """CHECK compares the live table with what ADD programs: equal, exit 0, no output."""
    node.run("ADD")
    assert node.run("CHECK") == PluginResult(b"", 0)
    assert "are as expected" in node.logs


def test_check_after_a_simulated_add_passes(node: Node) -> None:
    """`simulate: true`: ADD programs nothing, so CHECK has nothing to find missing."""
    conf = config(simulate=True)
    assert node.run("ADD", conf).exit_code == 0
    assert node.firewall.applied == []
    assert node.run("CHECK", conf) == PluginResult(b"", 0)
    assert "simulate is set" in node.logs


# A netns whose PREROUTING already jumps to PROXY_INIT_REDIRECT without upstream's comment
# (left by another tool, or by an older proxy-init): ADD flushes the chain and keeps that jump.
UNCOMMENTED_JUMP = Table(
    "nat",
    (*fixture_table("default-nft").chains,),
    (Rule("PREROUTING", ("-j", "PROXY_INIT_REDIRECT")),),
)


def test_check_after_add_over_an_uncommented_jump_passes(node: Node) -> None:
    """ADD adds no second jump when one matching upstream's regex is there; CHECK (and
    iptables-verify) take the jump ADD kept for the one it would have added."""
    node.firewall.tables[(NETNS, Family.IPV4)] = UNCOMMENTED_JUMP
    assert node.run("ADD").exit_code == 0
    assert Rule("PREROUTING", ("-j", "PROXY_INIT_REDIRECT")) in node.nat().rules
    assert node.run("CHECK") == PluginResult(b"", 0), node.logs


def test_check_still_fails_without_any_jump(node: Node) -> None:
    """The adopted jump is only one ADD would keep: a table with no jump at all fails."""
    node.run("ADD")
    table = node.nat()
    kept = tuple(r for r in table.rules if r.chain != "PREROUTING")
    node.firewall.tables[(NETNS, Family.IPV4)] = Table(table.name, table.chains, kept)
    details = json.loads(node.run("CHECK").stdout)["details"]
    assert "-A PREROUTING" in details
    assert "install-proxy-init-prerouting" in details


def test_check_names_a_deleted_rule(node: Node) -> None:
    """CHECK after a rule vanished fails with a readable diff naming that rule."""
    node.run("ADD")
    table = node.nat()
    gone = next(r for r in table.rules if r.chain == "PROXY_INIT_OUTPUT" and "lo" in r.spec)
    kept = tuple(r for r in table.rules if r != gone)
    node.firewall.tables[(NETNS, Family.IPV4)] = Table(table.name, table.chains, kept)
    result = node.run("CHECK")
    body = json.loads(result.stdout)
    assert (result.exit_code, body["code"]) == (1, 999)
    assert "differ from the expected ones" in body["msg"]
    assert f"- -A PROXY_INIT_OUTPUT {' '.join(gone.spec)}" in body["details"].replace('"', "")


def test_check_reports_a_foreign_rule(node: Node) -> None:
    """A rule someone appended to our chain is named as unexpected."""
    node.run("ADD")
    table = node.nat()
    extra = Rule("PROXY_INIT_REDIRECT", ("-p", "udp", "-j", "RETURN"))
    node.firewall.tables[(NETNS, Family.IPV4)] = Table(
        table.name, table.chains, (*table.rules, extra)
    )
    details = json.loads(node.run("CHECK").stdout)["details"]
    assert "+ -A PROXY_INIT_REDIRECT -p udp -j RETURN" in details


def test_del_succeeds_twice_and_touches_nothing(node: Node) -> None:
    node.run("ADD")
    before = node.nat()
    for _ in range(2):
        assert node.run("DEL") == PluginResult(b"", 0)
    assert node.nat() == before


# ----------------------------------------------------------------------------- STATUS, VERSION


def test_status_without_a_kubeconfig_is_not_ready(node: Node) -> None:
    """STATUS (1.1.0) is CNI error 50 when the kubeconfig cannot be read."""
    node.kube.kubeconfigs = frozenset()
    result = node.run("STATUS", config(version="1.1.0"))
    body = json.loads(result.stdout)
    assert (result.exit_code, body["code"]) == (1, 50)
    assert body["details"].startswith(f"{KUBECONFIG}: stat {KUBECONFIG}")
    assert node.run("STATUS", config(version="1.0.0")).stdout.startswith(b'{\n    "code": 1,')


def test_version_reads_no_config(node: Node) -> None:
    """VERSION answers from the environment alone (the config may be anything)."""
    result = node.run("VERSION", b"not json")
    assert result == PluginResult(VERSION_REPLY, 0)
    assert (STDOUT / "VERSION.stdout").read_bytes() == VERSION_REPLY
