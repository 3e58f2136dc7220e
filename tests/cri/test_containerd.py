"""linkerd-cni under the runtime Talos uses: Debian's containerd 1.6 with its CRI plugin, driven
by the calls a kubelet makes. containerd adds what the libcni suites cannot show: its own
CNI_ARGS, netns creation and naming, DEL on StopPodSandbox and RemovePodSandbox, the libcni
result cache, conflist reloads on file events, teardown when setup fails. Rules are read with
Debian's iptables-save inside the pod's netns; after every test nothing of any pod may remain
on the node (conftest.py). docs/cri-tests.md.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.cri.cluster import MESHED_CASES, NFT, CriCluster, MeshedCase, check_meshed
from tests.support.kubeapi import refused_port
from tests.support.pods import MESHED, NOT_INJECTED, WITH_INIT, renamed
from tests.support.scenarios import fixture_text

pytestmark = [pytest.mark.netns, pytest.mark.binary]

# The plugin's deadline for one API request is 5 s (docs/linkerd-cni.md, "What differs from
# upstream"); the rest is containerd: the netns, the pause container, the teardown of the chain.
API_DOWN_BOUND = 15.0


def teardowns(log: str, sandbox_id: str) -> int:
    """How many times containerd's CNI DEL of the chain succeeded for this sandbox."""
    return log.count(f'TearDown network for sandbox \\"{sandbox_id}\\" successfully')


@pytest.mark.parametrize("case", MESHED_CASES, ids=lambda case: case.name)
def test_meshed_pod_gets_upstream_rules(cluster: CriCluster, case: MeshedCase) -> None:
    """RunPodSandbox of an injected pod: ready, addressed by the bridge, and its netns holds
    exactly upstream's nat tables (nft, legacy, and with `ipv6: true` both families)."""
    check_meshed(cluster, case)


@pytest.mark.parametrize(
    ("pod", "why"),
    [(NOT_INJECTED, "no proxy"), (WITH_INIT, "linkerd-init")],
    ids=["no-proxy", "linkerd-init"],
)
def test_unmeshed_pod_gets_no_rules(cluster: CriCluster, pod: dict[str, object], why: str) -> None:
    """Pods without a proxy, or with linkerd-init doing the rules, start with an empty nat."""
    cluster.use(cluster.chained())
    sandbox = cluster.run(pod)
    assert sandbox.ready, why
    assert sandbox.ip, why
    assert cluster.proxy_init_lines(sandbox) == [], why


def test_plugin_error_fails_the_sandbox_and_leaves_nothing(cluster: CriCluster) -> None:
    """An annotation the plugin rejects fails RunPodSandbox with the plugin's own message;
    containerd tears the chain down: no sandbox, netns, address, veth or cache entry stays."""
    pod = renamed(MESHED, "bad-uid-7d4f8c9b5-x2x4q", **{"config.linkerd.io/proxy-uid": "21O2"})
    cluster.use(cluster.chained())
    with pytest.raises(grpc.RpcError) as failed:
        cluster.run(pod)
    details = failed.value.details() or ""
    assert 'plugin type="linkerd-cni"' in details, details
    assert 'strconv.Atoi: parsing "21O2": invalid syntax' in details, details
    assert cluster.leaks() == []


@pytest.mark.parametrize(
    ("down", "message"),
    [
        ("refused", "connect: connection refused"),
        ("hang", "Client.Timeout exceeded while awaiting headers"),
    ],
    ids=["refused", "hang"],
)
def test_api_down_fails_the_sandbox_within_the_deadline(
    cluster: CriCluster, down: str, message: str
) -> None:
    """With the API refusing connections or never answering, RunPodSandbox fails with the
    plugin's error within one request deadline (plus containerd's own work), leaving nothing."""
    cluster.use(cluster.chained())
    if down == "refused":
        cluster.write_kubeconfig(port=refused_port(cluster.node.netns.path))
    else:
        cluster.api.mode = "hang"
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as failed:
        cluster.run(MESHED)
    elapsed = time.monotonic() - started
    assert message in (failed.value.details() or ""), failed.value.details()
    assert elapsed < API_DOWN_BOUND
    assert cluster.leaks() == []


def test_stop_and_remove_run_del_each_time(cluster: CriCluster) -> None:
    """containerd 1.6 runs the chain's DEL on every StopPodSandbox (kubelet stops more than
    once) and again on RemovePodSandbox; each succeeds, the first one after the netns is
    gone included, and the netns goes away at the first Stop."""
    sandbox = check_meshed(cluster, NFT)
    netns = cluster.node.inside(sandbox.netns)
    assert netns.exists()
    start = len(cluster.node.log_text())
    cluster.node.cri.stop(sandbox.id)
    assert not netns.exists()
    cluster.node.cri.stop(sandbox.id)
    cluster.node.cri.remove(sandbox.id)
    log = cluster.node.log_text()[start:]
    assert teardowns(log, sandbox.id) == 3, log
    assert log.count("linkerd-cni: delete:") == 3, log
    assert "failed to destroy network" not in log, log
    assert cluster.leaks() == []


def test_containerd_restart_with_empty_caches(cluster: CriCluster) -> None:
    """containerd restarts (shims and pods keep running) after libcni's result cache and
    cnibox's unpacked payload were wiped, as a node reboot wipes what is on tmpfs: the old
    pod is recovered and ends cleanly (DEL without a cached result), the binary unpacks
    itself again (through the agent, nothing is unpacked at all: the launcher never starts
    Python), and a new pod gets upstream's rules."""
    before = check_meshed(cluster, NFT)
    assert cluster.node.unpacked()  # by the plugin's first start (or the agent's own)
    cluster.node.restart_containerd(empty_caches=True)
    assert not cluster.node.inside("/var/lib/cni/results").exists()
    assert not cluster.node.unpacked()
    recovered = cluster.node.cri.sandbox(before.id)
    assert recovered.ready, recovered
    assert recovered.netns == before.netns, recovered
    start = len(cluster.node.log_text())
    cluster.end(before.id)
    assert teardowns(cluster.node.log_text()[start:], before.id) >= 1
    assert not cluster.node.inside(before.netns).exists()
    check_meshed(cluster, NFT, renamed(MESHED, "web-restarted-7d4f8c9b5-x2x4q"))
    assert cluster.node.unpacked() == (cluster.mode.name == "direct")


def test_ten_concurrent_sandboxes(cluster: CriCluster) -> None:
    """Ten RunPodSandbox calls at once: all ready, ten addresses, each netns with exactly
    upstream's rules; ten concurrent Stop+Remove leave nothing."""
    cluster.use(cluster.chained())
    refs = [cluster.ref(renamed(MESHED, f"web-{i}-7d4f8c9b5-x2x4q")) for i in range(10)]
    with ThreadPoolExecutor(len(refs)) as pool:
        sandboxes = list(pool.map(cluster.start, refs))
    assert all(s.ready for s in sandboxes)
    assert len({s.ip for s in sandboxes}) == len(refs)
    expected = fixture_text("default-nft")
    for sandbox in sandboxes:
        assert cluster.nat(sandbox, "iptables-nft-save") == expected, sandbox
    with ThreadPoolExecutor(len(refs)) as pool:
        list(pool.map(cluster.end, [s.id for s in sandboxes]))
    assert cluster.leaks() == []
