"""Throwaway network namespaces for tests: a "node" netns (lo up, optional bridge) and "pod"
netns attached to it by veth pairs.

Rules of this module:
1. Nothing here ever runs a command in the machine's own network namespace: every `ip`
   command is scoped with `-n NAME` or `ip netns exec NAME`, and `assert_not_host` guards
   any path handed to code under test.
2. Names are unique per process and call, so tests may run in parallel.
3. `Rig.cleanup()` removes everything it made, even after failures (used as a fixture).
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

NETNS_DIR = "/var/run/netns"
_counter = itertools.count()


def run(argv: list[str], *, check: bool = True, input_: str | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, input=input_, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{argv} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def unique_name(kind: str) -> str:
    return f"cbx{kind}{os.getpid() % 100000}x{next(_counter)}"


def netns_inode(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def assert_not_host(path: str) -> None:
    """Fail loudly if `path` is the test process's own network namespace."""
    if netns_inode(path) == netns_inode("/proc/self/ns/net"):
        raise AssertionError(f"{path} is the machine's own network namespace")


@dataclass
class Netns:
    name: str

    @property
    def path(self) -> str:
        return f"{NETNS_DIR}/{self.name}"

    def exec(self, argv: list[str], *, check: bool = True, input_: str | None = None) -> str:
        """Run a host tool (an oracle) inside this netns."""
        return run(["ip", "netns", "exec", self.name, *argv], check=check, input_=input_)

    def ip(self, *args: str) -> str:
        return run(["ip", "-n", self.name, *args])

    def popen(self, argv: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


@dataclass
class Pod:
    netns: Netns
    ifname: str
    address: str | None  # "10.88.x.y/24" when the rig assigned one, else None
    host_veth: str


@dataclass
class Rig:
    made: list[Netns] = field(default_factory=list)
    subnet_octet: int = field(default_factory=lambda: 1 + (os.getpid() + next(_counter)) % 250)
    _hosts: itertools.count[int] = field(default_factory=lambda: itertools.count(2))
    # Told of each node netns made and before it is removed: an agent-mode session's
    # per-node agents (tests/support/session_agents.py).
    on_node: Callable[[Netns], None] | None = None
    on_remove: Callable[[Netns], None] | None = None

    def netns(self, kind: str = "ns") -> Netns:
        ns = Netns(unique_name(kind))
        run(["ip", "netns", "add", ns.name])
        self.made.append(ns)
        assert_not_host(ns.path)
        ns.ip("link", "set", "lo", "up")
        return ns

    def node(self, *, bridge: str | None = None) -> Netns:
        """A node netns; with `bridge`, a bridge of that name up with the .1 gateway address."""
        node = self.netns("n")
        if bridge:
            node.ip("link", "add", bridge, "type", "bridge")
            node.ip("addr", "add", f"10.88.{self.subnet_octet}.1/24", "dev", bridge)
            node.ip("link", "set", bridge, "up")
        if self.on_node is not None:
            self.on_node(node)
        return node

    def pod(
        self, node: Netns | None = None, *, bridge: str | None = None, address: bool = True
    ) -> Pod:
        """A pod netns; with a node, an `eth0` veth whose peer sits in the node (on `bridge`)."""
        pod_ns = self.netns("p")
        if node is None:
            return Pod(pod_ns, "", None, "")
        host_veth = unique_name("v")[-15:]
        node.ip(
            "link", "add", host_veth, "type", "veth", "peer", "name", "eth0", "netns", pod_ns.name
        )
        if bridge:
            node.ip("link", "set", host_veth, "master", bridge)
        node.ip("link", "set", host_veth, "up")
        pod_ns.ip("link", "set", "eth0", "up")
        addr = None
        if address and bridge:
            addr = f"10.88.{self.subnet_octet}.{next(self._hosts)}/24"
            pod_ns.ip("addr", "add", addr, "dev", "eth0")
            pod_ns.ip("route", "add", "default", "via", f"10.88.{self.subnet_octet}.1")
        return Pod(pod_ns, "eth0", addr, host_veth)

    def remove(self, ns: Netns) -> None:
        try:
            if self.on_remove is not None:
                self.on_remove(ns)
        finally:
            run(["ip", "netns", "del", ns.name], check=False)
            if ns in self.made:
                self.made.remove(ns)

    def cleanup(self) -> None:
        for ns in reversed(list(self.made)):
            self.remove(ns)
