"""linkerd-cni through the real libcni: Debian's bridge/ptp + host-local first, linkerd-cni
chained last, a TLS Kubernetes API serving upstream's injected pod manifests, iptables-save
as the oracle inside the pod netns, and real TCP connections as the proof of redirection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import cnibox_argv, require_tool
from tests.support.kubeapi import KubeApi, refused_port, service_doc
from tests.support.libcni import (
    TCP_PROBE,
    Runtime,
    build_driver,
    conflist,
    plugin_dir,
    primary_plugin,
)
from tests.support.oracles import SAVE, proxy_init_lines, save_text
from tests.support.pki import Pki
from tests.support.pods import MESHED, NOT_INJECTED, NS, WITH_INIT, renamed
from tests.support.rig import Netns, Rig
from tests.support.scenarios import fixture_text

pytestmark = pytest.mark.netns


@pytest.fixture(scope="session")
def driver() -> Path:
    require_tool("iptables-nft-save")
    require_tool("iptables-legacy-save")
    return build_driver()


@dataclass
class Cluster:
    """One node netns with libcni, a Kubernetes API inside it, and the pods of a test."""

    rig: Rig
    node: Netns
    api: KubeApi
    runtime: Runtime
    tmp: Path
    kubeconfig: Path
    primary: str = "bridge"
    made: list[str] = field(default_factory=list)

    def conf(self, **kwargs: Any) -> dict[str, Any]:
        plugin = primary_plugin(self.primary, self.tmp / "ipam", "10.89.0.0/24", "cbxbr0")
        kubeconfig = kwargs.pop("kubeconfig", self.kubeconfig)
        return conflist(plugin, kubeconfig, **kwargs)

    def pod_netns(self) -> Netns:
        return self.rig.pod().netns

    def cni(
        self,
        command: str,
        netns: Netns,
        pod: dict[str, Any] | None,
        *,
        conf: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        container_id: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        identity = None if pod is None else (pod["metadata"]["namespace"], pod["metadata"]["name"])
        return self.runtime.run(
            command,
            conf or self.conf(),
            netns.path,
            container_id=container_id or f"c{netns.name}",
            pod=identity,
            env=env,
        )

    def plugin(
        self, command: str, netns: Netns, pod: dict[str, Any], prev: dict[str, Any]
    ) -> subprocess.CompletedProcess[bytes]:
        """linkerd-cni alone, as libcni calls a chained plugin (prevResult in its config)."""
        entry = {**self.conf()["plugins"][1], "cniVersion": prev["cniVersion"], "name": "cbxnet"}
        meta = pod["metadata"]
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": f"c{netns.name}",
            "CNI_NETNS": netns.path,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": str(self.runtime.plugins),
            "CNI_ARGS": f"K8S_POD_NAMESPACE={meta['namespace']};K8S_POD_NAME={meta['name']}",
            "PATH": os.environ.get("PATH", ""),
        }
        stdin = json.dumps({**entry, "prevResult": prev}).encode()
        return subprocess.run(
            ["ip", "netns", "exec", self.node.name, *cnibox_argv("linkerd-cni")],
            input=stdin, env=env, capture_output=True, timeout=60, check=False,
        )  # fmt: skip

    def add(self, netns: Netns, pod: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
        proc = self.cni("add", netns, pod, **kw)
        assert proc.returncode == 0, proc.stderr
        result: dict[str, Any] = json.loads(proc.stdout)
        return result


@pytest.fixture
def cluster(rig: Rig, tmp_path: Path, pki: Pki, driver: Path) -> Iterator[Cluster]:
    node = rig.node()
    api = KubeApi(pki)
    for pod in (MESHED, WITH_INIT, NOT_INJECTED):
        api.add_pod(pod)
    api.start(node.path)
    (tmp_path / "cache").mkdir()
    runtime = Runtime(driver, node.name, plugin_dir(tmp_path / "bin"), tmp_path / "cache")
    kubeconfig = api.kubeconfig(tmp_path / "ZZZ-linkerd-cni-kubeconfig")
    try:
        yield Cluster(rig, node, api, runtime, tmp_path, kubeconfig)
    finally:
        api.stop()


def pod_ip(result: dict[str, Any]) -> str:
    address: str = result["ips"][0]["address"]
    return address.split("/", maxsplit=1)[0]


# ----------------------------------------------------------------------------- ADD


@pytest.mark.parametrize(
    ("mode", "golden"),
    [("legacy", "default-legacy"), ("nft", "default-nft"), ("plain", "default-nft")],
)
def test_add_meshed_pod_programs_upstream_rules(cluster: Cluster, mode: str, golden: str) -> None:
    """ADD through libcni leaves exactly upstream's nat table (Debian's iptables-save)."""
    netns = cluster.pod_netns()
    proc = cluster.cni("add", netns, MESHED, conf=cluster.conf(linkerd={"iptables-mode": mode}))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["cniVersion"] == "1.0.0"
    assert result["ips"][0]["address"].startswith("10.89.0.")
    assert save_text(netns, SAVE[mode]) == fixture_text(golden), proc.stderr


def test_add_with_ptp_primary(cluster: Cluster) -> None:
    """The same rules when ptp, not bridge, is the primary plugin."""
    cluster.primary = "ptp"
    netns = cluster.pod_netns()
    result = cluster.add(netns, MESHED)
    assert any(i.get("sandbox") == netns.path for i in result["interfaces"])
    assert save_text(netns, "iptables-nft-save") == fixture_text("default-nft")


@pytest.mark.parametrize(
    ("pod", "why"),
    [(WITH_INIT, "linkerd-init"), (NOT_INJECTED, "no linkerd-proxy"), (None, "no K8S args")],
)
def test_pods_that_get_no_rules(cluster: Cluster, pod: dict[str, Any] | None, why: str) -> None:
    """Pods with linkerd-init, without a proxy, or without pod identity keep an empty nat."""
    netns = cluster.pod_netns()
    result = cluster.add(netns, pod)
    assert result["ips"], why
    assert proxy_init_lines(netns) == [], why


def test_add_twice_then_check_then_del_twice(cluster: Cluster) -> None:
    """ADD is idempotent, CHECK passes after it, DEL succeeds twice."""
    netns = cluster.pod_netns()
    result = cluster.add(netns, MESHED)
    first = save_text(netns, "iptables-nft-save")
    again = cluster.plugin("ADD", netns, MESHED, result)
    assert again.returncode == 0, again.stderr
    # passed through unchanged (v1.3.0 types drop an empty dns; the driver's 1.1.2 keeps it)
    assert json.loads(again.stdout) == {k: v for k, v in result.items() if v != {}}
    assert save_text(netns, "iptables-nft-save") == first
    check = cluster.cni("check", netns, MESHED)
    assert check.returncode == 0, check.stderr
    for _ in range(2):
        proc = cluster.cni("del", netns, MESHED)
        assert proc.returncode == 0, proc.stderr


def test_check_reports_a_deleted_rule(cluster: Cluster) -> None:
    """CHECK after someone deleted a rule fails with a readable diff naming that rule."""
    netns = cluster.pod_netns()
    cluster.add(netns, MESHED)
    netns.exec(["iptables-nft", "-t", "nat", "-D", "PROXY_INIT_OUTPUT", "2"])
    check = cluster.cni("check", netns, MESHED)
    assert check.returncode == 1
    assert "differ from the expected ones" in check.stderr
    assert (
        '- -A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN'
        in check.stderr
    )


def test_del_after_netns_is_gone(cluster: Cluster) -> None:
    """DEL succeeds (twice) when the pod's netns no longer exists."""
    netns = cluster.pod_netns()
    cluster.add(netns, MESHED)
    cluster.rig.remove(netns)
    for _ in range(2):
        proc = cluster.cni("del", netns, MESHED)
        assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------------- Kubernetes API


