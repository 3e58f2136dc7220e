"""How linkerd-cni runs on the CRI suite's node: every case runs once per mode in MODES.

A mode's `setup(node)` runs when the node's netns, mount namespace and cgroup exist and before
containerd starts. It may start node-level processes with `node.spawn(argv)` (they run where
containerd runs and are killed with the node) and returns environment for containerd, which
libcni passes on to every plugin it runs.

Today there is one mode, `direct`: the plugin alone, as upstream runs. The node agent
(issue 11: `cnibox agent --socket PATH`, the plugin using `$CNIBOX_AGENT_SOCKET`) adds an
`agent` mode here: its setup spawns `[node.plugin, "agent", "--socket", SOCKET]` (the node's
/run is its own tmpfs, so the default /var/run/linkerd-cni/agent.sock is private to the node),
waits for the socket (`node.inside(SOCKET)`) and returns {"CNIBOX_AGENT_SOCKET": SOCKET}.
The cases stay as they are; a case that must differ by mode reads `cluster.mode.name`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tests.cri.node import CriNode


@dataclass(frozen=True)
class PluginMode:
    name: str
    setup: Callable[[CriNode], Mapping[str, str]]


def _direct(node: CriNode) -> Mapping[str, str]:
    return {}


DIRECT = PluginMode("direct", _direct)
MODES: tuple[PluginMode, ...] = (DIRECT,)
