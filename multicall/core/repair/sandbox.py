"""Finding a pod's sandbox network namespace from what the container runtime already wrote, as
pure functions over file contents (the repair controller's `--repair-in-place`; the files are
read by effects/pod_sandbox.py).

libcni caches every successful ADD in `<cacheDir>/results/<network>-<containerID>-<ifName>`
(containerd and CRI-O keep libcni's default, /var/lib/cni): `kind: cniCacheV1`, the runtime's
CNI_ARGS (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID`), the network name, and the
result, whose interface in the sandbox carries the netns path (`sandbox`; libcni >= 1.2 also
writes `netns`). That is the runtime's own record of which netns it gave which pod.

Rules of this module: an entry counts for a pod only if namespace, name and (when the runtime
passed it) UID match and one of the result's IPs is one of the pod's `status.podIPs`;
anything else, or two different netns for one pod, means "not found", never a guess.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from multicall.core.installer.conflist import is_linkerd

CACHE_KIND = "cniCacheV1"
MAX_CACHE_FILE = 1024 * 1024
CNI_PATH = "/opt/cni/bin"  # required by skel for ADD; linkerd-cni execs no other plugin


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """libcni's cached ADD of one sandbox (its results/ file)."""

    container_id: str
    network: str
    ifname: str
    netns: str
    args: Mapping[str, str]
    ips: tuple[str, ...]


def parse_cache_entry(data: bytes) -> CacheEntry | None:
    """A libcni result-cache file, or None when it is not one (or has no sandbox netns)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") != CACHE_KIND:
        return None
    args: dict[str, str] = {}
    for pair in doc.get("cniArgs") or []:
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair):
            args[pair[0]] = pair[1]
    result = doc.get("result")
    result = result if isinstance(result, dict) else {}
    netns = doc.get("netns") if isinstance(doc.get("netns"), str) else ""
    interfaces = result.get("interfaces")
    for iface in interfaces if isinstance(interfaces, list) else []:
        if isinstance(iface, dict) and isinstance(iface.get("sandbox"), str) and not netns:
            netns = iface["sandbox"]
    ips = []
    entries = result.get("ips")
    for ip in entries if isinstance(entries, list) else []:
        address = ip.get("address") if isinstance(ip, dict) else None
        if isinstance(address, str) and address:
            ips.append(address.split("/", 1)[0])
    if not netns:
        return None
    return CacheEntry(
        container_id=str(doc.get("containerId", "")),
        network=str(doc.get("networkName", "")),
        ifname=str(doc.get("ifName", "")),
        netns=netns,
        args=args,
        ips=tuple(ips),
    )


def pod_ips(pod: Mapping[str, object]) -> tuple[str, ...]:
    status = pod.get("status")
    status = status if isinstance(status, Mapping) else {}
    ips = []
    listed = status.get("podIPs")
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("ip"), str):
            ips.append(entry["ip"])
    single = status.get("podIP")
    if isinstance(single, str) and single and single not in ips:
        ips.append(single)
    return tuple(_canonical(ip) for ip in ips)


def _canonical(ip: str) -> str:
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return ip


def entry_matches(
    entry: CacheEntry, namespace: str, name: str, uid: str, ips: Sequence[str]
) -> bool:
    args = entry.args
    if args.get("K8S_POD_NAMESPACE") != namespace or args.get("K8S_POD_NAME") != name:
        return False
    if "K8S_POD_UID" in args and args["K8S_POD_UID"] != uid:
        return False
    return bool({_canonical(ip) for ip in entry.ips} & set(ips))


def choose_sandbox(matches: Iterable[CacheEntry]) -> CacheEntry | str:
    """The one matching entry (one per network attachment is fine if they share a netns),
    else why not."""
    found = list(matches)
    if not found:
        return "no CNI result cache entry names this pod with its IP"
    if len({entry.netns for entry in found}) > 1:
        return "the CNI result cache names more than one network namespace for this pod"
    return found[0]


def plugin_env(entry: CacheEntry, netns: str, command: str) -> dict[str, str]:
    """The CNI_* environment the runtime gave the plugin for this sandbox, for `command`: the
    cached container, interface and CNI_ARGS (pairs that could not be passed back unchanged
    are left out), with the netns path as this process sees it."""
    pairs = [
        f"{key}={value}"
        for key, value in entry.args.items()
        if not any(c in key + value for c in ";=") and key
    ]
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": entry.container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": entry.ifname,
        "CNI_ARGS": ";".join(pairs),
        "CNI_PATH": CNI_PATH,
    }


def linkerd_plugin_config(conflist: bytes, network: str) -> bytes | None:
    """The linkerd-cni entry of the network list named `network`, as libcni hands it to the
    plugin (the list's name and cniVersion injected), or None when the list has none."""
    try:
        doc = json.loads(conflist)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("name") != network:
        return None
    plugins = doc.get("plugins")
    for plugin in plugins if isinstance(plugins, list) else []:
        if isinstance(plugin, dict) and is_linkerd(plugin):
            entry = {**plugin, "name": network, "cniVersion": doc.get("cniVersion", "")}
            return json.dumps(entry).encode()
    return None


def local_addresses(fib_trie: str, if_inet6: str) -> set[str]:
    """The addresses a netns owns: /proc/net/fib_trie's `/32 host LOCAL` entries (IPv4) and
    /proc/net/if_inet6 (IPv6), read from inside that netns."""
    found: set[str] = set()
    last = ""
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith(("|--", "+--")):
            last = text[3:].strip().split("/")[0].strip()
        elif text.startswith("/32 host LOCAL") and last:
            found.add(last)
    for line in if_inet6.splitlines():
        parts = line.split()
        if parts and len(parts[0]) == 32:
            try:
                found.add(str(ipaddress.IPv6Address(bytes.fromhex(parts[0]))))
            except ValueError:
                continue
    return found