def test_namespace_annotation_and_single_namespace_get(cluster: Cluster) -> None:
    """An annotation found only on the namespace applies; the namespace is read once."""
    cluster.api.add_namespace(NS, {"config.linkerd.io/skip-outbound-ports": "5432"})
    netns = cluster.pod_netns()
    cluster.add(netns, MESHED)
    rules = save_text(netns, "iptables-nft-save")
    assert '--dports 5432 -m comment --comment "proxy-init/ignore-port-5432" -j RETURN' in rules
    assert cluster.api.requests.count(f"/api/v1/namespaces/{NS}") == 1


def test_control_plane_pod_skips_api_server_ports(cluster: Cluster) -> None:
    """A control-plane pod gets the kubernetes service's port and targetPort skipped."""
    cluster.api.services[("default", "kubernetes")] = service_doc(
        [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]
    )
    pod = renamed(MESHED, "destination-0")
    pod["metadata"]["labels"] = {"linkerd.io/control-plane-component": "destination"}
    cluster.api.add_pod(pod)
    netns = cluster.pod_netns()
    cluster.add(netns, pod)
    assert '--dports 443,6443 -m comment --comment "proxy-init/ignore-port-443,6443"' in save_text(
        netns, "iptables-nft-save"
    )


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        ("unauthorized", "Unauthorized"),
        ("not-found", 'pods "ghost" not found'),
        ("status-500", "Internal error occurred: etcdserver: request timed out"),
        ("refused", "connect: connection refused"),
        ("hang", "Client.Timeout exceeded while awaiting headers"),
    ],
)
def test_api_failures_fail_add_and_program_nothing(
    cluster: Cluster, failure: str, message: str
) -> None:
    """Every API failure is a CNI error within the timeout, and the pod gets no rules."""
    pod = MESHED
    conf = cluster.conf()
    if failure == "unauthorized":
        conf = cluster.conf(kubeconfig=cluster.api.kubeconfig(cluster.tmp / "kc", token="wrong"))
    elif failure == "not-found":
        pod = renamed(MESHED, "ghost")
    elif failure == "status-500":
        cluster.api.mode = "status"
    elif failure == "refused":
        port = refused_port(cluster.node.path)
        conf = cluster.conf(kubeconfig=cluster.api.kubeconfig(cluster.tmp / "kc", port=port))
    elif failure == "hang":
        cluster.api.mode = "hang"
    netns = cluster.pod_netns()
    started = time.monotonic()
    proc = cluster.cni("add", netns, pod, conf=conf, env={"CNIBOX_KUBE_TIMEOUT": "1"})
    elapsed = time.monotonic() - started
    assert proc.returncode == 1
    assert message in proc.stderr
    assert elapsed < 20
    assert proxy_init_lines(netns) == []


