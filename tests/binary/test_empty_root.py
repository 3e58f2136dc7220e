"""The single file in an empty root: only the binary, applet symlinks, /tmp, /proc and the netns
directory, under chroot in a private mount namespace, with several environments.

The root is mounted read-only; its /tmp is the one writable place, so this is also the test
of "read-only root with only a writable cache dir" through the default root list.

Adding an applet: add `def case_<applet>(root, rig, env) -> None` doing the applet's real job
inside the root (see `case_netns_exec`) and list it in APPLET_CASES. The binary runs in the
chroot only through `root.run([...])` (or `root.started`); the netns directory is at
/var/run/netns inside it. `test_every_applet_has_a_case` fails until each registered applet
has one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from multicall.applets import APPLETS, all_names
from tests.support import require_root, require_tool
from tests.support.empty_root import ENVIRONMENTS, TIMEOUT, EmptyRoot, install_cni_once, make_root
from tests.support.kubeapi import KubeApi
from tests.support.libcni import conflist, primary_plugin
from tests.support.oracles import SAVE, save_text
from tests.support.pki import make_pki
from tests.support.pods import MESHED
from tests.support.rig import NETNS_DIR, Netns, Rig, netns_inode
from tests.support.scenarios import fixture_text

pytestmark = [pytest.mark.binary, pytest.mark.netns]


@pytest.fixture
def root(artifact: Path, tmp_path: Path) -> EmptyRoot:
    require_root()
    for tool in ("unshare", "chroot", "mount"):
        require_tool(tool)
    os.makedirs(NETNS_DIR, exist_ok=True)  # a fresh machine has none before `ip netns add`
    return make_root(tmp_path, artifact)


@pytest.fixture(params=sorted(ENVIRONMENTS))
def env(request: pytest.FixtureRequest) -> dict[str, str]:
    return ENVIRONMENTS[request.param]


def contents(root: EmptyRoot) -> list[str]:
    return sorted(p.name for p in root.path.iterdir())


def test_root_is_empty_but_for_the_binary(root: EmptyRoot) -> None:
    assert contents(root) == sorted(["cnibox", "proc", "tmp", "var", *all_names()])


def test_list(root: EmptyRoot, env: dict[str, str]) -> None:
    result = root.run(["/cnibox", "--list"], env)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.split() == all_names()
    assert [p.name for p in root.tmp.iterdir()] == ["cnibox"], "unpacked into /tmp/cnibox"


def test_no_writable_place_is_a_clear_127(root: EmptyRoot) -> None:
    root.writable_tmp = False
    result = root.run(["/cnibox", "--list"], {})
    assert result.returncode == 127
    assert result.stderr.startswith("cnibox: no writable, exec-allowed directory")
    for place in ("/run/cnibox", "/var/lib/cnibox", "/tmp/cnibox"):
        assert place in result.stderr


def test_cnibox_cache_in_a_read_only_root(root: EmptyRoot) -> None:
    root.writable_tmp = False
    cache = root.path / "cache"
    cache.mkdir()
    # A writable cache inside the otherwise read-only root: bind it over itself before the
    # root is remounted read-only.
    script = root.script(["/cnibox", "--list"])
    script[-1] = script[-1].replace(
        "mount -o remount,bind,ro", f"mount --bind '{cache}' '{cache}'\nmount -o remount,bind,ro"
    )
    result = subprocess.run(
        script,
        env={"CNIBOX_CACHE": "/cache"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.split() == all_names()
    assert len(list(cache.iterdir())) == 1


def test_maps_only_files_from_the_root(root: EmptyRoot) -> None:
    require_tool("nsenter")
    with root.started(["/cnibox", "selftest", "signal"], {}) as proc:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline().split()[1])
        maps = subprocess.run(
            ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "cat", f"/proc/{pid}/maps"],
            capture_output=True,
            text=True,
            check=True,
            timeout=TIMEOUT,
        ).stdout
        os.kill(pid, signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT) == 42
    files = {line.split(maxsplit=5)[5] for line in maps.splitlines() if len(line.split()) == 6}
    files = {f for f in files if f.startswith("/")}
    outside = sorted(f for f in files if not f.startswith(f"{root.path}/tmp/cnibox/"))
    assert outside == []
    names = {os.path.basename(f) for f in files}
    assert {"cnibox.bin", "libc.so.6", "ld-linux-x86-64.so.2"} <= names


# ---- applet cases ----------------------------------------------------------------------


def case_netns_exec(root: EmptyRoot, rig: Rig, env: dict[str, str]) -> None:
    """netns-exec (and nsenter) enters a netns: the program it runs lives in that netns."""
    ns = rig.netns()
    for name in ("netns-exec", "nsenter"):
        argv = [f"/{name}", f"--net={ns.path}", "/cnibox", "selftest", "signal"]
        with root.started(argv, env) as proc:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("ready "), f"{name}: no output"
            pid = int(line.split()[1])
            assert netns_inode(f"/proc/{pid}/ns/net") == netns_inode(ns.path), name
            os.kill(pid, signal.SIGTERM)
            assert proc.wait(timeout=TIMEOUT) == 42


def cni_env(pod_netns: str, pod: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    meta = pod["metadata"]
    return {
        **env,
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "cbx-empty-root",
        "CNI_NETNS": pod_netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/",
        "CNI_ARGS": f"K8S_POD_NAMESPACE={meta['namespace']};K8S_POD_NAME={meta['name']}",
    }


def plugin_add(root: EmptyRoot, rig: Rig, env: dict[str, str], mode: str) -> tuple[Netns, Path]:
    """ADD of the meshed pod by /linkerd-cni inside the root, entered into the node netns by
    /netns-exec, against a test API server; returns the pod netns and the config file."""
    pki = make_pki(root.tmp / "pki")
    node, pod_ns = rig.node(), rig.netns("p")
    api = KubeApi(pki)
    api.add_pod(MESHED)
    api.start(node.path)
    try:
        api.kubeconfig(root.tmp / "kubeconfig")
        plugin = conflist(
            primary_plugin("bridge", Path("/tmp/ipam"), "10.89.0.0/24", "cbxbr0"),
            "/tmp/kubeconfig",
            linkerd={"iptables-mode": mode},
        )["plugins"][1]
        config = root.tmp / "netconf.json"
        config.write_text(json.dumps({**plugin, "cniVersion": "1.0.0", "name": "cbxnet"}))
        prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.89.0.7/24"}]}
        stdin = json.dumps({**plugin, "cniVersion": "1.0.0", "name": "cbxnet", "prevResult": prev})
        argv = ["/netns-exec", f"--net={node.path}", "/linkerd-cni"]
        result = root.run(argv, cni_env(pod_ns.path, MESHED, env), input_=stdin)
    finally:
        api.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ips"] == prev["ips"]
    return pod_ns, config


def case_linkerd_cni(root: EmptyRoot, rig: Rig, env: dict[str, str]) -> None:
    """ADD programs upstream's nat table, through libiptc (legacy) and netlink (nft)."""
    for mode, golden in (("legacy", "default-legacy"), ("nft", "default-nft")):
        pod_ns, _config = plugin_add(root, rig, env, mode)
        assert save_text(pod_ns, SAVE[mode]) == fixture_text(golden), mode


