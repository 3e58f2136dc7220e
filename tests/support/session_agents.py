"""The node agents of an agent-mode session (`CNIBOX_TEST_AGENT`, tests/conftest.py): every
plugin call of the session goes through one, as on a node that runs the agent.

The value says which agent a node runs, by the capabilities it is given (issue 24: "through
the agent, with the chart's capabilities for each iptables mode: every existing suite
passes"):

- `1`, the Talos extension's service: every capability, in the host's pid namespace. One
  agent in the test's own netns serves the whole session (its workers enter a caller's netns
  when it is another: the caller is seen, so it may).
- `chart`, the chart's DaemonSet as rendered by default for every iptables mode: NET_ADMIN
  and SYS_ADMIN (the keeper is on by default), and `chart-nft`, nft with the keeper off:
  NET_ADMIN alone. Such an agent cannot see its callers (the DaemonSet has no hostPID; here,
  a launcher holding more capabilities than the agent hides its /proc/PID/ns/user), so it
  never enters a netns for them: it must share their network, as the DaemonSet's
  hostNetwork shares the runtime's. So one runs in the test's own netns and one in each node
  netns a test makes (`Rig.node`), started with it and stopped before it is removed;
  `CNIBOX_AGENT_SOCKET` names the newest node's agent while it lives. nft is served there;
  legacy and `plain` are handed back (`caller not verified…`) and run one-shot, by design
  (docs/agent.md "Who may use the agent").

At the end the session's totals over every agent are checked by the caller (conftest).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.agent import CHART_CAPS, AgentProcess
from tests.support.rig import Netns

# CNIBOX_TEST_AGENT's values: the agent's capabilities (a setpriv prefix) and extra flags.
MODES: dict[str, tuple[list[str], list[str]]] = {
    "1": (CHART_CAPS["all (the Talos service)"], []),
    "chart": (CHART_CAPS["chart default: NET_ADMIN, SYS_ADMIN"], []),
    "chart-nft": (CHART_CAPS["chart, nft, keeper off: NET_ADMIN"], ["--keeper", "off"]),
}

# Why a chart agent may hand a request back in these suites, and nothing else (the reasons
# as /metrics counts them): it cannot verify callers, so it never enters a netns for them
# (legacy and plain; a caller on another network than any agent's, a test calling from a
# netns it made itself, is the same case); and a request the agent's admission refuses to
# read (a test's deliberately over-long or malformed one), which the one-shot run must
# answer with upstream's error.
CHART_HANDED_BACK = frozenset({"caller not verified", "bad request"})


@dataclass
class SessionAgents:
    mode: str
    binary: str
    run_dir: Path
    session: AgentProcess | None = None
    nodes: dict[str, AgentProcess] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)
    started: int = 0

    @property
    def per_node(self) -> bool:
        return self.mode != "1"

    def _agent(self, name: str, netns: str | None) -> AgentProcess:
        caps, extra = MODES[self.mode]
        self.started += 1
        return AgentProcess(
            self.run_dir / f"{name}.{self.started}" / "agent.sock",
            argv=[self.binary],
            preexec=caps or None,
            extra=extra,
            netns=netns,
        ).start()

    def start(self) -> SessionAgents:
        self.session = self._agent("session", None)
        os.environ["CNIBOX_AGENT_SOCKET"] = self.session.socket
        return self

    def node_added(self, node: Netns) -> None:
        """A test made a node netns: with a chart agent, the node gets its own."""
        if self.per_node:
            agent = self._agent(node.name, node.path)
            self.nodes[node.name] = agent
            os.environ["CNIBOX_AGENT_SOCKET"] = agent.socket

    def node_removed(self, node: Netns) -> None:
        agent = self.nodes.pop(node.name, None)
        if agent is None:
            return
        self._stop(agent)
        newest = list(self.nodes.values())[-1] if self.nodes else self.session
        assert newest is not None
        os.environ["CNIBOX_AGENT_SOCKET"] = newest.socket

    def _stop(self, agent: AgentProcess) -> None:
        for sample, value in agent.metrics().items():
            self.totals[sample] = self.totals.get(sample, 0.0) + value
        code = agent.stop()
        assert code == 0, f"agent exited {code}: {''.join(agent.log[-20:])}"

    def stop(self) -> dict[str, float]:
        """Stop every agent; the sum of their /metrics samples."""
        for name in list(self.nodes):
            self._stop(self.nodes.pop(name))
        if self.session is not None:
            self._stop(self.session)
            self.session = None
        return self.totals
