"""The keeper's metrics (issue 26): fixed label sets, the snapshot the keeper process sends
to the agent's parent (core/keeper.py rule 4), and the parent's end of it
(agent/keeper_process.py `KeeperProcess`: receive, render)."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator

import pytest

from multicall.agent.keeper_process import KeeperProcess
from multicall.core.keeper import (
    MAX_SNAPSHOT,
    KeeperMetrics,
    Reason,
    Refusal,
    decode_metrics,
    encode_metrics,
)

SAMPLE = re.compile(r"^(cnibox_agent_keeper_\w+)(\{[^}]*\})? (\S+)$")


def samples(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, line
        found[m.group(1) + (m.group(2) or "")] = m.group(3)
    return found


def busy() -> KeeperMetrics:
    metrics = KeeperMetrics()
    metrics.count_drift((Reason.MISSING_CHAIN, Reason.CHANGED))
    metrics.count_repair((Reason.MISSING_CHAIN,))
    metrics.count_refusal(Refusal.BACKED_OFF)
    metrics.count_event("Repairing")
    metrics.count_event("Something else")  # not an action the keeper posts: not a label
    metrics.watched["events"] = 3
    metrics.sweeps, metrics.restarts, metrics.repairs_delayed = 7, 2, 1
    metrics.detection.observe(0.004)
    metrics.repair_latency.observe(0.07)
    metrics.repair_latency.observe(100.0)
    return metrics


def test_every_labelled_family_has_its_whole_label_set_from_the_start() -> None:
    found = samples(KeeperMetrics().render())
    for reason in Reason:
        for family in ("drift_total", "repairs_total"):
            assert found[f'cnibox_agent_keeper_{family}{{reason="{reason.value}"}}'] == "0"
    for refusal in Refusal:
        assert found[f'cnibox_agent_keeper_refused_total{{reason="{refusal.value}"}}'] == "0"
    for via in ("events", "sweep"):
        assert found[f'cnibox_agent_keeper_sandboxes_watched{{via="{via}"}}'] == "0"
    for action in ("Repairing", "Reporting"):
        assert found[f'cnibox_agent_keeper_events_total{{action="{action}"}}'] == "0"
    assert found["cnibox_agent_keeper_repair_seconds_count"] == "0"
    # counting moves values, never the set of series
    assert set(samples(busy().render())) == set(found)


def test_a_snapshot_round_trips_to_the_same_text() -> None:
    metrics = busy()
    decoded = decode_metrics(encode_metrics(metrics, 4242))
    assert decoded is not None
    again, pid = decoded
    assert pid == 4242
    assert again.render() == metrics.render()
    text = samples(again.render())
    assert text['cnibox_agent_keeper_drift_total{reason="changed"}'] == "1"
    assert text['cnibox_agent_keeper_refused_total{reason="backed_off"}'] == "1"
    assert text['cnibox_agent_keeper_repair_seconds_bucket{le="0.1"}'] == "1"
    assert text['cnibox_agent_keeper_repair_seconds_bucket{le="+Inf"}'] == "2"
    assert text["cnibox_agent_keeper_restarts_total"] == "2"
    assert len(encode_metrics(metrics, 2**22)) < MAX_SNAPSHOT // 4


def _edit(path: tuple[str, ...], value: object) -> bytes:
    doc = json.loads(encode_metrics(busy(), 7))
    here = doc
    for key in path[:-1]:
        here = here[key]
    if value is KeyError:
        del here[path[-1]]
    else:
        here[path[-1]] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not json",
        b"[]",
        b"{}",
        b" " * (MAX_SNAPSHOT + 1),
        _edit(("drift", "a label of the caller's"), 1),  # outside the fixed set
        _edit(("drift", "changed"), KeyError),
        _edit(("drift", "changed"), -1),
        _edit(("drift", "changed"), True),
        _edit(("drift", "changed"), 1.5),
        _edit(("sweeps",), "7"),
        _edit(("pid",), -3),
        _edit(("repair", "buckets"), [0, 1]),  # not one per bound and +Inf
        _edit(("repair", "count"), 3),  # the buckets count 2
        _edit(("repair", "sum"), float("nan")),
        _edit(("repair", "sum"), -1.0),
        _edit(("detection",), KeyError),
        _edit(("events",), []),
    ],
)
def test_a_bad_snapshot_is_refused(data: bytes) -> None:
    assert decode_metrics(data) is None


@pytest.fixture
def feed() -> Iterator[tuple[KeeperProcess, int]]:
    ends = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    parent, keeper = (end.detach() for end in ends)
    os.set_blocking(parent, False)
    # as the agent sees its supervisor: the keeper process's parent (here: this test's)
    process = KeeperProcess(pid=os.getppid(), stop_w=-1, report_r=parent)
    try:
        yield process, keeper
    finally:
        os.close(keeper)
        os.close(parent)


def test_the_parent_keeps_the_last_valid_snapshot_and_reads_the_keepers_cost(
    feed: tuple[KeeperProcess, int],
) -> None:
    process, keeper = feed
    before = samples(process.render())
    assert before['cnibox_agent_keeper_drift_total{reason="changed"}'] == "0"
    assert "cnibox_agent_keeper_cpu_seconds_total" not in before  # no keeper has reported
    os.write(keeper, encode_metrics(busy(), os.getpid()))  # "the keeper" is this process
    os.write(keeper, b'{"drift": "forged"}')
    os.write(keeper, b"x" * (MAX_SNAPSHOT + 100))  # truncated on read: refused
    process.receive()
    process.receive()  # nothing waiting: returns at once
    after = samples(process.render())
    assert after['cnibox_agent_keeper_drift_total{reason="changed"}'] == "1"
    assert float(after["cnibox_agent_keeper_cpu_seconds_total"]) > 0
    assert int(after["cnibox_agent_keeper_resident_memory_bytes"]) > 1 << 20


def test_a_pid_that_is_not_the_supervisors_child_is_not_read(
    feed: tuple[KeeperProcess, int],
) -> None:
    process, keeper = feed
    os.write(keeper, encode_metrics(busy(), 1))  # init: not a child of the supervisor
    process.receive()
    text = samples(process.render())
    assert text["cnibox_agent_keeper_sweeps_total"] == "7"
    assert "cnibox_agent_keeper_cpu_seconds_total" not in text


@pytest.mark.parametrize(
    ("pod", "uid", "refusal"),
    [
        ({"metadata": {"uid": "u1"}}, "u1", None),
        ({"metadata": {"uid": "u1"}}, "", None),  # a record without the pod's UID
        ({"metadata": {"uid": "u2"}}, "u1", Refusal.POD_REPLACED),
        ({"metadata": {"uid": "u1", "deletionTimestamp": "2026-12-04T00:00:00Z"}}, "u1",
         Refusal.POD_TERMINATING),
        ({"metadata": "not an object"}, "u1", Refusal.POD_REPLACED),
    ],
)  # fmt: skip
def test_why_a_pod_no_longer_owns_its_sandbox(
    pod: dict[str, object], uid: str, refusal: Refusal | None
) -> None:
    from multicall.core.keeper import pod_gone

    assert pod_gone(pod, uid) is refusal
    if refusal is not None:
        metrics = KeeperMetrics()
        metrics.count_refusal(refusal)
        assert f'refused_total{{reason="{refusal.value}"}} 1' in metrics.render()


def test_the_parent_keeps_the_latest_keepers_channel_and_answers_on_it(
    feed: tuple[KeeperProcess, int],
) -> None:
    """agent/keeper_process.py rule 5: a keeper's channel arrives over the metrics socket;
    a restarted keeper's replaces it (the old end closed); anything else with descriptors
    is closed unread; questions are answered by the parent's answerer, EOF closes it."""
    from multicall.agent.keeper_process import CHANNEL, open_channel

    process, keeper = feed
    first = open_channel(keeper)
    assert first is not None
    process.receive()
    assert process.channel_fd() >= 0
    second = open_channel(keeper)  # the supervisor's next keeper
    assert second is not None
    process.receive()
    first.settimeout(1)
    assert first.recv(16) == b""  # the parent closed its end of the first keeper's channel
    stray_r, stray_w = os.pipe()
    with socket.socket(fileno=os.dup(keeper)) as sock:
        socket.send_fds(sock, [b"not " + CHANNEL], [stray_r])
    os.close(stray_r)
    process.receive()
    os.set_blocking(stray_w, False)
    with pytest.raises(BrokenPipeError):  # no reader left: the parent closed what it got
        os.write(stray_w, b"x")
    os.close(stray_w)
    second.send(b'Q{"n":1}')
    second.send(b"not a question")
    process.answer(lambda question: b"A" + question)
    second.settimeout(1)
    assert second.recv(100) == b'A{"n":1}'
    second.close()
    process.answer(lambda question: b"A")
    assert process.channel_fd() == -1
    first.close()
