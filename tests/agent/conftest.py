"""The node agent suites' shared setup (tests/agent/): a node netns with the API stand-in
serving the test pods, and node agents run from source against it (`AgentNode`). Each
suite's fixtures are this one's, named as its tests use them."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, require_root, require_tool
from tests.support.agent import AgentProcess
from tests.support.kubeapi import KubeApi
from tests.support.pki import Pki
from tests.support.pods import MESHED, NOT_INJECTED
from tests.support.rig import Netns, Rig


@dataclass
class AgentNode:
    """A node netns, the API stand-in listening in it, its kubeconfig."""

    rig: Rig
    node: Netns
    api: KubeApi
    kubeconfig: Path
    tmp: Path

    def agent(
        self, socket_dir: str = "run", *, in_node: bool = True, extra: list[str] | None = None
    ) -> AgentProcess:
        """An agent run from source (not started); in the node's netns (hostNetwork, where
        the API is) unless `in_node` is False (then in the test's own)."""
        return AgentProcess(
            self.tmp / socket_dir / "agent.sock",
            argv=[sys.executable, "-m", "multicall"],
            env={"PYTHONPATH": str(REPO)},
            extra=extra,
            netns=self.node.path if in_node else None,
        )

    def net_dir(self, entry: dict[str, Any]) -> Path:
        """The node's CNI config dir with one conflist whose only plugin is `entry` (a
        linkerd-cni network config without its cniVersion, name and prevResult)."""
        net_dir = self.tmp / "net.d"
        net_dir.mkdir(exist_ok=True)
        conflist = {"cniVersion": "1.0.0", "name": "cbxnet", "plugins": [entry]}
        (net_dir / "10-cbxnet.conflist").write_text(json.dumps(conflist))
        return net_dir


@pytest.fixture
def agent_node(tmp_path: Path, pki: Pki) -> Iterator[AgentNode]:
    require_root()
    require_tool("iptables-nft-save")
    rig, api = Rig(), KubeApi(pki)
    try:
        node = rig.node()
        api.add_pod(MESHED)
        api.add_pod(NOT_INJECTED)
        api.start(node.path)
        yield AgentNode(rig, node, api, api.kubeconfig(tmp_path / "kubeconfig"), tmp_path)
    finally:
        api.stop()
        rig.cleanup()


@pytest.fixture
def setup(agent_node: AgentNode) -> Iterator[tuple[Rig, Netns, Path, AgentProcess]]:
    """An agent in the test's own netns (its callers reach the API in the node netns)."""
    with agent_node.agent(in_node=False) as agent:
        yield agent_node.rig, agent_node.node, agent_node.kubeconfig, agent


Near = tuple[Rig, Netns, Path, AgentProcess, KubeApi]


@pytest.fixture
def near(agent_node: AgentNode) -> Iterator[Near]:
    """An agent in the node netns its callers share (hostNetwork), the API server there."""
    with agent_node.agent("near") as agent:
        yield agent_node.rig, agent_node.node, agent_node.kubeconfig, agent, agent_node.api
