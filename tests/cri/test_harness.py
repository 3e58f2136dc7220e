"""The CRI suite's own machinery, tested with a stand-in linkerd-cni that programs nothing:

- the suite can fail: with a pass-through plugin (hands prevResult on, programs nothing) in
  bin_dir, the meshed-pod check of test_containerd.py reports the missing rules. Runs every
  time the suite runs, so a change that made that check vacuous (the wrong netns, the wrong
  table) fails here;
- a plugin mode (modes.py, the node agent's hook) can run node processes where containerd
  runs and hand environment to every plugin call, and what containerd passes a plugin
  (CNI_ARGS, CNI_NETNS, its environment) is what docs/cri-tests.md says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.cri.cluster import NFT, CriCluster, check_meshed, require_oracles, start_cluster
from tests.cri.modes import PluginMode
from tests.cri.node import NODE_PATH, CriNode, build_pause
from tests.support.artifact import artifact_path
from tests.support.pki import Pki
from tests.support.pods import MESHED
from tests.support.rig import netns_inode

pytestmark = [pytest.mark.netns, pytest.mark.binary]

AGENT_SOCKET = "/var/run/linkerd-cni/agent.sock"  # docs: the agent's default, in the node's /run

# A chained plugin that does nothing: ADD records its environment next to itself and prints
# prevResult (what a chained plugin must return), DEL and CHECK succeed silently.
STAND_IN = f"""#!{sys.executable}
import json, os, sys
conf = json.load(sys.stdin)
command = os.environ.get("CNI_COMMAND")
if command == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0", "supportedVersions": ["0.3.1", "0.4.0", "1.0.0"]}}))
elif command == "ADD":
    seen = os.path.join(os.path.dirname(os.path.realpath(__file__)), "seen")
    with open(os.path.join(seen, os.environ["CNI_CONTAINERID"]), "w") as out:
        json.dump(dict(os.environ), out)
    print(json.dumps(conf.get("prevResult") or {{"cniVersion": conf["cniVersion"]}}))
"""


class ProbeMode:
    """A mode shaped like the agent's: one node process, one variable for the plugins."""

    def __init__(self) -> None:
        self.spawned: subprocess.Popen[bytes] | None = None

    def setup(self, node: CriNode) -> Mapping[str, str]:
        self.spawned = node.spawn([str(build_pause())])
        return {"CNIBOX_AGENT_SOCKET": AGENT_SOCKET}


@pytest.fixture(scope="module")
def probe() -> ProbeMode:
    return ProbeMode()


@pytest.fixture(scope="module")
def stand_in(
    pki: Pki, tmp_path_factory: pytest.TempPathFactory, probe: ProbeMode
) -> Iterator[CriCluster]:
    artifact_path()  # same phase as the suite (make test-binary), so it runs whenever it does
    require_oracles()
    directory = tmp_path_factory.mktemp("stand-in")
    (directory / "seen").mkdir()
    plugin = directory / "linkerd-cni"
    plugin.write_text(STAND_IN)
    plugin.chmod(0o755)
    yield from start_cluster(pki, str(plugin), PluginMode("probe", probe.setup))
    assert probe.spawned is not None
    assert probe.spawned.poll() is not None, "a mode's node process outlived the node"


def test_a_pass_through_plugin_fails_the_meshed_check(stand_in: CriCluster) -> None:
    with pytest.raises(AssertionError, match="the rules differ from upstream's") as failed:
        check_meshed(stand_in, NFT)
    report = str(failed.value)
    assert "-:PROXY_INIT_REDIRECT - [0:0]" in report
    assert '--comment "proxy-init/redirect-all-incoming-to-proxy-port"' in report
    stand_in.end_all()
    assert stand_in.leaks() == []


def test_mode_processes_and_what_containerd_passes_a_plugin(
    stand_in: CriCluster, probe: ProbeMode
) -> None:
    """The mode's process runs in the node's netns and mount namespace; a plugin sees the
    mode's variable, the node's PATH and nothing of the test process; containerd's CNI_ARGS
    carry the pod's identity and the sandbox id, CNI_NETNS the netns it reports."""
    node = stand_in.node
    assert probe.spawned is not None
    assert probe.spawned.poll() is None
    pid = probe.spawned.pid
    assert netns_inode(f"/proc/{pid}/ns/net") == netns_inode(node.netns.path)
    assert node.keeper is not None
    assert os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink(f"/proc/{node.keeper.pid}/ns/mnt")

    stand_in.use(stand_in.chained())
    ref = stand_in.ref(MESHED)
    sandbox = stand_in.start(ref)
    seen = Path(node.plugin).parent / "seen" / sandbox.id
    env = json.loads(seen.read_text())
    assert env["CNIBOX_AGENT_SOCKET"] == AGENT_SOCKET
    # containerd 1.6 prepends its opt plugin's bin dir and appends /opt/nri/bin
    assert f":{NODE_PATH}:" in f":{env['PATH']}:", env["PATH"]
    assert "CI" not in env
    assert "CNIBOX" not in env
    assert env["CNI_NETNS"] == sandbox.netns
    assert env["CNI_IFNAME"] == "eth0"
    # in no fixed order: containerd hands them to go-cni as a Go map
    assert sorted(env["CNI_ARGS"].split(";")) == sorted(
        [
            "IgnoreUnknown=1",
            f"K8S_POD_NAMESPACE={ref.namespace}",
            f"K8S_POD_NAME={ref.name}",
            f"K8S_POD_INFRA_CONTAINER_ID={sandbox.id}",
            f"K8S_POD_UID={ref.uid}",
        ]
    )
    stand_in.end(sandbox.id)
