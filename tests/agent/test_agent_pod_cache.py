"""The node's pod cache end to end (docs/pod-cache.md): the agent run from source in a
throwaway node netns, the list/watch API stand-in (tests/support/kubewatch.py) there,
callers through the tests' client of the launcher's protocol. The stand-in counts every
request: an ADD the cache answers makes no GET; every case it must not answer reads the API
and programs the same tables as the one-shot plugin."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, require_root, require_tool
from tests.support.agent import AgentProcess
from tests.support.kubewatch import WatchApi
from tests.support.libcni import CHART_LINKERD
from tests.support.oracles import SAVE, save_text
from tests.support.pki import Pki
from tests.support.pods import MESHED
from tests.support.rig import Netns, Rig
from tests.support.scenarios import fixture_text

pytestmark = pytest.mark.netns
NODE = "node-a"
PREV = {"cniVersion": "1.0.0", "ips": [{"address": "10.89.0.7/24"}]}
CACHE = 'cnibox_agent_pod_cache_adds_total{source="cache"}'
API = 'cnibox_agent_pod_cache_adds_total{source="api"}'


@dataclass
class Node:
    rig: Rig
    netns: Netns
    api: WatchApi
    kubeconfig: Path
    agent: AgentProcess
    tmp: Path

    def agent_process(self, kubeconfig: Path | None = None) -> AgentProcess:
        return AgentProcess(
            self.tmp / "run" / "agent.sock",
            argv=[sys.executable, "-m", "multicall"],
            env={"PYTHONPATH": str(REPO), "NODE_NAME": NODE},
            extra=["--kubeconfig", str(kubeconfig or self.kubeconfig), "--keeper", "off"],
            netns=self.netns.path,
        )

    def gets(self) -> list[str]:
        """The plugin's GETs so far (LIST and WATCH carry a query; a GET of one object not)."""
        return self.api.object_gets()

    def synced(self, timeout: float = 30) -> dict[str, float]:
        end = time.monotonic() + timeout
        while True:
            metrics = self.agent.metrics()
            keys = [
                f'cnibox_agent_pod_cache_synced{{resource="{r}"}}' for r in ("pods", "namespaces")
            ]
            if all(metrics.get(k) == 1 for k in keys):
                return metrics
            assert time.monotonic() < end, "".join(self.agent.log[-30:])
            time.sleep(0.05)

    def apply(self, pod: dict[str, Any]) -> dict[str, Any]:
        return self.api.apply(pod)


@pytest.fixture
def bare_node(tmp_path: Path, pki: Pki) -> Iterator[Node]:
    """The node netns and the stand-in, no agent started yet."""
    require_root()
    require_tool("iptables-nft-save")
    rig, api = Rig(), WatchApi(pki)
    try:
        netns = rig.node()
        api.start(netns.path)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(api.kubeconfig_text())
        api.apply({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "emojivoto"}})
        placeholder = AgentProcess(tmp_path / "unused.sock")
        yield Node(rig, netns, api, kubeconfig, placeholder, tmp_path)
    finally:
        api.stop()
        rig.cleanup()


@pytest.fixture
def node(bare_node: Node) -> Iterator[Node]:
    bare_node.agent = bare_node.agent_process()
    with bare_node.agent:
        bare_node.synced()
        yield bare_node


def bound(name: str, node: str = NODE, **annotations: str) -> dict[str, Any]:
    pod = copy.deepcopy(MESHED)
    pod["metadata"]["name"] = name
    pod["metadata"].pop("uid", None)
    pod["metadata"].setdefault("annotations", {}).update(annotations)
    pod["spec"]["nodeName"] = node
    return pod


def env_for(pod_ns: Netns, pod: dict[str, Any], uid: str | None = None) -> dict[str, str]:
    meta = pod["metadata"]
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={meta['namespace']};K8S_POD_NAME={meta['name']}"
    uid = meta.get("uid", "") if uid is None else uid
    if uid:
        args += f";K8S_POD_UID={uid}"
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": str(REPO),
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "cbxcache",
        "CNI_NETNS": pod_ns.path,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": args,
    }


