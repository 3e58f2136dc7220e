"""The keeper started by the node agent run from source (issue 26): an ADD through the agent
records its sandbox, a flushed nat table is repaired by the agent's keeper process, DEL
removes the record; `--keeper off` records and repairs nothing; SIGTERM leaves no keeper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent.conftest import AgentNode
from tests.agent.test_agent_source import conf, env_for, invoke
from tests.support import require_tool
from tests.support.agent import AgentProcess
from tests.support.oracles import SAVE, save_text
from tests.support.pods import MESHED
from tests.support.rig import Netns, Rig
from tests.support.scenarios import fixture_text
from tests.support.waiting import wait_for

pytestmark = pytest.mark.netns


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        here = todo.pop()
        try:  # a process (or thread) that ended meanwhile has no children left
            tasks = os.listdir(f"/proc/{here}/task")
        except FileNotFoundError:
            found.discard(here)
            continue
        for task in tasks:
            try:
                with open(f"/proc/{here}/task/{task}/children") as f:
                    kids = {int(p) for p in f.read().split()}
            except FileNotFoundError:
                continue
            todo += sorted(kids - found)
            found |= kids
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def keeper_setup(
    request: pytest.FixtureRequest, agent_node: AgentNode
) -> Iterator[tuple[Rig, Netns, Path, AgentProcess]]:
    require_tool("nft")
    entry = json.loads(conf(agent_node.kubeconfig, "nft"))
    del entry["prevResult"], entry["cniVersion"], entry["name"]
    net_dir = agent_node.net_dir(entry)
    with agent_node.agent(extra=["--cni-net-dir", str(net_dir), *request.param]) as agent:
        yield agent_node.rig, agent_node.node, agent_node.kubeconfig, agent


def pod_with_ip(rig: Rig) -> Netns:
    """A sandbox holding the prevResult's address (the repair checks it is there)."""
    pod_ns = rig.pod().netns
    pod_ns.ip("addr", "add", "10.89.0.7/32", "dev", "lo")
    return pod_ns


def flush_nat(pod_ns: Netns) -> None:
    subprocess.run(["ip", "netns", "exec", pod_ns.name, "nft", "flush", "table", "ip", "nat"],
                   check=True, capture_output=True)  # fmt: skip


def run(node: Netns, agent: AgentProcess, kubeconfig: Path, pod_ns: Netns, command: str) -> None:
    client = [sys.executable, "-m", "tests.support.agent_client", agent.socket]
    code, out, err = invoke(node, client, env_for(pod_ns, MESHED, command),
                            conf(kubeconfig, "nft"))  # fmt: skip
    assert code == 0, (out, err)


@pytest.mark.parametrize("keeper_setup", [[]], indirect=True)
def test_the_agents_keeper_records_repairs_and_stops(
    keeper_setup: tuple[Rig, Netns, Path, AgentProcess],
) -> None:
    rig, node, kubeconfig, agent = keeper_setup
    records = Path(agent.socket).parent / "sandboxes"
    wait_for(lambda: len(descendants(agent.pid)) > len(agent.workers()), "the keeper running")
    pod_ns = pod_with_ip(rig)
    upstream = fixture_text("default-nft")
    run(node, agent, kubeconfig, pod_ns, "ADD")
    assert save_text(pod_ns, SAVE["nft"]) == upstream
    assert [p.name for p in records.iterdir()] == ["cbxsrc-eth0.json"]
    assert records.stat().st_mode & 0o777 == 0o700
    time.sleep(1.0)  # the keeper's inotify sees the record, its netlink socket subscribes
    flush_nat(pod_ns)
    changed = time.monotonic()
    wait_for(lambda: save_text(pod_ns, SAVE["nft"]) == upstream, "the repair", timeout=10)
    took = time.monotonic() - changed
    # the table is back before the repair is verified and logged
    wait_for(lambda: "repaired in place" in "".join(agent.log), "the repair logged")
    assert "no API configuration" in "".join(agent.log)
    run(node, agent, kubeconfig, pod_ns, "DEL")
    assert list(records.iterdir()) == []
    keepers = descendants(agent.pid)
    assert keepers
    assert agent.stop() == 0
    wait_for(lambda: not any(alive(p) for p in keepers), "no keeper process left")
    print(f"\nseconds from the flush to the repair: {took:.2f}")