def test_silent_api_server_times_out(cluster: Cluster, pki: Pki) -> None:
    """A server that accepts TCP but never speaks TLS costs one timeout, not a hang."""
    silent = KubeApi(pki, mode="silent")
    silent.start(cluster.node.path)
    try:
        conf = cluster.conf(kubeconfig=silent.kubeconfig(cluster.tmp / "kc"))
        netns = cluster.pod_netns()
        started = time.monotonic()
        proc = cluster.cni("add", netns, MESHED, conf=conf, env={"CNIBOX_KUBE_TIMEOUT": "1"})
        assert proc.returncode == 1
        assert "net/http: TLS handshake timeout" in proc.stderr
        assert time.monotonic() - started < 20
    finally:
        silent.stop()


# ----------------------------------------------------------------------------- traffic


@dataclass
class Listener:
    proc: subprocess.Popen[str]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.communicate()  # reaps it and closes its pipes


def listen(netns: Netns, *ports: int) -> Listener:
    proc = netns.popen([sys.executable, str(TCP_PROBE), "listen", *map(str, ports)])
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
    return Listener(proc)


def connect(netns: Netns, host: str, port: int, uid: int | None = None) -> str:
    argv = [sys.executable, str(TCP_PROBE), "connect", host, str(port)]
    if uid is not None:
        argv.append(str(uid))
    return netns.exec(argv, check=False).strip()