def conf(kubeconfig: Path, mode: str = "nft") -> str:
    return json.dumps({
        "cniVersion": "1.0.0", "name": "cbxnet", "type": "linkerd-cni", "log_level": "debug",
        "kubernetes": {"kubeconfig": str(kubeconfig)},
        "linkerd": {**CHART_LINKERD, "iptables-mode": mode}, "prevResult": PREV,
    })  # fmt: skip


def run(node: Node, argv: list[str], env: dict[str, str], kubeconfig: Path | None = None,
        mode: str = "nft") -> tuple[int, str, str]:  # fmt: skip
    proc = subprocess.run(
        ["ip", "netns", "exec", node.netns.name, *argv],
        env=env, input=conf(kubeconfig or node.kubeconfig, mode), capture_output=True,
        text=True, timeout=120, cwd=REPO, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def client(node: Node) -> list[str]:
    return [sys.executable, "-m", "tests.support.agent_client", node.agent.socket]


ONE_SHOT = [sys.executable, "-m", "multicall", "linkerd-cni"]


def wait_for(node: Node, predicate: Any, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "".join(node.agent.log[-30:])
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["nft", "legacy"])
def test_adds_of_pods_the_cache_holds_make_no_api_request_and_program_the_same_tables(
    node: Node, mode: str
) -> None:
    count = 100 if mode == "nft" else 10
    pods = [node.apply(bound(f"web-{i}")) for i in range(count)]
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_objects{resource="pods"}') == count)  # fmt: skip
    before = len(node.gets())
    batch = 20
    for start in range(0, count, batch):
        chunk = [(p, node.rig.pod().netns) for p in pods[start : start + batch]]
        procs = [
            subprocess.Popen(
                ["ip", "netns", "exec", node.netns.name, *client(node)],
                env=env_for(ns, p),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            for p, ns in chunk
        ]
        outs = [proc.communicate(conf(node.kubeconfig, mode), timeout=120) for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * len(procs), outs[0]
        for _, ns in chunk:
            assert save_text(ns, SAVE[mode]) == fixture_text(f"default-{mode}")
    assert node.gets()[before:] == []
    metrics = node.agent.metrics()
    assert metrics[CACHE] == count
    assert metrics[API] == 0
    assert metrics["cnibox_agent_add_api_requests_total"] == 0
    assert not [k for k in metrics if k.startswith("cnibox_agent_fallbacks_total")]
    # The one-shot plugin, with its GETs, gives the same bytes and log lines.
    results = []
    for argv in (client(node), ONE_SHOT):
        pod_ns = node.rig.pod().netns
        code, out, err = run(node, argv, env_for(pod_ns, pods[0]), mode=mode)
        assert save_text(pod_ns, SAVE[mode]) == fixture_text(f"default-{mode}")
        results.append((code, out.replace(pod_ns.name, "POD"),
                        _stamped(err.replace(pod_ns.name, "POD"))))  # fmt: skip
    assert results[0] == results[1]
    assert len(node.gets()) - before == 2  # the one-shot plugin's pod and namespace GETs


def _stamped(text: str) -> list[str]:
    import re

    return [re.sub(r'time="[^"]*"', "time=T", line) for line in text.splitlines()]


def test_what_the_cache_must_not_answer_is_read_from_the_api(node: Node, tmp_path: Path) -> None:
    web = node.apply(bound("web"))
    elsewhere = node.apply(bound("elsewhere", node="node-b"))  # not bound to this node
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_objects{resource="pods"}') == 1)  # fmt: skip
    insecure = tmp_path / "insecure-kubeconfig"  # the same server, trusted another way
    text = node.api.kubeconfig_text()
    lines = [
        "    insecure-skip-tls-verify: true" if "certificate-authority-data" in line else line
        for line in text.splitlines()
    ]
    insecure.write_text("\n".join(lines) + "\n")
    cases = [
        ("not cached", elsewhere, None, None),
        ("other uid", web, "0b5e-another-pod-of-that-name", None),
        ("no pod uid", web, "", None),
        ("other cluster", web, None, insecure),
    ]
    for reason, pod, uid, kubeconfig in cases:
        before = len(node.gets())
        pod_ns = node.rig.pod().netns
        code, out, err = run(node, client(node), env_for(pod_ns, pod, uid), kubeconfig)
        assert code == 0, (reason, out, err)
        assert save_text(pod_ns, SAVE["nft"]) == fixture_text("default-nft"), reason
        pod_gets = [p for p in node.gets()[before:] if "/pods/" in p]
        assert pod_gets == [f"/api/v1/namespaces/emojivoto/pods/{pod['metadata']['name']}"], reason
        key = f'cnibox_agent_pod_cache_misses_total{{reason="{reason}"}}'
        assert node.agent.metrics()[key] == 1, reason
    metrics = node.agent.metrics()
    assert metrics[API] == len(cases)
    assert metrics[CACHE] == 0
    # not cached, other uid, no uid: the pod only (the namespace came from the cache);
    # another cluster: the pod and its namespace.
    assert metrics["cnibox_agent_add_api_requests_total"] == 3 + 2


def test_a_dead_watch_answers_nothing_and_a_410_relist_loses_nothing(node: Node) -> None:
    web = node.apply(bound("web"))
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_objects{resource="pods"}') == 1)  # fmt: skip
    node.api.stop()  # the API goes away: the watches end at once
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_synced{resource="pods"}') == 0)  # fmt: skip
    pod_ns = node.rig.pod().netns
    one_shot = run(node, ONE_SHOT, env_for(pod_ns, web))
    code, out, _err = run(node, client(node), env_for(pod_ns, web))
    assert code == one_shot[0] == 1
    assert out == one_shot[1]
    assert node.agent.metrics()['cnibox_agent_pod_cache_misses_total{reason="watch down"}'] == 1
    # Back with its history compacted: the resumed watch is answered 410 Gone, the cache
    # lists again, and what changed meanwhile is there.
    node.api.compact()
    node.api.start(node.netns.path)
    node.api.delete("emojivoto", "web")
    later = node.apply(bound("later"))
    node.api.compact()
    node.synced()
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_objects{resource="pods"}') == 1)  # fmt: skip
    before = len(node.gets())
    pod_ns = node.rig.pod().netns
    code, out, err = run(node, client(node), env_for(pod_ns, later))
    assert code == 0, err
    assert save_text(pod_ns, SAVE["nft"]) == fixture_text("default-nft")
    assert node.gets()[before:] == []
    metrics = node.agent.metrics()
    assert metrics['cnibox_agent_pod_cache_relists_total{resource="pods"}'] >= 2
    assert metrics[CACHE] == 1


def test_a_dropped_watch_and_an_agent_restart_lose_nothing(node: Node) -> None:
    node.api.drop_after = 1  # every watch connection is cut after its first event
    pods = [node.apply(bound(f"web-{i}")) for i in range(5)]
    node.api.delete("emojivoto", "web-0")
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_objects{resource="pods"}') == 4)  # fmt: skip
    node.api.drop_after = 0
    node.synced()
    node.agent.stop()
    node.agent = node.agent_process()
    with node.agent:
        node.synced()
        before = len(node.gets())
        for pod in pods[1:]:
            pod_ns = node.rig.pod().netns
            code, _out, err = run(node, client(node), env_for(pod_ns, pod))
            assert code == 0, err
            assert save_text(pod_ns, SAVE["nft"]) == fixture_text("default-nft")
        assert node.gets()[before:] == []
        assert node.agent.metrics()[CACHE] == 4


def test_a_410_in_the_middle_of_a_watch_relists_and_loses_nothing(node: Node) -> None:
    node.apply(bound("first"))
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_objects{resource="pods"}') == 1)  # fmt: skip
    # A change the open watch has not read yet, and the history compacted past it: the
    # watch's next event is 410 Gone (the stand-in's lock is held across both).
    with node.api._cond:
        later = node.apply(bound("later"))
        node.api.compact()
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_relists_total{resource="pods"}', 0) >= 2)  # fmt: skip
    node.synced()
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_objects{resource="pods"}') == 2)  # fmt: skip
    before = len(node.gets())
    pod_ns = node.rig.pod().netns
    code, _out, err = run(node, client(node), env_for(pod_ns, later))
    assert code == 0, err
    assert save_text(pod_ns, SAVE["nft"]) == fixture_text("default-nft")
    assert node.gets()[before:] == []


def test_more_pods_than_the_bound_are_not_kept_and_read_from_the_api(node: Node) -> None:
    """MAX_PODS (2048) kept, the rest dropped and counted; a dropped pod's ADD reads the API."""
    pods = [node.apply(bound(f"many-{i:04d}")) for i in range(2100)]
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_dropped_total{resource="pods"}', 0) >= 52, timeout=60)  # fmt: skip
    metrics = node.synced()
    assert metrics['cnibox_agent_pod_cache_objects{resource="pods"}'] == 2048
    before = len(node.gets())
    results = []
    for pod in (pods[0], pods[-1]):  # the first applied is kept; the last one was not
        pod_ns = node.rig.pod().netns
        code, _out, err = run(node, client(node), env_for(pod_ns, pod))
        assert code == 0, err
        assert save_text(pod_ns, SAVE["nft"]) == fixture_text("default-nft")
        results.append(len(node.gets()) - before)
        before = len(node.gets())
    assert results == [0, 1]  # the pod GET only: its namespace is cached
    assert node.agent.metrics()['cnibox_agent_pod_cache_misses_total{reason="not cached"}'] == 1


@pytest.mark.parametrize("first", ["missing", "malformed"])
def test_an_agent_started_before_its_kubeconfig_serves_adds_then_starts_its_cache(
    bare_node: Node, first: str
) -> None:
    """Talos: the agent service starts at boot, before install-cni wrote the kubeconfig
    it is given (docs/agent.md "The agent's API identity"). It starts, serves ADDs (with
    each config's own kubeconfig), says what it waits for; when the file is written, its
    pod cache lists and answers, without a restart of the agent."""
    node = bare_node
    later = node.tmp / "net.d" / "ZZZ-linkerd-cni-kubeconfig"
    later.parent.mkdir()
    if first == "malformed":  # install-cni caught mid-write
        later.write_text("apiVersion: v1\nclusters: [")
    node.agent = node.agent_process(kubeconfig=later)
    with node.agent:
        pid = node.agent.pid
        said = "pod cache: waiting for the agent's API identity: kubeconfig " + str(later)
        wait_for(node, lambda: any(said in line for line in node.agent.log), timeout=10)
        why = "does not exist yet" if first == "missing" else "cannot be used yet"
        assert [line for line in node.agent.log if said in line and why in line]
        metrics = node.agent.metrics()
        assert metrics["cnibox_agent_pod_cache_identity_waiting"] == 1
        assert node.agent.get("/readyz")[0] == 200  # ADDs are served: ready
        web = node.apply(bound("web"))
        pod_ns = node.rig.pod().netns
        code, out, err = run(node, client(node), env_for(pod_ns, web))
        assert code == 0, (out, err)
        assert save_text(pod_ns, SAVE["nft"]) == fixture_text("default-nft")
        metrics = node.agent.metrics()
        assert node.agent.served() == 1
        assert metrics[API] == 1
        assert metrics['cnibox_agent_pod_cache_misses_total{reason="not synced"}'] == 1
        # install-cni writes the file (a new file renamed into place)
        written = later.with_name(".tmp-kubeconfig")
        written.write_text(node.api.kubeconfig_text())
        written.rename(later)
        metrics = node.synced(timeout=15)
        assert metrics["cnibox_agent_pod_cache_identity_waiting"] == 0
        second = node.apply(bound("web-2"))
        wait_for(node, lambda: node.agent.metrics().get(
            'cnibox_agent_pod_cache_objects{resource="pods"}') == 2)  # fmt: skip
        before = len(node.gets())
        pod_ns = node.rig.pod().netns
        code, out, err = run(node, client(node), env_for(pod_ns, second))
        assert code == 0, (out, err)
        assert node.gets()[before:] == []  # answered by the cache
        assert node.agent.metrics()[CACHE] == 1
        assert node.agent.pid == pid
        assert node.agent.proc is not None
        assert node.agent.proc.poll() is None
        assert [line for line in node.agent.log if "loaded after" in line]
        assert not [line for line in node.agent.log if "exited" in line]


def test_a_rewritten_agent_kubeconfig_is_used_at_the_next_reconnect(bare_node: Node) -> None:
    """install-cni rewrites its kubeconfig with a new token: the cache's watches, cut and
    reconnecting, use the new file (the old token is refused), without an agent restart."""
    node = bare_node
    mine = node.tmp / "net.d" / "ZZZ-linkerd-cni-kubeconfig"
    mine.parent.mkdir()
    mine.write_text(node.api.kubeconfig_text())
    node.agent = node.agent_process(kubeconfig=mine)
    with node.agent:
        pid = node.agent.pid
        node.synced()
        node.api.token = "rotated-token"  # the old token is refused from now on
        written = mine.with_name(".tmp-kubeconfig")
        written.write_text(node.api.kubeconfig_text(token="rotated-token"))
        written.rename(mine)
        node.api.restart()  # the watches are cut and reconnect
        relists = 'cnibox_agent_pod_cache_relists_total{resource="pods"}'
        wait_for(node, lambda: node.agent.metrics().get(relists, 0) >= 2, timeout=15)
        node.synced(timeout=15)
        assert node.agent.pid == pid
        assert [line for line in node.agent.log if f"kubeconfig {mine} changed; reloaded" in line]
        assert not [line for line in node.agent.log if "exited" in line]


def channel_holders(node: Node, keeper: int) -> set[int]:
    """The processes holding the other end of `keeper`'s SOCK_SEQPACKET socket (its channel
    to the pod cache): the agent's parent alone, no worker (`ss`: each unix socket's inode,
    its peer's, and who holds it)."""
    import re

    out = node.netns.exec(["ss", "-xapH"])
    peers, holders = {}, {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[0] != "u_seq":
            continue
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        peers[fields[5]], holders[fields[5]] = fields[7], pids
    mine = [inode for inode, pids in holders.items() if keeper in pids]
    assert len(mine) == 1, out
    return holders[peers[mine[0]]]


def test_the_keeper_asks_the_cache_and_a_restarted_keeper_gets_a_fresh_channel(
    bare_node: Node,
) -> None:
    """The agent with its keeper in mode repair and its cache (agent/keeper_process.py rule
    5): a pod ADDed through the agent, its nat table flushed; the keeper asks whether the
    pod is still there and runs the ADD in place, both answered by the cache: 0 GETs. The
    keeper killed: its supervisor's next keeper sends a new channel, and repairs with 0 GETs
    too (without it, each question would wait for ASK_TIMEOUT and read the API)."""
    import os
    import re
    import signal

    node = bare_node
    entry = json.loads(conf(node.kubeconfig))
    del entry["prevResult"], entry["cniVersion"], entry["name"]
    net_dir = node.tmp / "net.d"
    net_dir.mkdir()
    conflist = {"cniVersion": "1.0.0", "name": "cbxnet", "plugins": [entry]}
    (net_dir / "10-cbxnet.conflist").write_text(json.dumps(conflist))
    node.agent = node.agent_process()
    node.agent.argv[node.agent.argv.index("off")] = "repair"
    node.agent.argv += ["--cni-net-dir", str(net_dir)]
    upstream = fixture_text("default-nft")
    with node.agent:
        node.synced()
        web = node.apply(bound("web-k"))
        wait_for(node, lambda: node.agent.metrics().get(
            'cnibox_agent_pod_cache_objects{resource="pods"}') == 1)  # fmt: skip
        pod_ns = node.rig.pod().netns
        pod_ns.ip("addr", "add", "10.89.0.7/32", "dev", "lo")  # the repair checks it is there
        before = len(node.gets())
        code, out, err = run(node, client(node), env_for(pod_ns, web))
        assert code == 0, (out, err)

        def keepers() -> list[int]:
            return [
                int(p) for p in re.findall(r"keeper started \(pid (\d+)", "".join(node.agent.log))
            ]

        def repairs() -> float:
            return sum(v for k, v in node.agent.metrics().items()
                       if k.startswith("cnibox_agent_keeper_repairs_total"))  # fmt: skip

        def watched() -> float:
            return sum(v for k, v in node.agent.metrics().items()
                       if k.startswith("cnibox_agent_keeper_sandboxes_watched"))  # fmt: skip

        restarts = "cnibox_agent_keeper_restarts_total"
        for restarted in (0, 1):  # a restarted keeper counts from 0 again
            wait_for(node, lambda: node.agent.metrics().get(restarts) == restarted)  # noqa: B023
            wait_for(node, lambda: watched() == 1)
            time.sleep(0.5)  # its netlink socket subscribed
            pod_ns.exec(["nft", "flush", "table", "ip", "nat"])
            wait_for(node, lambda: save_text(pod_ns, SAVE["nft"]) == upstream, timeout=15)
            wait_for(node, lambda: repairs() == 1)
            assert node.gets()[before:] == []
            assert channel_holders(node, keepers()[-1]) == {node.agent.pid}
            if not restarted:
                os.kill(keepers()[-1], signal.SIGKILL)
                wait_for(node, lambda: len(keepers()) == 2, timeout=15)
        assert "no channel to the agent's pod cache" not in "".join(node.agent.log)


def test_the_kubernetes_service_arrives_through_its_watch_and_answers_a_control_plane_add(
    node: Node,
) -> None:
    """The service created after the cache listed (a WATCH event, not the LIST), then its
    targetPort changed: control-plane ADDs through the agent read the service from the
    cache, 0 GETs, and follow the change (the first ADD after the event arrived); each
    programs what the one-shot plugin (with its 3 GETs) does."""
    from tests.support.kubeapi import service_doc

    services = 'cnibox_agent_pod_cache_objects{resource="services"}'
    assert node.agent.metrics()[services] == 0
    web = bound("destination-0")
    web["metadata"].setdefault("labels", {})["linkerd.io/control-plane-component"] = "destination"
    web = node.apply(web)
    wait_for(node, lambda: node.agent.metrics().get(
        'cnibox_agent_pod_cache_objects{resource="pods"}') == 1)  # fmt: skip

    def add(argv: list[str]) -> tuple[int, str]:
        pod_ns = node.rig.pod().netns
        before = len(node.gets())
        code, out, err = run(node, argv, env_for(pod_ns, web))
        assert code == 0, (out, err)
        tables = save_text(pod_ns, SAVE["nft"]).replace(pod_ns.name, "POD")
        node.rig.remove(pod_ns)
        return len(node.gets()) - before, tables

    for target in (6443, 7443):
        node.api.apply(service_doc([{"name": "https", "port": 443, "targetPort": target}]))
        wait_for(node, lambda: node.agent.metrics()[services] == 1)
        end = time.monotonic() + 15
        while True:  # the change's event may still be on its way (its own watch)
            gets, cached = add(client(node))
            assert gets == 0
            if f"--dports 443,{target} " in cached or time.monotonic() > end:
                break
            time.sleep(0.1)
        gets, one_shot = add(ONE_SHOT)
        assert gets == 3  # pod, namespace, service
        assert f"--dports 443,{target} " in one_shot
        assert cached == one_shot