@pytest.mark.parametrize("keeper_setup", [["--keeper", "off"]], indirect=True)
def test_keeper_off_records_and_repairs_nothing(
    keeper_setup: tuple[Rig, Netns, Path, AgentProcess],
) -> None:
    rig, node, kubeconfig, agent = keeper_setup
    records = Path(agent.socket).parent / "sandboxes"
    pod_ns = pod_with_ip(rig)
    run(node, agent, kubeconfig, pod_ns, "ADD")
    assert not records.exists()
    # No keeper process: every child is a worker (asked until a worker that is exiting
    # between the two reads has gone; a keeper never would).
    wait_for(lambda: set(descendants(agent.pid)) == set(agent.workers()), "only workers", 5)
    flush_nat(pod_ns)
    time.sleep(2.0)
    assert save_text(pod_ns, SAVE["nft"]) != fixture_text("default-nft")
    assert "keeper started" not in "".join(agent.log)
    assert not [k for k in agent.metrics() if k.startswith("cnibox_agent_keeper_")]


# ----------------------------------------------------------------------------- many pods

QUIET = float(os.environ.get("CNIBOX_KEEPER_QUIET", "20"))  # the run: 600
PODS = int(os.environ.get("CNIBOX_KEEPER_PODS", "100"))
CHANGE = {  # one transaction each; what the keeper must see as drift
    "nft": ["nft", "flush", "chain", "ip", "nat", "PROXY_INIT_REDIRECT"],
    "legacy": ["iptables-legacy", "-t", "nat", "-F", "PROXY_INIT_REDIRECT"],
}


def keeper_agent(agent_node: AgentNode, mode: str, *extra: str) -> AgentProcess:
    """An agent whose keeper has the API (Events, the pod's GET) and the node's conflist."""
    entry = json.loads(conf(agent_node.kubeconfig, mode))
    del entry["prevResult"], entry["cniVersion"], entry["name"]
    net_dir = agent_node.net_dir(entry)
    flags = ["--cni-net-dir", str(net_dir), "--kubeconfig", str(agent_node.kubeconfig)]
    return agent_node.agent(extra=[*flags, *extra])


def add_pods(agent_node: AgentNode, agent: AgentProcess, mode: str, count: int) -> list[Netns]:
    """`count` sandboxes, each holding the prevResult's address, ADDed through the agent by
    the tests' client (in the node netns, where the caller reaches the API)."""
    from multicall.core import agent_protocol as proto
    from multicall.effects.ns import entered_netns
    from tests.support.agent_client import call

    pods = []
    config = conf(agent_node.kubeconfig, mode).encode()
    for n in range(count):
        pod_ns = agent_node.rig.pod().netns
        pod_ns.ip("addr", "add", "10.89.0.7/32", "dev", "lo")
        env = {**env_for(pod_ns, MESHED, "ADD"), "CNI_CONTAINERID": f"cbx{n:04d}"}
        env["XTABLES_LOCKFILE"] = os.environ["XTABLES_LOCKFILE"]  # the run's (conftest.py)
        with entered_netns(agent_node.node.path, allow_own=True):
            frames = call(agent.socket, env, config, build=proto.SOURCE_BUILD)
        assert frames, env
        assert frames[-1].kind == proto.FRAME_RESULT, frames
        assert frames[-1].code == 0, frames[-1].stdout
        pods.append(pod_ns)
    return pods


def keeper_samples(agent: AgentProcess) -> dict[str, float]:
    return {k: v for k, v in agent.metrics().items() if k.startswith("cnibox_agent_keeper_")}


