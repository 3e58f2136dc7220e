"""Fixtures of the CRI suite: a one-node cluster per test module and plugin mode (modes.py:
the plugin alone, and with a node agent serving it).

The suite runs the built single file (`CNIBOX=dist/cnibox`, as `make test-binary` sets it):
without CNIBOX it skips, even under CI, like tests/binary, because `make test` always runs it
in that step. Root, containerd, runc and the oracles are required (a skip under CI fails).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cri.cluster import CriCluster, require_oracles, start_cluster
from tests.cri.modes import MODES
from tests.support.artifact import artifact_path
from tests.support.pki import Pki


@pytest.fixture(scope="module", params=MODES, ids=lambda mode: mode.name)
def cluster(request: pytest.FixtureRequest, pki: Pki) -> Iterator[CriCluster]:
    plugin = str(artifact_path())
    require_oracles()
    yield from start_cluster(pki, plugin, request.param)


@pytest.fixture(autouse=True)
def nothing_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the cluster: the API behaves again, the pods a test left are
    ended as kubelet would, and then nothing of any pod may remain on the node. In the agent
    mode, the agent answered every linkerd-cni ADD of the test and handed none back."""
    if "cluster" not in request.fixturenames:
        yield
        return
    cluster: CriCluster = request.getfixturevalue("cluster")
    before, adds, ok = cluster.agent_served(), cluster.linkerd_adds, cluster.linkerd_ok
    yield
    cluster.restore_api()
    cluster.end_all()
    assert cluster.leaks() == []
    cluster.assert_served_by_agent(before, adds, ok)