@pytest.mark.parametrize("mode", ["legacy", "nft"])
def test_traffic_is_redirected_to_the_proxy_ports(cluster: Cluster, mode: str) -> None:
    """Inbound lands on 4143, outbound of other uids on 4140, the proxy's uid and skipped
    ports are not redirected."""
    meshed_ns, other_ns = cluster.pod_netns(), cluster.pod_netns()
    conf = cluster.conf(linkerd={"outbound-ports-to-ignore": ["5432"], "iptables-mode": mode})
    meshed_ip = pod_ip(cluster.add(meshed_ns, MESHED, conf=conf))
    other_ip = pod_ip(cluster.add(other_ns, None))
    in_meshed = listen(meshed_ns, 4143, 4140, 4191, 8080)
    in_other = listen(other_ns, 9999, 5432)
    try:
        assert connect(other_ns, meshed_ip, 8080) == "4143"  # inbound app port -> proxy
        assert connect(other_ns, meshed_ip, 4191) == "4191"  # skipped inbound port
        assert connect(meshed_ns, other_ip, 9999, uid=1000) == "4140"  # app's outbound
        assert connect(meshed_ns, other_ip, 9999, uid=2102) == "9999"  # the proxy's own
        assert connect(meshed_ns, other_ip, 5432, uid=1000) == "5432"  # skipped outbound port
    finally:
        in_meshed.stop()
        in_other.stop()


# ----------------------------------------------------------------------------- more ADD/CHECK


def test_ipv6_enabled_programs_both_families(cluster: Cluster) -> None:
    """`ipv6: true` programs ip6tables too (upstream's IPv6 table, ip6tables-nft-save)."""
    netns = cluster.pod_netns()
    cluster.add(netns, MESHED, conf=cluster.conf(linkerd={"ipv6": True}))
    assert save_text(netns, "iptables-nft-save") == fixture_text("default-nft")
    assert save_text(netns, "ip6tables-nft-save") == fixture_text("default-ipv6-nft")
    check = cluster.cni("check", netns, MESHED, conf=cluster.conf(linkerd={"ipv6": True}))
    assert check.returncode == 0, check.stderr


def test_simulate_programs_nothing(cluster: Cluster) -> None:
    """`simulate: true` logs upstream's commands and changes nothing."""
    netns = cluster.pod_netns()
    proc = cluster.cni("add", netns, MESHED, conf=cluster.conf(linkerd={"simulate": True}))
    assert proc.returncode == 0, proc.stderr
    assert "PROXY_INIT_REDIRECT" in proc.stderr
    assert proxy_init_lines(netns) == []


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0"])
def test_older_conflist_versions(cluster: Cluster, version: str) -> None:
    """libcni hands 0.3.x/0.4.0 results through the chain; the rules are the same."""
    netns = cluster.pod_netns()
    result = cluster.add(netns, MESHED, conf=cluster.conf(version=version))
    assert result["cniVersion"] == version
    assert save_text(netns, "iptables-nft-save") == fixture_text("default-nft")


def test_check_passes_for_pods_without_rules(cluster: Cluster) -> None:
    """CHECK of a pod that gets no rules succeeds (nothing of ours to verify)."""
    netns = cluster.pod_netns()
    cluster.add(netns, NOT_INJECTED)
    check = cluster.cni("check", netns, NOT_INJECTED)
    assert check.returncode == 0, check.stderr