def case_iptables_verify(root: EmptyRoot, rig: Rig, env: dict[str, str]) -> None:
    """The verifier dumps a pod netns itself (both kernel interfaces) and finds the rules."""
    for mode in ("legacy", "nft"):
        pod_ns, _config = plugin_add(root, rig, env, mode)
        (root.tmp / "pod.json").write_text(json.dumps(MESHED))
        argv = ["/iptables-verify", "--config", "/tmp/netconf.json", "--pod", "/tmp/pod.json",
                "--netns", pod_ns.path, "--mode", mode]  # fmt: skip
        result = root.run(argv, env)
        assert result.returncode == 0, result.stdout + result.stderr
        pod_ns.exec(["iptables-legacy" if mode == "legacy" else "iptables-nft",
                     "-t", "nat", "-F", "PROXY_INIT_OUTPUT"])  # fmt: skip
        broken = root.run(argv, env)
        assert broken.returncode == 1, mode
        assert "PROXY_INIT_OUTPUT" in broken.stdout, broken.stdout


def case_install_cni(root: EmptyRoot, rig: Rig, env: dict[str, str]) -> None:
    """--once copies the binary it runs from (CNIBOX_EXE: the single file), links linkerd-cni,
    writes the kubeconfig and patches the network config, all inside the root."""
    install_cni_once(root, env)


