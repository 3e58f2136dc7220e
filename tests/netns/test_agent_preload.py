"""A node agent's parent imports, before it forks workers, everything a request imports
(agent/warm.py `Warmth.preload`): a legacy request always runs in a fresh fork of the parent
(single-use workers), so a module left to be imported on first use was imported again for
every legacy ADD (PyYAML's loader and its regexes, datetime, the caller's judgement, the
record: ~10 ms of each, found with py-spy). In a fresh interpreter: preload, then what a
worker runs for a meshed legacy ADD (the kubeconfig read, the API GETs through the warm
client, the caller's files, the firewall under the caller's lock, the record's module);
nothing new may be imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, require_root
from tests.support.kubeapi import KubeApi
from tests.support.libcni import CHART_LINKERD
from tests.support.pki import Pki
from tests.support.pods import MESHED
from tests.support.rig import Rig

pytestmark = pytest.mark.netns

SCRIPT = r"""
import io, json, sys
from multicall.agent.warm import Warmth
warmth = Warmth()
warmth.preload()
before = set(sys.modules)
from multicall.effects.caller import OWN_FILES
from multicall.effects.firewall.locks import XtablesLock
from multicall.plugin.ports import PluginDeps, RealFirewall, RealKube
from multicall.plugin.recording import RecordingFirewall
from multicall.plugin.run import PluginRequest, run_plugin
from multicall.agent.authority import caller_authority
from multicall.agent.keeper import note_request
env, stdin = json.loads(sys.argv[1]), sys.argv[2].encode()
lock = XtablesLock(env=env, files=OWN_FILES)
firewall = RecordingFirewall(RealFirewall(lock, single_use=warmth.single_use()))
kube = RealKube(OWN_FILES, warm=warmth.connections)
out = run_plugin(PluginRequest(env=env, stdin=stdin, stderr=io.BytesIO()),
                 PluginDeps(kube, firewall, OWN_FILES))
assert out.exit_code == 0, out.stdout
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_legacy_request_imports_nothing_the_parent_did_not(
    rig: Rig, pki: Pki, tmp_path: Path
) -> None:
    require_root()
    api = KubeApi(pki)
    node = rig.node()
    api.add_pod(MESHED)
    api.start(node.path)
    try:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        pod = rig.pod().netns
        meta = MESHED["metadata"]
        env = {
            "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "cbxpre", "CNI_NETNS": pod.path,
            "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
            "CNI_ARGS": f"K8S_POD_NAMESPACE={meta['namespace']};K8S_POD_NAME={meta['name']}",
        }  # fmt: skip
        stdin = json.dumps({
            "cniVersion": "1.0.0", "name": "cbxnet", "type": "linkerd-cni",
            "kubernetes": {"kubeconfig": str(kubeconfig)},
            "linkerd": {**CHART_LINKERD, "iptables-mode": "legacy"},
            "prevResult": {"cniVersion": "1.0.0", "ips": [{"address": "10.89.0.7/24"}]},
        })  # fmt: skip
        done = subprocess.run(
            ["ip", "netns", "exec", node.name, sys.executable, "-c", SCRIPT, json.dumps(env),
             stdin],
            capture_output=True, text=True, timeout=60, check=False,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.splitlines()[-1]) == []
    finally:
        api.stop()