def test_check_legacy_reports_a_foreign_rule(cluster: Cluster) -> None:
    """CHECK in legacy mode names a rule someone appended to our chain."""
    conf = cluster.conf(linkerd={"iptables-mode": "legacy"})
    netns = cluster.pod_netns()
    cluster.add(netns, MESHED, conf=conf)
    netns.exec(["iptables-legacy", "-t", "nat", "-A", "PROXY_INIT_REDIRECT", "-p", "udp",
                "-j", "RETURN"])  # fmt: skip
    check = cluster.cni("check", netns, MESHED, conf=conf)
    assert check.returncode == 1
    assert "+ -A PROXY_INIT_REDIRECT -p udp -j RETURN" in check.stderr


def test_invalid_annotation_fails_add_and_programs_nothing(cluster: Cluster) -> None:
    """A proxy-uid annotation Go's Atoi rejects fails ADD with Go's text."""
    pod = renamed(MESHED, "bad-uid", **{"config.linkerd.io/proxy-uid": "21O2"})
    cluster.api.add_pod(pod)
    netns = cluster.pod_netns()
    proc = cluster.cni("add", netns, pod)
    assert proc.returncode == 1
    assert 'strconv.Atoi: parsing "21O2": invalid syntax' in proc.stderr
    assert proxy_init_lines(netns) == []


def test_pod_annotations_override_config(cluster: Cluster) -> None:
    """Pod annotations: skip-inbound appends to the config's list, skip-outbound replaces it."""
    annotations = {
        "config.linkerd.io/skip-inbound-ports": "7777,8888",
        "config.linkerd.io/skip-outbound-ports": "9999",
    }
    pod = renamed(MESHED, "annotated", **annotations)
    cluster.api.add_pod(pod)
    netns = cluster.pod_netns()
    cluster.add(netns, pod, conf=cluster.conf(linkerd={"outbound-ports-to-ignore": ["25"]}))
    rules = save_text(netns, "iptables-nft-save")
    assert "--dports 4191,4190,7777,8888 " in rules
    assert "--dports 9999 " in rules
    assert "--dports 25 " not in rules


def test_dual_stack_skip_subnets_go_to_their_own_family(cluster: Cluster) -> None:
    """IPv4 and IPv6 CIDRs in skip-subnets with `ipv6: true`: each family's rules hold only
    its own (linkerd2-proxy-init#696); upstream fails ADD at ip6tables
    (``host/network `10.0.0.0' not found``). CHECK passes after that ADD."""
    conf = cluster.conf(linkerd={"ipv6": True, "subnets-to-ignore": ["10.0.0.0/8", "fd00::/8"]})
    netns = cluster.pod_netns()
    cluster.add(netns, MESHED, conf=conf)
    ipv4 = netns.exec(["iptables-nft-save", "-t", "nat"])
    ipv6 = netns.exec(["ip6tables-nft-save", "-t", "nat"])
    assert "-s 10.0.0.0/8 " in ipv4
    assert "fd00::/8" not in ipv4
    assert "-s fd00::/8 " in ipv6
    assert "10.0.0.0/8" not in ipv6
    check = cluster.cni("check", netns, MESHED, conf=conf)
    assert check.returncode == 0, check.stderr


def test_check_after_add_over_an_uncommented_jump(cluster: Cluster) -> None:
    """A netns whose PREROUTING already jumps to PROXY_INIT_REDIRECT without upstream's
    comment: ADD adds no second jump, and CHECK passes (issue 27 item 10)."""
    netns = cluster.pod_netns()
    netns.exec(["iptables-nft", "-t", "nat", "-N", "PROXY_INIT_REDIRECT"])
    netns.exec(["iptables-nft", "-t", "nat", "-A", "PREROUTING", "-j", "PROXY_INIT_REDIRECT"])
    cluster.add(netns, MESHED)
    rules = netns.exec(["iptables-nft-save", "-t", "nat"])
    assert rules.count("-A PREROUTING") == 1
    check = cluster.cni("check", netns, MESHED)
    assert check.returncode == 0, check.stderr