def case_linkerd_cni_agent(root: EmptyRoot, rig: Rig, env: dict[str, str]) -> None:
    """The agent runs from the root (its own filesystem: nothing but the binary) and serves
    the root's plugin: the kubeconfig /tmp/kubeconfig resolves through the caller's root
    descriptor, not the agent's, and both modes program upstream's table."""
    from tests.support.agent import AgentProcess

    socket_dir = root.tmp / "agent"
    agent = AgentProcess(socket_dir / "agent.sock", argv=root.script(["/cnibox"]), env=env)
    agent.argv = root.script(["/cnibox", "agent", "--socket", "/tmp/agent/agent.sock",
                              "--admin-addr", "127.0.0.1:0", "--log-level", "debug"])  # fmt: skip
    with agent:
        for mode, golden in (("legacy", "default-legacy"), ("nft", "default-nft")):
            served = agent.served("ADD")
            pod_ns, _config = plugin_add(
                root, rig, {**env, "CNIBOX_AGENT_SOCKET": "/tmp/agent/agent.sock"}, mode
            )
            assert save_text(pod_ns, SAVE[mode]) == fixture_text(golden), mode
            assert agent.served("ADD") == served + 1, "".join(agent.log)


def case_linkerd_cni_repair_controller(root: EmptyRoot, rig: Rig, env: dict[str, str]) -> None:
    """In the node netns, against the list/watch stand-in: the pod whose validator exited 95
    is deleted and its Event published, /live answers, SIGTERM exits 0."""
    import sys
    import time

    from tests.support.kubewatch import WatchApi, pod_doc

    node = rig.node()
    api = WatchApi(make_pki(root.tmp / "pki"))
    api.apply(pod_doc("failed-web", node="node-e"))
    api.apply(pod_doc("healthy-web", 0, node="node-e"))
    api.start(node.path)
    try:
        (root.tmp / "kubeconfig").write_text(api.kubeconfig_text())
        argv = [
            "/netns-exec",
            f"--net={node.path}",
            "/linkerd-cni-repair-controller",
            "--node-name",
            "node-e",
            "--controller-pod-name",
            "linkerd-cni-root",
            "--kubeconfig",
            "/tmp/kubeconfig",
            "--admin-addr",
            "127.0.0.1:9990",
        ]
        with root.started(argv, env) as proc:
            deadline = time.monotonic() + TIMEOUT
            while not api.events and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
            assert api.events, f"no Event; controller exited {proc.poll()}"
            probe = (
                "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9990/live').read())"
            )
            assert node.exec([sys.executable, "-c", probe]).strip() == "b'alive\\n'"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        api.stop()
    assert [path.rsplit("/", 1)[-1] for path in api.deletes()] == ["failed-web"]
    assert api.events[0]["reason"] == "LinkerdCNINotConfigured"


APPLET_CASES: dict[str, Callable[[EmptyRoot, Rig, dict[str, str]], None]] = {
    "netns-exec": case_netns_exec,
    "linkerd-cni-agent": case_linkerd_cni_agent,
    "linkerd-cni": case_linkerd_cni,
    "iptables-verify": case_iptables_verify,
    "install-cni": case_install_cni,
    "linkerd-cni-repair-controller": case_linkerd_cni_repair_controller,
}


def test_every_applet_has_a_case() -> None:
    missing = sorted({applet.name for applet in APPLETS} - set(APPLET_CASES))
    assert missing == [], "add an empty-root case for each applet (see this module's doc)"


@pytest.mark.parametrize("applet", sorted(APPLET_CASES))
def test_applet_does_its_job(root: EmptyRoot, rig: Rig, env: dict[str, str], applet: str) -> None:
    APPLET_CASES[applet](root, rig, env)
