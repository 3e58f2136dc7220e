"""The node agent run from source (`python -m multicall agent`), driven by the tests' Python
client (tests/support/agent_client.py, the launcher's protocol): the agent's Python half in the
suites without a built file. The launcher's half is tests/agent/test_agent.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from multicall.core import agent_protocol as proto
from multicall.core.agent_protocol import SOURCE_BUILD
from tests.support import REPO, require_root, require_tool
from tests.support.admin_clients import assert_probes_answer_through_hostile_clients
from tests.support.agent import AgentProcess
from tests.support.kubeapi import KubeApi
from tests.support.libcni import CHART_LINKERD
from tests.support.oracles import SAVE, save_text
from tests.support.pki import Pki
from tests.support.pods import MESHED, NOT_INJECTED
from tests.support.rig import Netns, Rig
from tests.support.scenarios import fixture_text

pytestmark = pytest.mark.netns
STAMP = re.compile(r'time="[^"]*"')
PREV = {"cniVersion": "1.0.0", "ips": [{"address": "10.89.0.7/24"}]}


Near = tuple[Rig, Netns, Path, AgentProcess, KubeApi]  # the `near` fixture (conftest.py)


def invoke(
    node: Netns, argv: list[str], env: dict[str, str], stdin: str
) -> tuple[int, str, list[str]]:
    proc = subprocess.run(
        ["ip", "netns", "exec", node.name, *argv],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )
    return proc.returncode, proc.stdout, [STAMP.sub("time=T", x) for x in proc.stderr.splitlines()]


def env_for(pod_ns: Netns, pod: dict[str, Any], command: str = "ADD") -> dict[str, str]:
    meta = pod["metadata"]
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": str(REPO),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "cbxsrc",
        "CNI_NETNS": pod_ns.path,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": f"K8S_POD_NAMESPACE={meta['namespace']};K8S_POD_NAME={meta['name']}",
    }


def conf(kubeconfig: Path, mode: str, **linkerd: Any) -> str:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "cbxnet",
            "type": "linkerd-cni",
            "log_level": "debug",
            "kubernetes": {"kubeconfig": str(kubeconfig)},
            "linkerd": {**CHART_LINKERD, "iptables-mode": mode, **linkerd},
            "prevResult": PREV,
        }
    )


@pytest.mark.parametrize(
    ("mode", "pod", "command"),
    [
        ("nft", MESHED, "ADD"),
        ("legacy", MESHED, "ADD"),
        ("nft", NOT_INJECTED, "ADD"),
        ("nft", MESHED, "DEL"),
        ("nft", MESHED, "CHECK"),
    ],
)
def test_agent_result_is_the_one_shot_result(
    setup: tuple[Rig, Netns, Path, AgentProcess], mode: str, pod: dict[str, Any], command: str
) -> None:
    rig, node, kubeconfig, agent = setup
    client = [sys.executable, "-m", "tests.support.agent_client", agent.socket]
    one_shot = [sys.executable, "-m", "multicall", "linkerd-cni"]
    results = []
    for argv in (client, one_shot):
        pod_ns = rig.pod().netns
        env = env_for(pod_ns, pod, command)
        code, out, err = invoke(node, argv, env, conf(kubeconfig, mode))
        out = out.replace(pod_ns.name, "POD")
        results.append((code, out, [line.replace(pod_ns.name, "POD") for line in err]))
        if pod is MESHED and command == "ADD":
            assert save_text(pod_ns, SAVE[mode]) == fixture_text(f"default-{mode}")
    assert results[0] == results[1]
    assert (
        agent.served(
            command, "ok" if results[0][0] == 0 else "error", "" if results[0][0] == 0 else "999"
        )
        == 1
    )


def test_another_build_is_handed_back(setup: tuple[Rig, Netns, Path, AgentProcess]) -> None:
    rig, node, kubeconfig, agent = setup
    env = {**env_for(rig.pod().netns, MESHED), "CNIBOX_TEST_BUILD": "0000000000000000"}
    code, _out, err = invoke(
        node,
        [sys.executable, "-m", "tests.support.agent_client", agent.socket],
        env,
        conf(kubeconfig, "nft"),
    )
    assert (code, err) == (99, ["fallback: other build"])
    assert agent.fallbacks("other build") == 1
    assert SOURCE_BUILD != "0000000000000000"


def test_concurrent_requests_are_all_served(
    setup: tuple[Rig, Netns, Path, AgentProcess], tmp_path: Path
) -> None:
    """60 callers at once against an agent in their netns (warm API connections): every one
    served by it, none handed back, no worker lost (a reused descriptor number once made a
    stale hang-up event reach a new worker)."""
    rig, node, kubeconfig, _ = setup
    near = AgentProcess(tmp_path / "near" / "agent.sock", argv=[sys.executable, "-m", "multicall"],
                        env={"PYTHONPATH": str(REPO)}, netns=node.path)  # fmt: skip
    client = [sys.executable, "-m", "tests.support.agent_client", near.socket]
    with near:
        pods = [rig.pod().netns for _ in range(60)]
        procs = [
            subprocess.Popen(
                ["ip", "netns", "exec", node.name, *client],
                env=env_for(p, MESHED),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            for p in pods
        ]
        results = [proc.communicate(conf(kubeconfig, "nft"), timeout=120) for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * 60, results[0]
        for pod_ns in pods:
            assert save_text(pod_ns, SAVE["nft"]) == fixture_text("default-nft")
        metrics = near.metrics()
    key = 'cnibox_agent_requests_total{command="ADD",result="ok",cni_code=""}'
    assert metrics[key] == 60
    assert metrics["cnibox_agent_worker_crashes_total"] == 0
    assert not [k for k in metrics if k.startswith("cnibox_agent_fallbacks_total")]
    # A burst costs a few forks beyond the pool (4), not one per caller: the rest waited in
    # the queue for a worker that had served one (agent/server.py rule 5).
    assert metrics["cnibox_agent_workers_started_total"] <= 16, "".join(near.log[-40:])
    assert metrics["cnibox_agent_worker_reuses_total"] >= 60 - 20
    assert metrics["cnibox_agent_queued"] == 0


REUSES = "cnibox_agent_worker_reuses_total"
STARTED = "cnibox_agent_workers_started_total"


def _settled(agent: AgentProcess, key: str, want: float) -> dict[str, float]:
    """The agent's metrics once `key` reached `want` (a worker reports "I" after its reply,
    once it prepared for the next request), or as they are after 10 s."""
    deadline = time.monotonic() + 10
    while (metrics := agent.metrics())[key] < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return metrics


def _netns_held(pids: list[int]) -> set[int]:
    """The inode numbers of the network namespaces these processes hold descriptors of."""
    held = set()
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(FileNotFoundError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("net:["):
                        held.add(int(link[5:-1]))
    return held


def test_a_worker_serves_one_request_after_another_and_keeps_nothing_of_them(
    near: Near,
) -> None:
    """nft ADDs one after the other go to the same pre-forked workers (no fork per pod) over
    the API connection the previous request kept (no TLS handshake per pod), and no worker
    keeps a descriptor of a pod netns it served (it would keep the netns alive after its
    pod). A legacy ADD (libxtables keeps its extensions per process) ends its worker: a new
    one is forked. (The agent shares its callers' netns, as with hostNetwork: a worker that
    entered another one exits after its request.)"""
    rig, node, kubeconfig, agent, api = near
    _one_request_after_another(rig, node, kubeconfig, agent, api)


def _one_request_after_another(
    rig: Rig, node: Netns, kubeconfig: Path, agent: AgentProcess, api: KubeApi
) -> None:
    client = [sys.executable, "-m", "tests.support.agent_client", agent.socket]
    pods = []

    def add(mode: str) -> None:
        pod_ns = rig.pod().netns
        code, out, err = invoke(node, client, env_for(pod_ns, MESHED), conf(kubeconfig, mode))
        assert code == 0, out + "\n".join(err)
        assert save_text(pod_ns, SAVE[mode]) == fixture_text(f"default-{mode}")
        pods.append(pod_ns)

    add("nft")  # the first: its API server becomes the warm value; idle workers are renewed
    time.sleep(1)
    before = _settled(agent, REUSES, 1)
    connections = api.connections
    for _ in range(8):
        add("nft")
    metrics = _settled(agent, REUSES, before[REUSES] + 8)
    assert metrics[STARTED] == before[STARTED], "a worker was forked for a request"
    assert metrics[REUSES] == before[REUSES] + 8
    # Each worker's first request adopts the connection it dialled while idle; later ones
    # the connection their previous request kept: at most one new connection per worker.
    assert api.connections - connections <= metrics[STARTED] - before[STARTED] + 4
    assert agent.served("ADD") == 9
    served_ns = {os.stat(p.path).st_ino for p in pods}
    assert not served_ns & _netns_held(agent.workers())

    pod_ns = rig.pod().netns
    code, out, err = invoke(node, client, env_for(pod_ns, MESHED), conf(kubeconfig, "legacy"))
    assert code == 0, out + "\n".join(err)
    assert save_text(pod_ns, SAVE["legacy"]) == fixture_text("default-legacy")
    after = _settled(agent, STARTED, metrics[STARTED] + 1)
    assert after[STARTED] > metrics[STARTED], "the worker that ran libiptc was not replaced"
    assert after[REUSES] == metrics[REUSES]


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("regular file", "CNI_NETNS is not a network namespace"),
        ("none", "CNI_NETNS not handed over"),
    ],
)
def test_a_pod_netns_the_worker_cannot_trust_is_handed_back(
    setup: tuple[Rig, Netns, Path, AgentProcess], tmp_path: Path, target: str, reason: str
) -> None:
    """The worker checks the handed CNI_NETNS descriptor as run_plugin checks what it opens
    (nsfs, type net) and never looks CNI_NETNS up by path in its own mount namespace: either
    problem is handed back before anything runs, for the one-shot path to word."""
    rig, _node, kubeconfig, agent = setup
    env = env_for(rig.pod().netns, MESHED)
    flags, fds = proto.FD_CALLER_NETNS, [os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)]
    if target == "regular file":
        plain = tmp_path / "not-a-netns"
        plain.write_bytes(b"")
        env["CNI_NETNS"] = str(plain)
        flags |= proto.FD_TARGET_NETNS
        fds.append(os.open(plain, os.O_RDONLY | os.O_CLOEXEC))
    reply = hand_over(agent, env, conf(kubeconfig, "nft").encode(), flags, fds)
    assert reply.kind == proto.FRAME_FALLBACK
    assert reply.reason == reason
    assert agent.fallbacks(reason) == 1


LOADS = "cnibox_agent_xtables_extension_loads_total"


def test_workers_preload_the_previous_legacy_family(
    setup: tuple[Rig, Netns, Path, AgentProcess],
) -> None:
    """After a one-family legacy ADD, new workers load that family's x_tables extensions
    before their request (effects/firewall/legacy.py `preload`): the next such ADD loads
    none while served. A dual-stack legacy ADD, which such a worker cannot serve (libxtables
    holds one family per process), is handed back before anything changed; the one-shot
    path then programs both families exactly as alone, and workers stop preloading."""
    rig, node, kubeconfig, agent = setup
    client = [sys.executable, "-m", "tests.support.agent_client", agent.socket]
    one_shot = [sys.executable, "-m", "multicall", "linkerd-cni"]
    legacy = conf(kubeconfig, "legacy")
    loads = []
    for _ in range(3):
        pod_ns = rig.pod().netns
        code, out, err = invoke(node, client, env_for(pod_ns, MESHED), legacy)
        assert code == 0, out + "\n".join(err)
        assert save_text(pod_ns, SAVE["legacy"]) == fixture_text("default-legacy")
        loads.append(agent.metrics()[LOADS])  # (the report, so the new hint, came first)
    assert loads[0] > 0, "the first worker had nothing to preload"
    assert loads[1:] == [loads[0]] * 2, "a preloaded worker loaded extensions while serving"

    dual = conf(kubeconfig, "legacy", ipv6=True)
    handed, alone = rig.pod().netns, rig.pod().netns
    code, _out, err = invoke(node, client, env_for(handed, MESHED), dual)
    reason = "x_tables extensions of the other family loaded"
    assert (code, err[-1:]) == (99, [f"fallback: {reason}"])
    assert agent.fallbacks(reason) == 1  # (its report, so the parent's new hint, came first)
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        assert "PROXY_INIT" not in save_text(handed, tool), "changed before handing back"
    for pod_ns in (handed, alone):  # the launcher's one-shot path, and a pod never served
        code, out, err = invoke(node, one_shot, env_for(pod_ns, MESHED), dual)
        assert code == 0, out + "\n".join(err)
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        assert save_text(handed, tool) == save_text(alone, tool)
        assert "PROXY_INIT_REDIRECT" in save_text(handed, tool)

    served = rig.pod().netns  # the fallback told the parent: no preload any more
    code, out, err = invoke(node, client, env_for(served, MESHED), dual)
    assert code == 0, out + "\n".join(err)
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        assert save_text(served, tool) == save_text(alone, tool)
    assert agent.served("ADD") == 4


def test_requests_waiting_on_a_silent_api_server_do_not_hold_the_queue(
    tmp_path: Path, pki: Pki
) -> None:
    """With one worker allowed to serve at a time (--max-workers 1), a request stuck on an
    API server that never answers (until its 4 s deadline) does not make the next caller
    wait for it: a worker on its request for over agent/server.py STUCK lets one more start
    (rule 5). Both results are the one-shot's: a timeout error, then the rules."""
    require_root()
    require_tool("iptables-nft-save")
    rig, api, silent = Rig(), KubeApi(pki), KubeApi(pki, mode="silent")
    try:
        node = rig.node()
        api.add_pod(MESHED)
        api.start(node.path)
        silent.start(node.path)
        good = api.kubeconfig(tmp_path / "kubeconfig")
        stuck = silent.kubeconfig(tmp_path / "kubeconfig-silent")
        agent = AgentProcess(tmp_path / "near" / "agent.sock",
                             argv=[sys.executable, "-m", "multicall"], extra=["--max-workers", "1"],
                             env={"PYTHONPATH": str(REPO)}, netns=node.path)  # fmt: skip
        client = ["ip", "netns", "exec", node.name,
                  sys.executable, "-m", "tests.support.agent_client", agent.socket]  # fmt: skip
        with agent:
            slow_ns, fast_ns = rig.pod().netns, rig.pod().netns
            slow_env = {**env_for(slow_ns, MESHED), "CNIBOX_KUBE_TIMEOUT": "4"}
            slow_conf = tmp_path / "slow.json"
            slow_conf.write_text(conf(stuck, "nft"))
            with slow_conf.open() as stdin:
                slow = subprocess.Popen(client, env=slow_env, stdin=stdin, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
            time.sleep(0.5)  # the slow one is being served (and waiting)
            started = time.monotonic()
            code, out, err = invoke(node, client, env_for(fast_ns, MESHED), conf(good, "nft"))
            fast_took = time.monotonic() - started
            assert code == 0, out + "\n".join(err)
            assert save_text(fast_ns, SAVE["nft"]) == fixture_text("default-nft")
            assert fast_took < 3, f"the second caller waited {fast_took:.1f} s behind the first"
            slow_out, _ = slow.communicate(timeout=30)
            assert slow.returncode == 1
            assert '"code": 999' in slow_out
            assert "PROXY_INIT" not in save_text(slow_ns, SAVE["nft"])
    finally:
        api.stop()
        silent.stop()
        rig.cleanup()


def test_healthz_answers_through_hostile_admin_clients(tmp_path: Path) -> None:
    """Issue 24 #5: 16 keep-alive clients starved /healthz (0 of 40 probes answered in 20 s:
    the kubelet would restart the agent). With 8 idle, 8 trickling and 8 keep-alive clients
    that reconnect as soon as closed, then 32 scrapers asking /metrics as soon as answered
    (each rendered by the agent's loop, as /healthz is), every probe answers within 1 s."""
    agent = AgentProcess(
        tmp_path / "run" / "agent.sock",
        argv=[sys.executable, "-m", "multicall"],
        env={"PYTHONPATH": str(REPO)},
    )
    with agent:
        assert agent.port is not None
        assert_probes_answer_through_hostile_clients(agent.port, "/healthz")
        assert agent.get("/readyz")[0] == 200


def hand_over(agent: AgentProcess, env: dict[str, str], stdin: bytes, flags: int,
              fds: list[int]) -> proto.Reply:  # fmt: skip
    """Send one request with exactly these descriptors (closed afterwards); the final reply
    after ACCEPT."""
    from tests.support import agent_client

    data = proto.encode_request(SOURCE_BUILD, ("linkerd-cni",), env, "/", stdin, flags)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    call = agent_client.Call(sock, fds, [stdin, *(f"{k}={v}".encode() for k, v in env.items())])
    try:
        sock.settimeout(30)
        sock.connect(agent.socket)
        socket.send_fds(sock, [data[: proto.HEADER.size]], fds)
        sock.sendall(data[proto.HEADER.size :])
        accepted = agent_client.read_reply(sock, call)
        reply = agent_client.read_reply(sock, call)
    finally:
        call.close()
    assert accepted is not None
    assert accepted.kind == proto.FRAME_ACCEPT
    assert reply is not None
    return reply


@pytest.mark.parametrize(
    ("wrapper", "reason"),
    [
        (["setpriv", "--inh-caps=-all", "--bounding-set=-all"],
         "caller lacks CAP_NET_ADMIN and CAP_SYS_ADMIN"),
        (["unshare", "--user", "--map-root-user"], "caller in another user namespace"),
    ],
)  # fmt: skip
def test_a_caller_without_the_authority_is_handed_back(
    setup: tuple[Rig, Netns, Path, AgentProcess], wrapper: list[str], reason: str
) -> None:
    """Issue 24 finding 1, the confused deputy: a uid-0 caller with no capabilities, or root
    in a user namespace of its own, passes the parent's uid check, and could not enter the
    pod netns itself (so it hands no netlink socket over). The agent, which could, hands the
    request back instead of doing it with its own CAP_SYS_ADMIN: nothing is programmed."""
    rig, node, kubeconfig, agent = setup
    require_tool(wrapper[0])
    pod_ns = rig.pod().netns
    client = [sys.executable, "-m", "tests.support.agent_client", agent.socket]
    code, out, err = invoke(node, [*wrapper, *client], env_for(pod_ns, MESHED),
                            conf(kubeconfig, "nft"))  # fmt: skip
    assert (code, err) == (99, [f"fallback: {reason}"]), out
    assert agent.fallbacks(reason) == 1
    assert "PROXY_INIT" not in save_text(pod_ns, SAVE["nft"])
    code, out, err = invoke(node, client, env_for(pod_ns, MESHED), conf(kubeconfig, "nft"))
    assert code == 0, out + "\n".join(err)  # the same request from a caller with authority
    assert save_text(pod_ns, SAVE["nft"]) == fixture_text("default-nft")


def _socket_in(netns: str, family: int, kind: int, protocol: int) -> int:
    """A socket created inside `netns` (this thread enters it and comes back)."""
    from multicall.effects import ns

    home = os.open(ns.OWN_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    target = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        ns.setns(target, ns.CLONE_NEWNET)
        try:
            return socket.socket(family, kind | socket.SOCK_CLOEXEC, protocol).detach()
        finally:
            ns.setns(home, ns.CLONE_NEWNET)
    finally:
        os.close(target)
        os.close(home)


NETFILTER = (socket.AF_NETLINK, socket.SOCK_RAW, 12)


@pytest.mark.parametrize(
    ("made_in", "kind", "reason"),
    [
        ("agent", NETFILTER, "netlink socket is not in CNI_NETNS"),
        ("other pod", NETFILTER, "netlink socket is not in CNI_NETNS"),
        ("pod", (socket.AF_NETLINK, socket.SOCK_RAW, 0),
         "netlink descriptor is not a netfilter netlink socket"),
        ("pod", (socket.AF_INET, socket.SOCK_DGRAM, 0),
         "netlink descriptor is not a netfilter netlink socket"),
        ("pipe", None, "netlink descriptor is not a netfilter netlink socket"),
    ],
)  # fmt: skip
def test_a_netlink_socket_that_is_not_the_pods_is_handed_back(
    near: Near, made_in: str, kind: tuple[int, int, int] | None, reason: str
) -> None:
    """Issue 24 finding 3: the netlink slot must hold a NETLINK_NETFILTER socket made in
    CNI_NETNS. One made in the agent's own netns (the host's, with hostNetwork) or another
    pod's would program that netns and leave the pod empty; a socket of another family or
    protocol (or no socket) would fail as CNI error 999. Each is handed back, and no netns
    gets rules."""
    rig, node, kubeconfig, agent, _api = near
    pod_ns, other = rig.pod().netns, rig.pod().netns
    where = {"agent": node.path, "other pod": other.path, "pod": pod_ns.path}
    if kind is None:
        netlink, w = os.pipe()
        os.close(w)
    else:
        netlink = _socket_in(where[made_in], *kind)
    fds = [
        os.open(node.path, os.O_RDONLY | os.O_CLOEXEC),  # the caller's: the agent's
        os.open(pod_ns.path, os.O_RDONLY | os.O_CLOEXEC),
        netlink,
    ]
    flags = sum(proto.FD_ORDER)
    reply = hand_over(agent, env_for(pod_ns, MESHED), conf(kubeconfig, "nft").encode(),
                      flags, fds)  # fmt: skip
    assert (reply.kind, reply.reason) == (proto.FRAME_FALLBACK, reason), reply
    assert agent.fallbacks(reason) == 1
    for netns in (pod_ns, other, node):
        assert "PROXY_INIT" not in save_text(netns, SAVE["nft"]), netns.name


def _request_lines(agent: AgentProcess, container_id: str) -> list[str]:
    return [line for line in agent.log if f"ContainerID={container_id}" in line]


def test_each_request_is_one_line_on_the_agents_stderr(
    setup: tuple[Rig, Netns, Path, AgentProcess],
) -> None:
    """Issue 24 "visible": what `kubectl logs` of the agent shows per request: one line with
    the pod's fields (upstream's names), the command, the outcome and the duration. A
    caller's line breaks are escaped and its long names cut: it cannot forge a line."""
    rig, node, kubeconfig, agent = setup
    client = [sys.executable, "-m", "tests.support.agent_client", agent.socket]
    meta = MESHED["metadata"]
    env = {**env_for(rig.pod().netns, MESHED), "CNI_CONTAINERID": "cbxlogok"}
    code, out, err = invoke(node, client, env, conf(kubeconfig, "nft"))
    assert code == 0, (out, err)
    _wait_for(lambda: _request_lines(agent, "cbxlogok"), "the ADD's line")
    [line] = _request_lines(agent, "cbxlogok")
    assert "level=info" in line
    assert 'msg="ADD ok"' in line
    assert f"Namespace={meta['namespace']} " in line
    assert f"Pod={meta['name']} " in line
    assert " command=ADD " in line
    assert " result=ok" in line
    assert re.search(r" duration_ms=\d+\.\d\b", line), line

    forged = 'time="2000-01-01T00:00:00Z" level=info msg="forged"'
    hostile = {
        **env_for(rig.pod().netns, MESHED),
        "CNI_CONTAINERID": "cbxlogbad",
        "CNI_ARGS": f"K8S_POD_NAMESPACE=x\n{forged};K8S_POD_NAME={'p' * 100_000}",
    }
    code, out, err = invoke(node, client, hostile, conf(kubeconfig, "nft"))
    assert code != 0, (out, err)  # no such pod: a CNI error, served
    _wait_for(lambda: _request_lines(agent, "cbxlogbad"), "the failed ADD's line")
    [line] = _request_lines(agent, "cbxlogbad")
    assert "level=warning" in line
    assert "failed with CNI error" in line
    assert " result=error" in line
    assert re.search(r" cni_code=\d+ ", line), line
    assert "\\n" in line, line[:300]
    assert len(line) < 2000, line[:300]
    assert f"Pod={'p' * 256} " in line  # cut (skel.log_fields)
    assert not any(entry.startswith(forged) for entry in agent.log)

    other = {**env_for(rig.pod().netns, MESHED), "CNI_CONTAINERID": "cbxlogback",
             "CNIBOX_TEST_BUILD": "0000000000000000"}  # fmt: skip
    code, _out, err = invoke(node, client, other, conf(kubeconfig, "nft"))
    assert (code, err) == (99, ["fallback: other build"])
    _wait_for(lambda: _request_lines(agent, "cbxlogback"), "the handed-back ADD's line")
    [line] = _request_lines(agent, "cbxlogback")
    assert 'msg="ADD handed back to the caller"' in line
    assert ' reason="other build" result=fallback' in line
    assert all(entry.startswith("time=") for entry in agent.log), agent.log[-3:]


def _wait_for(found: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
