"""`make demo`: a local pod-network scenario, step by step, in throwaway namespaces.

Run as root with `python -m tests.demo`. Today it builds a node netns with a bridge and a
pod netns on it, then works in the pod through a symlink named `nsenter` pointing to cnibox
(what a Talos node gets instead of util-linux): it lists the pod's addresses, reads its
/proc/net/dev, and does Linkerd's own call, `nsenter --net=<pod> -- iptables-nft-save -t nat`.
Everything is removed at the end, also on failure.

Extending it: write a `def step_x(demo: Demo) -> None` that prints what it shows and add it
to `STEPS` in the order it should run. `Demo` carries the shared state; add fields to it.
Which cnibox runs: $CNIBOX if set, else dist/cnibox if built, else the venv's console script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.rig import Pod, Rig

BRIDGE = "cni0"
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Demo:
    rig: Rig
    workdir: Path
    cnibox: Path
    links: Path = field(init=False)
    node_pod: Pod | None = None

    def __post_init__(self) -> None:
        self.links = self.workdir / "bin"
        self.links.mkdir()

    @property
    def pod(self) -> Pod:
        assert self.node_pod is not None, "step_pod_network must run first"
        return self.node_pod

    def nsenter(self, *args: str) -> str:
        """Run the `nsenter` link (cnibox) and return its stdout; fail loudly otherwise."""
        argv = [str(self.links / "nsenter"), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"demo: {' '.join(argv)} exited {proc.returncode}: {proc.stderr}")
        return proc.stdout


def find_cnibox() -> Path:
    for candidate in (os.environ.get("CNIBOX"), REPO_ROOT / "dist" / "cnibox"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return Path(sys.executable).parent / "cnibox"


def say(title: str, body: str = "") -> None:
    print(f"\n==> {title}")
    if body:
        print("\n".join(f"    {line}" for line in body.rstrip("\n").splitlines()))


def step_links(demo: Demo) -> None:
    """Install cnibox's applet links, as the node installer will on a Talos host."""
    proc = subprocess.run(
        [str(demo.cnibox), "--install", "-s", str(demo.links)],
        capture_output=True,
        text=True,
        check=True,
    )
    say(f"cnibox --install -s {demo.links}  (cnibox = {demo.cnibox})", proc.stdout)


def step_pod_network(demo: Demo) -> None:
    """A node netns with a bridge, and a pod netns with eth0 on it (the rig's throwaways)."""
    node = demo.rig.node(bridge=BRIDGE)
    demo.node_pod = demo.rig.pod(node, bridge=BRIDGE)
    say(
        "node and pod network namespaces",
        f"node: {node.path} (bridge {BRIDGE})\n"
        f"pod:  {demo.pod.netns.path} (eth0 {demo.pod.address})",
    )


def step_pod_addresses(demo: Demo) -> None:
    out = demo.nsenter(f"--net={demo.pod.netns.path}", "--", "ip", "-brief", "addr")
    say(f"nsenter --net={demo.pod.netns.path} -- ip -brief addr", out)


def step_pod_proc_net_dev(demo: Demo) -> None:
    out = demo.nsenter(f"--net={demo.pod.netns.path}", "cat", "/proc/net/dev")
    say(f"nsenter --net={demo.pod.netns.path} cat /proc/net/dev", out)


def step_linkerd_call(demo: Demo) -> None:
    """Upstream Linkerd's exact call, after a rule is put in the pod with iptables-nft."""
    pod = demo.pod.netns
    pod.exec(["iptables-nft", "-t", "nat", "-N", "PROXY_INIT_REDIRECT"])
    pod.exec(["iptables-nft", "-t", "nat", "-A", "PREROUTING", "-j", "PROXY_INIT_REDIRECT"])
    out = demo.nsenter(f"--net={pod.path}", "--", "iptables-nft-save", "-t", "nat")
    say(f"nsenter --net={pod.path} -- iptables-nft-save -t nat", out)


STEPS: list[Callable[[Demo], None]] = [
    step_links,
    step_pod_network,
    step_pod_addresses,
    step_pod_proc_net_dev,
    step_linkerd_call,
]


def main() -> int:
    if os.geteuid() != 0:
        print("demo: needs root (network namespaces)", file=sys.stderr)
        return 1
    rig = Rig()
    try:
        with tempfile.TemporaryDirectory(prefix="cnibox-demo-") as tmp:
            demo = Demo(rig, Path(tmp), find_cnibox())
            for step in STEPS:
                step(demo)
    finally:
        names = [ns.name for ns in rig.made]
        rig.cleanup()
        say("cleaned up", "removed netns " + " ".join(names) if names else "nothing to remove")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
