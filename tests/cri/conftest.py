"""Fixtures of the CRI suite: a one-node cluster per test module and plugin mode.

The suite runs the built single file (`CNIBOX=dist/cnibox`, as `make test-binary` sets it):
without CNIBOX it skips, even under CI, like tests/binary, because `make test` always runs it
in that step. Root, containerd, runc and the oracles are required (a skip under CI fails).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require_root, require_tool
from tests.cri.cluster import CriCluster
from tests.cri.modes import MODES, PluginMode
from tests.cri.node import CriNode
from tests.kubeapi import KubeApi, Pki
from tests.netns.test_linkerd_cni import MESHED, NOT_INJECTED, WITH_INIT
from tests.rig import Rig


def built_plugin() -> str:
    binary = os.environ.get("CNIBOX")
    if not binary:
        pytest.skip("CNIBOX is not set: the CRI suite runs against the built file in "
                    "`make test-binary` (or `make test-cri`)")  # fmt: skip
    path = Path(binary).resolve()
    if not path.is_file():
        pytest.fail(f"CNIBOX={binary}: no such file")
    return str(path)


def require_oracles() -> None:
    require_root()
    for tool in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save"):
        require_tool(tool)


def start_cluster(pki: Pki, plugin: str, mode: PluginMode) -> Iterator[CriCluster]:
    """A started node with its API stand-in and kubeconfig; removed however the module ends."""
    rig = Rig()
    api = KubeApi(pki)
    for pod in (MESHED, WITH_INIT, NOT_INJECTED):
        api.add_pod(pod)
    try:
        with CriNode(rig, plugin, setup=mode.setup) as node:
            api.start(node.netns.path)
            cluster = CriCluster(node, api, mode)
            cluster.write_kubeconfig()
            yield cluster
    finally:
        api.stop()
        rig.cleanup()


@pytest.fixture(scope="module", params=MODES, ids=lambda mode: mode.name)
def cluster(request: pytest.FixtureRequest, pki: Pki) -> Iterator[CriCluster]:
    plugin = built_plugin()
    require_oracles()
    yield from start_cluster(pki, plugin, request.param)


@pytest.fixture(autouse=True)
def nothing_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the cluster: the API behaves again, the pods a test left are
    ended as kubelet would, and then nothing of any pod may remain on the node."""
    yield
    if "cluster" not in request.fixturenames:
        return
    cluster: CriCluster = request.getfixturevalue("cluster")
    cluster.restore_api()
    cluster.end_all()
    assert cluster.leaks() == []
