"""The node readiness gate (multicall/gate, docs/node-readiness.md) against the TLS API
stand-in with nodes: the startup taint stays while any one check fails (one test each),
goes within about a second once all pass, and only that taint goes (other taints, a
concurrent writer, 409s retried); the condition follows a broken and repaired chain; the
uninstall leaves the node schedulable; the self-test leaves nothing behind, also when killed.

The gate runs in this process (rounds called directly, or its thread); the self-test execs
the installed `linkerd-cni` link (the source tree's console script) into scratch netns."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from multicall.core.installer.config import parse_environment
from multicall.core.node_gate import CONDITION_TYPE, DEFAULT_TAINT_KEY, parse_gate_env
from multicall.effects.log import Logger
from multicall.gate.run import Gate
from tests.support import cnibox_executable
from tests.support.installer_host import NETWORK_CONFIG
from tests.support.kubeapi import TOKEN, KubeApi
from tests.support.pki import make_pki

pytestmark = pytest.mark.netns

NODE = "node-a"
OURS = {"key": DEFAULT_TAINT_KEY, "effect": "NoSchedule"}
OTHER = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
LINKERD = json.loads(NETWORK_CONFIG.replace('"legacy"', '"nft"'))
BRIDGE = {"type": "bridge", "bridge": "cbx0"}
TAINT_PATCH = f"PATCH /api/v1/nodes/{NODE}"


class Node:
    """A node's CNI dirs, the installer's kubeconfig and a service account, as install-cni
    leaves them (made by hand here: the gate reads them, the installer is tested elsewhere)."""

    def __init__(self, root: Path, api: KubeApi) -> None:
        self.root, self.api = root, api
        self.net_dir, self.bin_dir, self.sa_dir = root / "net.d", root / "bin", root / "sa"
        for d in (self.net_dir, self.bin_dir, self.sa_dir):
            d.mkdir(parents=True)
        (self.sa_dir / "token").write_text(TOKEN + "\n")
        (self.sa_dir / "ca.crt").write_bytes(api.pki.ca_cert.read_bytes())
        self.gates: list[Gate] = []
        self.kubeconfig = self.net_dir / "ZZZ-linkerd-cni-kubeconfig"
        self.conflist = self.net_dir / "10-bridge.conflist"
        self.env = {
            "CONTAINER_MOUNT_PREFIX": "/",
            "DEST_CNI_NET_DIR": str(self.net_dir),
            "DEST_CNI_BIN_DIR": str(self.bin_dir),
            "SERVICE_ACCOUNT_DIR": str(self.sa_dir),
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(api.port),
            "CNI_NETWORK_CONFIG": NETWORK_CONFIG,
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "CNIBOX_GATE": "true",
            "NODE_NAME": NODE,
        }

    def install(self) -> None:
        self.link_plugin()
        self.chain()
        self.api.kubeconfig(self.kubeconfig)

    def link_plugin(self) -> None:
        (self.bin_dir / "linkerd-cni").symlink_to(cnibox_executable())

    def chain(self, *, with_linkerd: bool = True) -> None:
        entry = {**LINKERD, "kubernetes": {"kubeconfig": str(self.kubeconfig)}}
        plugins = [BRIDGE, entry] if with_linkerd else [BRIDGE]
        doc = {"cniVersion": "1.0.0", "name": "cbxnet", "plugins": plugins}
        self.conflist.write_text(json.dumps(doc))

    def gate(self, log: list[str] | None = None, extra: dict[str, str] | None = None) -> Gate:
        full = {**self.env, **(extra or {})}
        gate = Gate(parse_gate_env(full), parse_environment(full), full, _logger(log))
        self.gates.append(gate)
        return gate


class _Lines:
    def __init__(self, sink: list[str]) -> None:
        self.sink = sink

    def write(self, data: bytes) -> int:
        self.sink.append(data.decode())
        return len(data)

    def flush(self) -> None:
        pass


def _logger(sink: list[str] | None) -> Logger:
    return Logger(_Lines(sink if sink is not None else []), "debug", "plain")  # type: ignore[arg-type]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeApi]:
    server = KubeApi(make_pki(tmp_path / "pki"))
    server.add_node(NODE, [OTHER, OURS])
    server.start(None)  # 127.0.0.1 of this netns: the gate runs in this process
    yield server
    server.stop()


@pytest.fixture
def node(tmp_path: Path, api: KubeApi) -> Iterator[Node]:
    made = Node(tmp_path / "node", api)
    yield made
    for gate in made.gates:
        gate.stop()


def taints(api: KubeApi) -> list[dict[str, Any]]:
    return list(api.nodes[NODE]["spec"].get("taints") or [])


def condition(api: KubeApi) -> dict[str, Any] | None:
    found = [c for c in api.nodes[NODE]["status"]["conditions"] if c["type"] == CONDITION_TYPE]
    return found[0] if found else None


def netns_inodes(pids: list[int] | None = None) -> set[str]:
    """Every network namespace a thread of `pids` (default: every process) is in or a
    descriptor holds (the self-test's is held by an fd only), as `net:[inode]`; and memfds
    of the self-test, by name."""
    found = set()
    every = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in every if pids is None else pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        links = [f"/proc/{pid}/task/{t}/ns/net" for t in tasks] + [
            f"/proc/{pid}/fd/{f}" for f in fds
        ]
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:
                continue
            if target.startswith("net:[") or "cnibox-selftest" in target:
                found.add(target)
    return found


# --- one test per check: the taint stays while it fails ------------------------------------


def test_ready_removes_only_our_taint(node: Node, api: KubeApi) -> None:
    node.install()
    gate = node.gate()
    verdict = gate.round()
    assert verdict.ready, verdict.message
    assert taints(api) == [OTHER]
    # issue 25's metrics (install-cni's /metrics): both durations, one self-test passed
    chain_ready, untainted = gate.metrics.chain_ready_seconds, gate.metrics.taint_removed_seconds
    assert chain_ready is not None
    assert untainted is not None
    assert 0 < chain_ready <= untainted < 30
    assert (gate.metrics.ready, gate.metrics.passed, gate.metrics.failed) == (True, 1, 0)
    cond = condition(api)
    assert cond is not None
    assert cond["status"] == "True"
    assert cond["reason"] == "Ready"
    assert [c["type"] for c in api.nodes[NODE]["status"]["conditions"]] == ["Ready", CONDITION_TYPE]


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("no plugin", "PluginInstalledFailed"),
        ("not chained", "ChainConfiguredFailed"),
        ("api refuses", "APIReachableFailed"),
        ("agent down", "AgentServingFailed"),
        ("self-test fails", "SelfTestFailed"),
    ],
)
def test_taint_stays_while_a_check_fails(
    node: Node, api: KubeApi, tmp_path: Path, breakage: str, reason: str
) -> None:
    node.install()
    env: dict[str, str] = {}
    if breakage == "no plugin":
        (node.bin_dir / "linkerd-cni").unlink()
    elif breakage == "not chained":
        node.chain(with_linkerd=False)
    elif breakage == "api refuses":
        api.kubeconfig(node.kubeconfig, token="revoked")
    elif breakage == "agent down":
        env["CNIBOX_GATE_AGENT_SOCKET"] = str(tmp_path / "agent.sock")  # nobody listens
    else:
        (node.bin_dir / "linkerd-cni").unlink()
        broken = node.bin_dir / "broken-plugin"
        broken.write_text('#!/bin/sh\necho \'{"code":999,"msg":"broken on purpose"}\'\nexit 1\n')
        broken.chmod(0o755)
        (node.bin_dir / "linkerd-cni").symlink_to(broken)
    gate = node.gate(extra=env)
    verdict = gate.round()
    assert not verdict.ready
    assert gate.metrics.ready is False
    assert gate.metrics.taint_removed_seconds is None
    assert OURS in taints(api)
    assert OTHER in taints(api)
    cond = condition(api)
    assert cond is not None
    assert cond["status"] == "False"
    assert cond["reason"] == reason
    if breakage == "self-test fails":
        assert "broken on purpose" in cond["message"]
        assert (gate.metrics.passed, gate.metrics.failed) == (0, 1)


def test_agent_accepting_passes(node: Node, api: KubeApi, tmp_path: Path) -> None:
    """A listener that reads a whole request, then sends ACCEPT, as the agent admits callers
    (agent/admission.py); the real agent: tests/agent/test_agent_admission.py."""
    from multicall.core.agent_protocol import HEADER, accept_frame, parse_header

    path = str(tmp_path / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                head = b""
                while len(head) < HEADER.size and (chunk := conn.recv(HEADER.size - len(head))):
                    head += chunk
                left = parse_header(head).body_len
                while left > 0 and (chunk := conn.recv(left)):
                    left -= len(chunk)
                conn.sendall(accept_frame(60.0))

    threading.Thread(target=serve, daemon=True).start()
    try:
        node.install()
        verdict = node.gate(extra={"CNIBOX_GATE_AGENT_SOCKET": path}).round()
        assert verdict.ready, verdict.message
        assert taints(api) == [OTHER]
    finally:
        listener.close()


# --- timing, concurrency ---------------------------------------------------------------------


def test_taint_goes_within_a_second_of_the_chain(node: Node, api: KubeApi) -> None:
    """The gate's thread, the chain written last: the taint goes within 1 s plus the one
    self-test the change sets off (its duration is in the log line)."""
    node.link_plugin()
    api.kubeconfig(node.kubeconfig)
    log: list[str] = []
    gate = node.gate(log)
    gate.start()
    try:
        time.sleep(1.0)
        assert OURS in taints(api)
        node.chain()
        chained = time.monotonic()
        deadline = chained + 30
        while OURS in taints(api) and time.monotonic() < deadline:
            time.sleep(0.02)
        took = time.monotonic() - chained
    finally:
        gate.stop()
    assert taints(api) == [OTHER]
    selftests = [
        float(line.split(" in ")[1].split("s")[0]) for line in log if "self-test passed" in line
    ]
    assert len(selftests) == 1, log
    assert took < 1.0 + selftests[0] + 1.0, (took, selftests)  # generous: a loaded machine
    assert any("chain ready" in line for line in log)
    assert any("removed" in line for line in log)


def test_conflicts_are_retried_and_a_concurrent_writer_kept(node: Node, api: KubeApi) -> None:
    node.install()
    api.conflicts = 2
    added = {"key": "example.com/concurrent", "effect": "NoExecute"}
    writes = {"n": 0}

    def concurrent(server: KubeApi, name: str) -> None:
        # After the two 409s, just before our patch: another controller adds its taint.
        if not server.conflicts and not writes["n"] and server.requests[-1] == TAINT_PATCH:
            writes["n"] += 1
            server.nodes[name]["spec"]["taints"].append(added)
            server.bump(server.nodes[name])

    api.before_patch = concurrent
    assert node.gate().round().ready
    assert taints(api) == [OTHER, added]
    # 409, 409, 422 (the writer's change fails our test op), then the patch that holds
    assert sum(1 for r in api.requests if r == TAINT_PATCH) == 4


def test_condition_follows_a_broken_and_repaired_chain(node: Node, api: KubeApi) -> None:
    node.install()
    gate = node.gate()
    assert gate.round().ready
    first = condition(api)
    assert first is not None
    assert taints(api) == [OTHER]
    node.conflist.write_text(json.dumps({"cniVersion": "1.0.0", "name": "x", "plugins": [BRIDGE]}))
    assert not gate.round().ready  # the primary CNI rewrote its config
    broken = condition(api)
    assert broken is not None
    assert broken["status"] == "False"
    assert broken["reason"] == "ChainConfiguredFailed"
    assert OURS in taints(api)  # reapply (the default)
    node.chain()
    assert gate.round().ready
    fixed = condition(api)
    assert fixed is not None
    assert fixed["status"] == "True"
    assert taints(api) == [OTHER]
    assert fixed["lastTransitionTime"] >= broken["lastTransitionTime"]


def test_no_reapply_leaves_the_taint_off(node: Node, api: KubeApi) -> None:
    node.install()
    gate = node.gate(extra={"CNIBOX_GATE_REAPPLY": "false"})
    assert gate.round().ready
    node.chain(with_linkerd=False)
    assert not gate.round().ready
    assert taints(api) == [OTHER]
    cond = condition(api)
    assert cond is not None
    assert cond["status"] == "False"


def test_uninstall_leaves_the_node_schedulable(node: Node, api: KubeApi) -> None:
    node.chain(with_linkerd=False)
    node.link_plugin()
    api.kubeconfig(node.kubeconfig)
    gate = node.gate()
    assert not gate.round().ready
    assert OURS in taints(api)
    assert condition(api) is not None
    assert gate.uninstall() == []
    assert taints(api) == [OTHER]
    assert condition(api) is None
    assert [c["type"] for c in api.nodes[NODE]["status"]["conditions"]] == ["Ready"]


def test_the_applets_uninstall_clears_the_gate(node: Node, api: KubeApi, tmp_path: Path) -> None:
    """install-cni --uninstall with the gate on: taint and condition gone (the preStop)."""
    node.install()
    node.gate().round()
    api.nodes[NODE]["spec"]["taints"].append(OURS)
    env = {
        **node.env,
        "CNIBOX_EXE": cnibox_executable(),
        "INSTALL_CNI_PID_FILE": str(tmp_path / "pid"),
    }
    argv = [sys.executable, "-m", "multicall", "install-cni", "--uninstall"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert taints(api) == [OTHER]
    assert condition(api) is None


# --- the self-test leaves nothing ------------------------------------------------------------


def test_selftest_leaves_nothing_behind(node: Node, api: KubeApi) -> None:
    node.install()
    own = [os.getpid()]  # others' tests make netns on this machine too
    before_ns, before_files = netns_inodes(own), set(os.listdir(node.root.parent))
    for _ in range(2):
        gate = node.gate()
        assert gate.round().ready
        assert gate.selftest_key is not None  # the self-test did run
    assert netns_inodes(own) <= before_ns
    assert set(os.listdir(node.root.parent)) == before_files
    assert not any(t.name == "gate-selftest-api" for t in threading.enumerate())


KILLED = """
import os, sys, json
from multicall.core.installer.config import parse_environment
from multicall.core.node_gate import parse_gate_env
from multicall.effects.log import Logger
from multicall.gate.run import Gate
env = json.loads(sys.argv[1])
log = Logger(sys.stderr.buffer, "debug", "plain")
gate = Gate(parse_gate_env(env), parse_environment(env), env, log)
gate.round()
"""


def test_selftest_killed_midway_leaves_no_netns(node: Node, api: KubeApi) -> None:
    """SIGKILL the gate while the plugin hangs in its ADD: no netns and no process remain."""
    node.install()
    (node.bin_dir / "linkerd-cni").unlink()
    hang = node.bin_dir / "hanging-plugin"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    (node.bin_dir / "linkerd-cni").symlink_to(hang)
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, json.dumps(node.env)],
        start_new_session=True,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = netns_inodes([proc.pid])  # the interpreter's own netns
        made: set[str] = set()
        plugin: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (made and plugin):
            time.sleep(0.05)
            made = {n for n in netns_inodes([proc.pid]) - base if n.startswith("net:[")}
            plugin = _children(proc.pid)
        assert made, "the self-test never made its netns"
        assert plugin, "the plugin was never exec'd"
        os.kill(proc.pid, signal.SIGKILL)  # the gate only: its hung plugin must follow
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (netns_inodes() & made or _alive(plugin)):
        time.sleep(0.05)
    assert not netns_inodes() & made, "the scratch netns outlived the gate"
    assert not _alive(plugin), "the hung plugin outlived the gate"


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def _alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except OSError:
            continue
    return False
