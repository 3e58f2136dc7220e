"""How linkerd-cni runs on the CRI suite's node: every case runs once per mode in MODES.

A mode's `setup(node)` runs when the node's netns, mount namespace and cgroup exist and before
containerd starts. It may start node-level processes with `node.spawn(argv)` (they run where
containerd runs and are killed with the node) and returns environment for containerd, which
libcni passes on to every plugin it runs.

- `direct`: the plugin alone, as upstream runs it.
- `agent`: the node agent (issue 11, docs/agent.md) started from the same file as
  `cnibox agent --socket SOCKET` where containerd runs (the node's netns: as the chart's
  hostNetwork DaemonSet or the Talos extension service sees the node), and containerd told
  `CNIBOX_AGENT_SOCKET=SOCKET`. The node's /run is its own tmpfs, so the socket is private to
  the node. `served(node)` reads what the agent counted, so that every case can check that the
  agent served its sandboxes (tests/cri/conftest.py) instead of passing on the fallback.
The cases stay as they are; a case that must differ by mode reads `cluster.mode.name`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tests.cri.node import CriNode
from tests.support import agent

AGENT_SOCKET = "/run/linkerd-cni/agent.sock"  # on the node's own /run
AGENT_ADMIN_PORT = 9991  # in the node's own netns: no other node or test shares it
AGENT_START = 60.0  # seconds: the first start unpacks the payload


@dataclass(frozen=True)
class Served:
    """What a node agent counted: ADDs answered (any result), ADDs that succeeded, and
    requests it handed back to the one-shot path."""

    adds: int
    ok: int
    fallbacks: int


@dataclass(frozen=True)
class PluginMode:
    name: str
    setup: Callable[[CriNode], Mapping[str, str]]
    served: Callable[[CriNode], Served] | None = None  # None: no agent in this mode


def _direct(node: CriNode) -> Mapping[str, str]:
    return {}


def _agent(node: CriNode) -> Mapping[str, str]:
    argv = [node.plugin, "agent", "--socket", AGENT_SOCKET,
            "--admin-addr", f"127.0.0.1:{AGENT_ADMIN_PORT}"]  # fmt: skip
    proc = node.spawn(argv)
    deadline = time.monotonic() + AGENT_START
    while not node.inside(AGENT_SOCKET).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the node agent did not start:\n{node.log_text()[-2000:]}")
        time.sleep(0.05)
    return {"CNIBOX_AGENT_SOCKET": AGENT_SOCKET}


def _agent_served(node: CriNode) -> Served:
    metrics = agent.scrape(AGENT_ADMIN_PORT, node.netns.path)
    return Served(agent.answered(metrics), agent.served(metrics), agent.fallbacks(metrics))


DIRECT = PluginMode("direct", _direct)
AGENT = PluginMode("agent", _agent, _agent_served)
MODES: tuple[PluginMode, ...] = (DIRECT, AGENT)
