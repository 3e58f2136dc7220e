"""core/repair/sandbox: reading libcni's result cache (as Debian's libcni and libcni >= 1.2
write it), matching it to a pod, the plugin's CNI_* environment for it, the linkerd-cni entry
of a network list, and the addresses a netns owns from /proc/net."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from multicall.core.cni.skel import parse_cni_args
from multicall.core.repair import sandbox
from multicall.plugin.in_place import node_xtables_lock


def cache(
    args: dict[str, str],
    netns: str = "/var/run/netns/cni-1",
    *,
    field: bool = False,
    ips: tuple[str, ...] = ("10.88.0.7/24",),
) -> bytes:
    doc: dict[str, Any] = {
        "kind": "cniCacheV1",
        "containerId": "abc",
        "config": base64.b64encode(b"{}").decode(),
        "ifName": "eth0",
        "networkName": "k8s-pod-network",
        "cniArgs": [[k, v] for k, v in args.items()],
        "result": {
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa"},
                {"name": "eth0", "mac": "bb", "sandbox": "" if field else netns},
            ],
            "ips": [{"address": ip, "interface": 1} for ip in ips],
        },
    }
    if field:
        doc["netns"] = netns
    return json.dumps(doc).encode()


ARGS = {
    "IgnoreUnknown": "1",
    "K8S_POD_NAMESPACE": "ns",
    "K8S_POD_NAME": "web",
    "K8S_POD_INFRA_CONTAINER_ID": "abc",
    "K8S_POD_UID": "uid-1",
}


@pytest.mark.parametrize("field", [False, True])
def test_cache_entry_gives_the_sandbox_netns(field: bool) -> None:
    entry = sandbox.parse_cache_entry(cache(ARGS, field=field))
    assert entry is not None
    assert entry.netns == "/var/run/netns/cni-1"
    assert entry.ips == ("10.88.0.7",)
    assert entry.network == "k8s-pod-network"
    assert sandbox.entry_matches(entry, "ns", "web", "uid-1", ("10.88.0.7",))


@pytest.mark.parametrize(
    ("namespace", "name", "uid", "ips"),
    [
        ("other", "web", "uid-1", ("10.88.0.7",)),
        ("ns", "web2", "uid-1", ("10.88.0.7",)),
        ("ns", "web", "uid-2", ("10.88.0.7",)),
        ("ns", "web", "uid-1", ("10.88.0.8",)),
        ("ns", "web", "uid-1", ()),
    ],
)
def test_any_disagreement_is_no_match(
    namespace: str, name: str, uid: str, ips: tuple[str, ...]
) -> None:
    entry = sandbox.parse_cache_entry(cache(ARGS))
    assert entry is not None
    assert not sandbox.entry_matches(entry, namespace, name, uid, ips)


def test_not_a_cache_entry() -> None:
    for data in (b"", b"junk", b"{}", json.dumps({"kind": "cniCacheV1"}).encode()):
        assert sandbox.parse_cache_entry(data) is None


def test_two_netns_for_one_pod_is_refused() -> None:
    a = sandbox.parse_cache_entry(cache(ARGS, "/var/run/netns/a"))
    b = sandbox.parse_cache_entry(cache(ARGS, "/var/run/netns/b"))
    assert a is not None
    assert b is not None
    assert isinstance(sandbox.choose_sandbox([a, b]), str)
    assert sandbox.choose_sandbox([a, a]) == a
    assert isinstance(sandbox.choose_sandbox([]), str)


def test_plugin_env_is_the_runtimes_call_again() -> None:
    """What skel reads, as the runtime passed it; a pair that would not survive the
    `;`-joined CNI_ARGS is left out, and the netns path is the one seen from here."""
    entry = sandbox.parse_cache_entry(cache({**ARGS, "X": "a;b", "Y=": "c"}))
    assert entry is not None
    env = sandbox.plugin_env(entry, "/host/var/run/netns/cni-1", "ADD")
    assert env == {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "abc",
        "CNI_NETNS": "/host/var/run/netns/cni-1",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web;"
        "K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=uid-1",
        "CNI_PATH": "/opt/cni/bin",
    }
    identity = parse_cni_args(env["CNI_ARGS"])
    assert (identity.namespace, identity.name) == ("ns", "web")


def test_the_node_xtables_lock_is_under_the_host_root() -> None:
    lock = node_xtables_lock("/host/")
    assert lock is not None
    assert lock.lock_path() == "/host/run/xtables.lock"
    assert node_xtables_lock("") is None  # the node's / is ours: as iptables finds it


def test_pod_ips_from_status() -> None:
    pod = {"status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::0001"}]}}
    assert sandbox.pod_ips(pod) == ("10.0.0.1", "fd00::1")


def test_linkerd_plugin_config_as_libcni_hands_it_over() -> None:
    conflist = {
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "plugins": [{"type": "bridge"}, {"type": "linkerd-cni", "linkerd": {"proxy-uid": 2102}}],
    }
    plugin = sandbox.linkerd_plugin_config(json.dumps(conflist).encode(), "k8s-pod-network")
    assert plugin is not None
    assert json.loads(plugin) == {
        "type": "linkerd-cni",
        "linkerd": {"proxy-uid": 2102},
        "name": "k8s-pod-network",
        "cniVersion": "1.0.0",
    }
    assert sandbox.linkerd_plugin_config(json.dumps(conflist).encode(), "other") is None
    conflist["plugins"] = [{"type": "bridge"}]
    assert sandbox.linkerd_plugin_config(json.dumps(conflist).encode(), "k8s-pod-network") is None


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 10.88.0.0/24 2 0 2
        |-- 10.88.0.0
           /24 link UNICAST
        |-- 10.88.0.7
           /32 host LOCAL
        |-- 10.88.0.255
           /32 link BROADCAST
     +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
        |-- 10.88.0.7
           /32 host LOCAL
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
fd000000000000000000000000000007 02 40 00 80     eth0
"""


def test_local_addresses_from_proc_net() -> None:
    assert sandbox.local_addresses(FIB_TRIE, IF_INET6) == {
        "10.88.0.7",
        "127.0.0.1",
        "::1",
        "fd00::7",
    }
