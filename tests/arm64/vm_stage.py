"""The arm64 VM stage's one boot per module (tests/arm64/test_vm.py, test_vm_no_xtables.py):
the stage's preconditions, the API stand-in in QEMU's throwaway netns serving the meshed pod,
and for each iptables mode the plugin's config and ADD input under the guest's /in."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.arm64 import vm
from tests.arm64.artifact import arm64_artifact
from tests.support import require_root, require_tool
from tests.support.kubeapi import KubeApi
from tests.support.libcni import conflist, primary_plugin
from tests.support.pki import make_pki
from tests.support.pods import MESHED
from tests.support.rig import Rig

POD_ADDRESS = "10.89.0.7/24"  # the bridge's first pod address: the ADD's prevResult


def require_vm_stage() -> Path:
    """The arm64 artifact, once every precondition of the VM stage holds (skipped outside
    `make test-arm64`, failed when what it creates is missing)."""
    if not os.environ.get("CNIBOX_ARM64_VM"):
        pytest.skip("the arm64 VM stage runs in `make test-arm64` (CNIBOX_ARM64_VM=1)")
    artifact = arm64_artifact()
    require_root()
    for tool in ("qemu-system-aarch64", "readelf", "nsenter"):
        require_tool(tool)
    if not vm.DEBS.is_dir():
        pytest.fail(f"{vm.DEBS} missing: `make build ARCH=arm64` creates the arm64 root")
    return artifact


@contextmanager
def booted(
    work: Path, modes: Iterable[str], script: str, *, timeout: float,
    modules: tuple[str, ...] = vm.MODULES,
) -> Iterator[vm.Boot]:  # fmt: skip
    """One boot of `script` with `modules`: the guest reaches the API stand-in (serving
    MESHED) at vm.GUEST_HOST through /in/kubeconfig; /in/pod.json is the pod, and for each
    mode /in/netconf-MODE.json the plugin's network config and /in/add-MODE.json its ADD
    input. The stand-in and its netns go afterwards."""
    artifact = require_vm_stage()
    rig = Rig()
    api = KubeApi(make_pki(work / "pki", extra_ips=(vm.GUEST_HOST,)))
    try:
        host = rig.netns("q")
        api.add_pod(MESHED)
        api.start(host.path)
        kubeconfig = api.kubeconfig(work / "kubeconfig").read_text()
        inputs = {
            "kubeconfig": kubeconfig.replace(
                "https://127.0.0.1:", f"https://{vm.GUEST_HOST}:"
            ).encode(),
            "pod.json": json.dumps(MESHED).encode(),
        }
        for mode in modes:
            plugin = conflist(
                primary_plugin("bridge", Path("/tmp/ipam"), "10.89.0.0/24", "cbxbr0"),
                "/in/kubeconfig",
                linkerd={"iptables-mode": mode},
            )["plugins"][1]
            netconf = {**plugin, "cniVersion": "1.0.0", "name": "cbxnet"}
            prev = {"cniVersion": "1.0.0", "ips": [{"address": POD_ADDRESS}]}
            inputs[f"netconf-{mode}.json"] = json.dumps(netconf).encode()
            inputs[f"add-{mode}.json"] = json.dumps({**netconf, "prevResult": prev}).encode()
        yield vm.boot(
            artifact, inputs, script, workdir=work, netns=host.path, timeout=timeout,
            modules=modules,
        )  # fmt: skip
    finally:
        api.stop()
        rig.cleanup()
