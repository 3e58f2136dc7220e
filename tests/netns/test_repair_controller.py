"""linkerd-cni-repair-controller end to end, in throwaway network namespaces: the real libcni
runs the node's CNI chain for "pods" (netns), the validator (tests/support/validator.py, upstream's
behaviour) runs inside them as uid 65534, the test plays the kubelet (it reports the
validator's exit code into the pod's status and tears sandboxes down), and the controller
runs inside the node netns against the list/watch stand-in.

1. The chain is incomplete (no linkerd-cni yet): the pod's validator fails with 95, the
   controller deletes the pod; the chain is fixed, the replacement's ADD programs the rules
   and its validator passes; the controller leaves it alone.
2. --repair-in-place: the controller finds the sandbox through libcni's result cache, runs
   the plugin's ADD there (upstream's exact nat table, with the nft and the legacy backend:
   the legacy one forks a child per table operation from the controller's worker thread),
   the validator's retry passes, and the pod is not deleted.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import cnibox_argv, require_tool
from tests.support.kubewatch import WatchApi, pod_doc
from tests.support.libcni import Runtime, build_driver, conflist, plugin_dir, primary_plugin
from tests.support.oracles import SAVE, save_text
from tests.support.pki import Pki
from tests.support.rig import Netns, Rig
from tests.support.scenarios import fixture_text
from tests.support.waiting import wait_for

pytestmark = pytest.mark.netns

VALIDATOR = Path(__file__).resolve().parents[1] / "support" / "validator.py"
NODE = "node-a"


@pytest.fixture(scope="module")
def driver() -> Path:
    require_tool("iptables-nft-save")
    return build_driver()


@dataclass
class Node:
    rig: Rig
    netns: Netns
    api: WatchApi
    runtime: Runtime
    tmp: Path
    kubeconfig: Path
    controller: subprocess.Popen[bytes] | None = None
    logs: list[str] = field(default_factory=list)
    mode: str = "nft"  # linkerd-cni's iptables-mode

    def chain(self, *, with_linkerd: bool) -> dict[str, Any]:
        primary = primary_plugin("bridge", self.tmp / "ipam", "10.89.0.0/24", "cbxbr0")
        conf = conflist(primary, self.kubeconfig, linkerd={"iptables-mode": self.mode})
        if not with_linkerd:
            conf["plugins"] = conf["plugins"][:1]  # the primary CNI alone: linkerd-cni not yet in
        return conf

    def fix_chain_on_disk(self) -> Path:
        """The node's CNI config dir once install-cni has appended linkerd-cni."""
        net_dir = self.tmp / "net.d"
        net_dir.mkdir(exist_ok=True)
        (net_dir / "10-cbxnet.conflist").write_text(json.dumps(self.chain(with_linkerd=True)))
        return net_dir

    def sandbox(self, name: str, *, with_linkerd: bool) -> tuple[dict[str, Any], Netns]:
        """The scheduler's pod (no status yet) and its sandbox from the runtime's ADD."""
        stored = self.api.apply(pod_doc(name, None, node=NODE))
        netns = self.rig.pod().netns
        proc = self.runtime.run(
            "add", self.chain(with_linkerd=with_linkerd), netns.path,
            container_id=f"c{netns.name}", pod=("app", name),
            pod_uid=stored["metadata"]["uid"],
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        stored["status"] = {"podIP": result["ips"][0]["address"].split("/")[0]}
        return stored, netns

    def run_validator(self, pod: dict[str, Any], netns: Netns) -> int:
        """The init container runs; the kubelet reports its exit code in the pod status."""
        proc = subprocess.run(
            ["ip", "netns", "exec", netns.name, sys.executable, str(VALIDATOR), "4140",
             "1.1.1.1", "20001", "3"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        doc = pod_doc(pod["metadata"]["name"], proc.returncode, node=NODE)
        doc["metadata"]["uid"] = pod["metadata"]["uid"]
        doc["status"]["podIP"] = pod["status"]["podIP"]
        doc["status"]["podIPs"] = [{"ip": pod["status"]["podIP"]}]
        doc["status"]["initContainerStatuses"][0]["lastState"]["terminated"]["finishedAt"] = (
            f"2026-01-01T00:00:{int(time.time()) % 60:02d}Z"
        )
        self.api.apply(doc)
        return proc.returncode

    def teardown(self, pod: dict[str, Any], netns: Netns) -> None:
        """What the kubelet does after the pod is deleted: CNI DEL, sandbox gone."""
        self.runtime.run("del", self.chain(with_linkerd=False), netns.path,
                         container_id=f"c{netns.name}", pod=("app", pod["metadata"]["name"]),
                         pod_uid=pod["metadata"]["uid"])  # fmt: skip
        self.rig.remove(netns)

    def start_controller(self, *extra: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            admin = s.getsockname()[1]
        argv = ["ip", "netns", "exec", self.netns.name,
                *cnibox_argv("linkerd-cni-repair-controller"), "--node-name", NODE,
                "--controller-pod-name", "linkerd-cni-e2e", "--kubeconfig", str(self.kubeconfig),
                "--admin-addr", f"127.0.0.1:{admin}", "--error-delay", "200ms",
                "--log-level", "linkerd_cni_repair_controller=debug,warn", *extra]  # fmt: skip
        self.controller = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.controller is not None
        assert self.controller.stdout is not None
        for raw in self.controller.stdout:
            self.logs.append(raw.decode(errors="replace"))

    def stop_controller(self) -> int:
        assert self.controller is not None
        self.controller.terminate()
        code = self.controller.wait(10)
        assert self.controller.stdout is not None
        time.sleep(0.1)
        self.controller.stdout.close()
        return code

    def deleted(self) -> list[str]:
        return [path.rsplit("/", 1)[-1] for path in self.api.deletes()]


@pytest.fixture
def node(rig: Rig, tmp_path: Path, pki: Pki, driver: Path) -> Iterator[Node]:
    netns = rig.node()
    api = WatchApi(pki)
    api.start(netns.path)
    (tmp_path / "cache").mkdir()
    runtime = Runtime(driver, netns.name, plugin_dir(tmp_path / "bin"), tmp_path / "cache")
    kubeconfig = tmp_path / "ZZZ-linkerd-cni-kubeconfig"
    kubeconfig.write_text(api.kubeconfig_text())
    n = Node(rig, netns, api, runtime, tmp_path, kubeconfig)
    try:
        yield n
    finally:
        if n.controller is not None and n.controller.poll() is None:
            n.stop_controller()
        api.stop()


def nat(netns: Netns, mode: str = "nft") -> str:
    """The pod's nat table; chain counters zeroed (x_tables counts the validator's packets)."""
    return re.sub(r"\[\d+:\d+\]$", "[0:0]", save_text(netns, SAVE[mode]), flags=re.MULTILINE)


UPSTREAM_NAT = fixture_text("default-nft")


def test_failed_pod_is_deleted_and_its_replacement_gets_the_rules(node: Node) -> None:
    node.start_controller()
    broken, broken_ns = node.sandbox("web-7d4f8-a1", with_linkerd=False)
    assert "PROXY_INIT" not in nat(broken_ns)
    assert node.run_validator(broken, broken_ns) == 95  # no redirect: upstream's exit code
    wait_for(lambda: "web-7d4f8-a1" in node.deleted(), "the controller's deletion")
    wait_for(lambda: bool(node.api.events), "its Event")
    event = node.api.events[0]
    assert (event["reason"], event["action"], event["regarding"]["name"]) == (
        "LinkerdCNINotConfigured",
        "Deleting",
        "web-7d4f8-a1",
    )
    node.teardown(broken, broken_ns)
    # install-cni has appended linkerd-cni by now; the ReplicaSet makes a replacement
    fresh, fresh_ns = node.sandbox("web-7d4f8-b2", with_linkerd=True)
    assert nat(fresh_ns) == UPSTREAM_NAT
    assert node.run_validator(fresh, fresh_ns) == 0
    time.sleep(1.0)  # the controller saw the passing pod and left it alone
    assert node.deleted() == ["web-7d4f8-a1"]
    assert node.stop_controller() == 0


@pytest.mark.parametrize("mode", ["nft", "legacy"])
def test_repair_in_place_programs_the_sandbox_and_keeps_the_pod(node: Node, mode: str) -> None:
    if mode == "legacy":
        require_tool("iptables-legacy-save")
    node.mode = mode
    pod, netns = node.sandbox("api-5c9d-x1", with_linkerd=False)
    net_dir = node.fix_chain_on_disk()
    node.start_controller("--repair-in-place", "--cni-net-dir", str(net_dir),
                          "--cni-cache-dir", str(node.tmp / "cache"), "--host-root=")  # fmt: skip
    assert node.run_validator(pod, netns) == 95
    wait_for(lambda: bool(node.api.events), "the repair's Event")
    event = node.api.events[0]
    assert (event["action"], event["regarding"]["name"]) == ("Repairing", "api-5c9d-x1")
    assert nat(netns, mode) == fixture_text(f"default-{mode}")
    assert node.run_validator(pod, netns) == 0  # the kubelet's retry of the init container
    time.sleep(1.0)
    assert node.deleted() == []
    logs = "".join(node.logs)
    assert "Repaired pod in place" in logs
    assert f"nat via {mode}" in logs  # the plugin's own log line, from the seam
    assert node.stop_controller() == 0


def test_repair_in_place_falls_back_to_delete_while_the_chain_is_incomplete(node: Node) -> None:
    pod, netns = node.sandbox("api-5c9d-y2", with_linkerd=False)
    empty = node.tmp / "empty.d"
    empty.mkdir()
    node.start_controller("--repair-in-place", "--cni-net-dir", str(empty),
                          "--cni-cache-dir", str(node.tmp / "cache"), "--host-root=")  # fmt: skip
    assert node.run_validator(pod, netns) == 95
    wait_for(lambda: "api-5c9d-y2" in node.deleted(), "the fallback deletion")
    assert "PROXY_INIT" not in nat(netns)  # nothing was programmed
    assert "the CNI chain is still incomplete" in "".join(node.logs)
