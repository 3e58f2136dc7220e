"""The CRI suite can fail: with a deliberately broken linkerd-cni (a pass-through stand-in that
hands prevResult on and programs nothing) in bin_dir, the meshed-pod check of
test_containerd.py reports the missing rules. Runs every time the suite runs, so a change
that made that check vacuous (reading the wrong netns, comparing the wrong tables) fails."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cri.cluster import NFT, CriCluster, check_meshed
from tests.cri.conftest import built_plugin, require_oracles, start_cluster
from tests.cri.modes import DIRECT
from tests.kubeapi import Pki

pytestmark = [pytest.mark.netns, pytest.mark.binary]

# A chained plugin that does nothing: ADD prints prevResult (what a chained plugin must
# return), DEL and CHECK succeed silently, VERSION answers.
STAND_IN = f"""#!{sys.executable}
import json, os, sys
conf = json.load(sys.stdin)
command = os.environ.get("CNI_COMMAND")
if command == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0", "supportedVersions": ["0.3.1", "0.4.0", "1.0.0"]}}))
elif command == "ADD":
    print(json.dumps(conf.get("prevResult") or {{"cniVersion": conf["cniVersion"]}}))
"""


@pytest.fixture(scope="module")
def stand_in_cluster(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CriCluster]:
    built_plugin()  # same phase as the suite (make test-binary), so it runs whenever it does
    require_oracles()
    plugin = tmp_path_factory.mktemp("stand-in") / "linkerd-cni"
    plugin.write_text(STAND_IN)
    plugin.chmod(0o755)
    yield from start_cluster(pki, str(Path(plugin)), DIRECT)


def test_a_pass_through_plugin_fails_the_meshed_check(stand_in_cluster: CriCluster) -> None:
    with pytest.raises(AssertionError, match="the rules differ from upstream's") as failed:
        check_meshed(stand_in_cluster, NFT)
    report = str(failed.value)
    assert "-:PROXY_INIT_REDIRECT - [0:0]" in report
    assert '--comment "proxy-init/redirect-all-incoming-to-proxy-port"' in report
    stand_in_cluster.end_all()
    assert stand_in_cluster.leaks() == []
