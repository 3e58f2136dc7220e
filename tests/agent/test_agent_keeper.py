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
        for task in os.listdir(f"/proc/{here}/task"):
            with open(f"/proc/{here}/task/{task}/children") as f:
                kids = {int(p) for p in f.read().split()}
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
    assert set(descendants(agent.pid)) == set(agent.workers())  # no keeper process
    flush_nat(pod_ns)
    time.sleep(2.0)
    assert save_text(pod_ns, SAVE["nft"]) != fixture_text("default-nft")
    assert "keeper started" not in "".join(agent.log)