def total(samples: dict[str, float], family: str) -> float:
    """Every series of `family` (cnibox_agent_keeper_ + family) summed."""
    name = f"cnibox_agent_keeper_{family}"
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def watching(agent: AgentProcess, count: int) -> bool:
    return total(keeper_samples(agent), "sandboxes_watched") == count


@pytest.mark.parametrize("mode", ["nft", "legacy"])
def test_no_false_repair_of_100_idle_pods(agent_node: AgentNode, mode: str) -> None:
    """PODS meshed pods ADDed through the agent, watched for QUIET seconds while nothing
    changes them: no drift, no repair, no Event; the keeper's CPU bounded. Then one real
    change is repaired (the watch was live all along)."""
    require_tool(f"iptables-{mode}-save")
    with keeper_agent(agent_node, mode) as agent:
        pods = add_pods(agent_node, agent, mode, PODS)
        wait_for(lambda: watching(agent, PODS), f"{PODS} sandboxes watched", timeout=30)
        via = "events" if mode == "nft" else "sweep"
        before = keeper_samples(agent)
        assert before[f'cnibox_agent_keeper_sandboxes_watched{{via="{via}"}}'] == PODS
        started = time.monotonic()
        time.sleep(QUIET)
        after = keeper_samples(agent)
        quiet = time.monotonic() - started
        for family in ("drift_total", "repairs_total", "refused_total", "events_total",
                       "event_failures_total", "repair_failures_total",
                       "records_pruned_total", "restarts_total"):  # fmt: skip
            assert total(after, family) == 0, (family, after)
        cpu, sweeps = (
            after[f"cnibox_agent_keeper_{name}"] - before[f"cnibox_agent_keeper_{name}"]
            for name in ("cpu_seconds_total", "sweeps_total")
        )
        rss = after["cnibox_agent_keeper_resident_memory_bytes"]
        # nft: nothing runs while nothing changes (a sweep only checks each netns is still
        # there); legacy: every sweep dumps and compares each table.
        assert cpu < (0.02 if mode == "nft" else 0.25) * quiet + 0.5, cpu
        assert rss < 200 << 20, rss
        upstream = fixture_text(f"default-{mode}")
        assert all(save_text(p, SAVE[mode]) == upstream for p in (pods[0], pods[-1]))
        pods[PODS // 2].exec(CHANGE[mode])
        wait_for(lambda: total(keeper_samples(agent), "repairs_total") > 0, "the repair",
                 timeout=15)  # fmt: skip
        assert save_text(pods[PODS // 2], SAVE[mode]) == upstream
    print(f"\n{mode}: {PODS} pods idle {quiet:.0f}s: keeper CPU {cpu:.3f}s "
          f"({100 * cpu / quiet:.2f}% of a core), {sweeps:.0f} sweeps, RSS {rss / 2**20:.1f} MiB, "
          "0 drift, 0 repairs, 0 Events")  # fmt: skip


# ----------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("mode", ["nft", "legacy"])
def test_a_restarted_agent_rebuilds_its_watch_and_repairs_drift_made_while_down(
    agent_node: AgentNode, mode: str
) -> None:
    """SIGTERM, a change while no agent runs, the agent started again: the records are
    watched again and the changed sandbox is repaired (its first comparison), the others
    are left alone."""
    require_tool(f"iptables-{mode}-save")
    upstream = fixture_text(f"default-{mode}")
    agent = keeper_agent(agent_node, mode)
    with agent:
        pods = add_pods(agent_node, agent, mode, 3)
        wait_for(lambda: watching(agent, 3), "3 sandboxes watched")
        assert agent.stop() == 0
    pods[1].exec(CHANGE[mode])
    assert save_text(pods[1], SAVE[mode]) != upstream
    with agent:
        wait_for(lambda: watching(agent, 3), "3 sandboxes watched again")
        wait_for(lambda: save_text(pods[1], SAVE[mode]) == upstream, "the repair", timeout=15)
        wait_for(lambda: total(keeper_samples(agent), "repairs_total") == 1, "the repair counted")
        samples = keeper_samples(agent)
        assert samples['cnibox_agent_keeper_repairs_total{reason="missing_rule"}'] == 1
        assert total(samples, "drift_total") == 1
        assert total(samples, "records_pruned_total") == 0
        assert all(save_text(p, SAVE[mode]) == upstream for p in pods)
        assert "repaired in place (missing_rule)" in "".join(agent.log)


def test_a_reboot_prunes_the_records_of_sandboxes_that_are_gone(agent_node: AgentNode) -> None:
    """After a "reboot" the records remain (here: the agent's record dir is kept) but the
    sandboxes' netns are gone: their records are removed, nothing is repaired or posted; the
    sandbox that is still there is watched."""
    upstream = fixture_text("default-nft")
    agent = keeper_agent(agent_node, "nft")
    with agent:
        pods = add_pods(agent_node, agent, "nft", 3)
        wait_for(lambda: watching(agent, 3), "3 sandboxes watched")
        assert agent.stop() == 0
    records = Path(agent.socket).parent / "sandboxes"
    assert len(list(records.iterdir())) == 3
    agent_node.rig.remove(pods[0])
    agent_node.rig.remove(pods[2])
    with agent:
        wait_for(lambda: len(list(records.iterdir())) == 1, "the stale records removed")
        wait_for(lambda: watching(agent, 1), "the remaining sandbox watched")
        samples = keeper_samples(agent)
        assert samples["cnibox_agent_keeper_records_pruned_total"] == 2
        for family in ("drift_total", "repairs_total", "refused_total", "events_total",
                       "event_failures_total", "repair_failures_total"):  # fmt: skip
            assert total(samples, family) == 0, (family, samples)
        assert [p.name for p in records.iterdir()] == ["cbx0001-eth0.json"]
        assert save_text(pods[1], SAVE["nft"]) == upstream
        pods[1].exec(CHANGE["nft"])  # the one left is watched for real
        wait_for(lambda: save_text(pods[1], SAVE["nft"]) == upstream, "its repair")


def test_a_keeper_started_before_its_kubeconfig_waits_for_it_then_repairs(
    agent_node: AgentNode,
) -> None:
    """The Talos service's keeper (docs/agent.md "The agent's API identity"): given a
    --kubeconfig install-cni has not written yet, the agent serves ADDs and the keeper
    waits for the file, logged once; written, the keeper starts with it, without an agent
    restart, and repairs (asking the API for the pod first, with that identity)."""
    require_tool("nft")
    entry = json.loads(conf(agent_node.kubeconfig, "nft"))
    del entry["prevResult"], entry["cniVersion"], entry["name"]
    net_dir = agent_node.net_dir(entry)
    later = agent_node.tmp / "later" / "ZZZ-linkerd-cni-kubeconfig"
    later.parent.mkdir()
    flags = ["--cni-net-dir", str(net_dir), "--kubeconfig", str(later), "--pod-cache", "off"]
    with agent_node.agent(extra=flags) as agent:
        said = f"keeper: waiting for the agent's API identity: kubeconfig {later} does not"
        wait_for(lambda: said in "".join(agent.log), "the keeper's wait logged")
        pod_ns = pod_with_ip(agent_node.rig)
        run(agent_node.node, agent, agent_node.kubeconfig, pod_ns, "ADD")
        upstream = fixture_text("default-nft")
        assert save_text(pod_ns, SAVE["nft"]) == upstream
        written = later.with_name(".tmp")
        written.write_text(agent_node.kubeconfig.read_text())
        written.rename(later)
        wait_for(lambda: f"keeper: kubeconfig {later} loaded after" in "".join(agent.log),
                 "the keeper's kubeconfig loaded", timeout=15)  # fmt: skip
        time.sleep(1.0)  # the keeper reads the record, its netlink socket subscribes
        flush_nat(pod_ns)
        wait_for(lambda: save_text(pod_ns, SAVE["nft"]) == upstream, "the repair", timeout=10)
        log = "".join(agent.log)
        assert log.count("keeper: waiting for the agent's API identity") == 1
        assert "no API configuration" not in log
        assert "keeper exited" not in log
