"""Finding a running pod's sandbox on this node from what the container runtime already wrote,
for the repair controller's `--repair-in-place` (plugin/in_place.py programs it).

How the netns is found (core/repair/sandbox.py): the runtime's libcni result cache names, for
each sandbox, the pod (CNI_ARGS), the network and the sandbox netns path; the entry must agree
with the pod's namespace, name, UID and IP. The netns is then opened once, must not be this
process's own, and must hold one of the pod's IPs; the caller programs it through that fd, so
a sandbox replaced in between is never the one changed.

What the plugin gets: the linkerd-cni entry of the node's current network list of that name
(the entry that was missing when the pod started). If it is still missing, the chain is still
incomplete and nothing is done. Any refusal is `Refused` with the reason.

Privileges (docs/repair-controller.md): read the node's /var/lib/cni and CNI config dir, open
the netns files under /var/run/netns (CAP_SYS_ADMIN to setns into them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from multicall.core.repair import sandbox

MAX_CONFIG_FILE = 1024 * 1024


class Refused(Exception):
    """Why a pod is not repaired in place (it will be deleted instead)."""


@dataclass(frozen=True, slots=True)
class Sandbox:
    """A pod's sandbox as the runtime set it up."""

    entry: sandbox.CacheEntry  # the runtime's cached ADD for the pod
    netns: str  # its netns path as seen from this process (under the host root)
    plugin_config: bytes  # the linkerd-cni entry of the network list, as libcni hands it over


@dataclass(frozen=True, slots=True)
class SandboxFinder:
    """Finds a pod's sandbox in the node's CNI directories."""

    net_dir: str  # the node's CNI config dir
    cache_dir: str  # libcni's cache dir (results/ inside)
    host_root: str  # where the node's / is mounted ("" when this is the node's /)

    def find(self, namespace: str, name: str, uid: str, ips: tuple[str, ...]) -> Sandbox:
        """The pod's sandbox and the plugin config for its network, or Refused."""
        entry = sandbox.choose_sandbox(self._cache_entries(namespace, name, uid, ips))
        if isinstance(entry, str):
            raise Refused(entry)
        return Sandbox(entry, self.host_path(entry.netns), self.plugin_config(entry.network))

    def _cache_entries(
        self, namespace: str, name: str, uid: str, ips: tuple[str, ...]
    ) -> list[sandbox.CacheEntry]:
        results = os.path.join(self.cache_dir, "results")
        try:
            names = sorted(os.listdir(results))
        except OSError as exc:
            raise Refused(f"cannot read the CNI result cache {results}: {exc.strerror}") from None
        found = []
        for filename in names:
            data = _read_small(os.path.join(results, filename))
            entry = sandbox.parse_cache_entry(data) if data is not None else None
            if entry is not None and sandbox.entry_matches(entry, namespace, name, uid, ips):
                found.append(entry)
        return found

    def host_path(self, path: str) -> str:
        """A netns path as the runtime wrote it, seen through the node's root mount."""
        if not path.startswith("/") or "/../" in path + "/" or "\x00" in path:
            raise Refused(f"the CNI result cache names an unusable netns path {path!r}")
        root = self.host_root.rstrip("/")
        candidates = [root + path]
        if path.startswith("/run/"):
            candidates.append(root + "/var" + path)  # /var/run -> /run on the node
        for candidate in candidates:
            if os.path.exists(candidate):
                return candidate
        raise Refused(f"the sandbox network namespace {path} no longer exists")

    def netns_dir_visible(self, path: str) -> bool:
        """Whether the directory a netns path is in is there as this process sees it: a
        netns missing from a visible directory is gone; from an invisible one (a mount
        missing from the agent's pod) nothing can be said."""
        root = self.host_root.rstrip("/")
        directory = os.path.dirname(path)
        candidates = [root + directory]
        if directory.startswith("/run/") or directory == "/run":
            candidates.append(root + "/var" + directory)
        return any(os.path.isdir(candidate) for candidate in candidates)

    def plugin_config(self, network: str) -> bytes:
        from multicall.core.installer.conflist import is_cni_config_name

        try:
            names = sorted(os.listdir(self.net_dir))
        except OSError as exc:
            raise Refused(f"cannot read {self.net_dir}: {exc.strerror}") from None
        for filename in names:
            if not is_cni_config_name(filename):
                continue
            data = _read_small(os.path.join(self.net_dir, filename))
            plugin = sandbox.linkerd_plugin_config(data, network) if data is not None else None
            if plugin is not None:
                return plugin
        raise Refused(
            f"no network list named {network!r} in {self.net_dir} has a linkerd-cni "
            "entry yet (the CNI chain is still incomplete)"
        )


@contextmanager
def opened_sandbox(netns: str, ips: tuple[str, ...]) -> Iterator[int]:
    """An fd on the sandbox netns (closed on exit), once it is known not to be this thread's
    own netns and to hold one of the pod's `ips`; else Refused."""
    from multicall.effects.ns import NetnsRef, entered_netns, is_own_netns, open_netns

    fd = open_netns(netns)
    try:
        ref = NetnsRef(netns, fd=fd)
        if is_own_netns(ref):
            raise Refused(f"{netns} is the controller's own network namespace")
        with entered_netns(ref):
            owned = sandbox.local_addresses(
                _read_text("/proc/thread-self/net/fib_trie"),
                _read_text("/proc/thread-self/net/if_inet6"),
            )
        if not owned & set(ips):
            raise Refused(f"{netns} does not hold the pod's IP {', '.join(ips)}")
        yield fd
    finally:
        os.close(fd)


def _read_small(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_FILE + 1)
    except OSError:
        return None
    return data if len(data) <= MAX_CONFIG_FILE else None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(4 * MAX_CONFIG_FILE)
    except OSError:
        return ""
