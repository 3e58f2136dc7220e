"""The agent's lazy API identity (docs/agent.md "The agent's API identity"): the retry
schedule with an injected clock and jitter, what is logged, the file read by the pod cache
and the keeper (agent/identity.py) missing, malformed, then written, then rewritten; the
parent's pod cache state; the flag's refusals. No sleeping: the sleep is the test's."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicall.agent.identity import KubeconfigSource
from multicall.applets.linkerd_cni_agent import parse_args
from multicall.core.agent_identity import CAP, IdentityWait, Problem
from multicall.core.backoff import INITIAL
from multicall.core.kube.pod_cache import NOT_SYNCED, PODS, CacheMetrics, PodCache, render_cache
from multicall.errors import UsageError


def kubeconfig(token: str, server: str = "https://127.0.0.1:6443") -> str:
    return (
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
        f"    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n"
        f"  user:\n    token: {token}\ncontexts:\n- name: x\n  context:\n    cluster: c\n"
        "    user: u\ncurrent-context: x\n"
    )


def test_the_schedule_is_the_backoff_capped_and_logs_once_per_kind_of_problem() -> None:
    wait = IdentityWait("pod cache", "/etc/cni/net.d/k")
    clock = 100.0
    delays, lines = [], []
    for problem in [Problem.MISSING] * 6 + [Problem.UNUSABLE] * 2 + [Problem.MISSING]:
        delay, line = wait.failed(clock, 0.0, problem, "not a kubeconfig")
        delays.append(delay)
        lines.append(line)
        clock += delay
    # core/backoff.py's schedule (first retry at once, then doubling), capped at CAP
    assert delays == [0.0, INITIAL, 1.6, 3.2, CAP, CAP, CAP, CAP, CAP]
    logged = [line for line in lines if line]
    assert len(logged) == 3  # missing, unusable, missing again: one line each
    assert "kubeconfig /etc/cni/net.d/k does not exist yet" in logged[0]
    assert "ADDs are served meanwhile" in logged[0]
    assert "cannot be used yet (not a kubeconfig)" in logged[1]
    assert wait.loaded() == (
        "pod cache: kubeconfig /etc/cni/net.d/k loaded after 9 failed attempts; starting"
    )


def test_jitter_stays_within_twice_the_delay_and_nothing_is_logged_without_a_wait() -> None:
    wait = IdentityWait("keeper", "k")
    assert wait.loaded() == ""  # loaded at the first attempt: nothing to say
    worst = [wait.failed(0.0, 0.999, Problem.MISSING, "")[0] for _ in range(8)]
    assert worst[0] == 0.0
    assert max(worst) < 2 * CAP


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []


def test_the_source_waits_through_missing_and_malformed_files_then_loads(tmp_path: Path) -> None:
    path = tmp_path / "ZZZ-linkerd-cni-kubeconfig"
    logs: list[tuple[str, str]] = []
    source = KubeconfigSource(str(path), "keeper", lambda level, msg: logs.append((level, msg)))
    clock = Clock()
    # What appears on disk before each retry: nothing twice, a half-written file, the file.
    script = [None, None, "apiVersion: v1\nclusters: [", kubeconfig("t1")]

    def sleep(seconds: float) -> bool:
        clock.slept.append(seconds)
        clock.now += seconds
        step = script[len(clock.slept)]
        if step is not None:
            path.write_text(step)
        return False

    config = source.wait(sleep, now=lambda: clock.now, draw=lambda: 0.0)
    assert config is not None
    assert config.token == "t1"
    assert clock.slept == [0.0, INITIAL, 1.6]
    assert [level for level, _ in logs] == ["warning", "warning", "info"]
    assert "does not exist yet" in logs[0][1]
    assert "cannot be used yet" in logs[1][1]
    assert "loaded after 3 failed attempts" in logs[2][1]
    assert source.generation == 1


def test_a_stop_ends_the_wait(tmp_path: Path) -> None:
    source = KubeconfigSource(str(tmp_path / "never"), "pod cache", lambda *_: None)
    slept: list[float] = []

    def sleep(seconds: float) -> bool:
        slept.append(seconds)
        return len(slept) == 3

    assert source.wait(sleep, now=lambda: 0.0, draw=lambda: 0.0) is None
    assert len(slept) == 3


def test_a_rewritten_kubeconfig_is_loaded_again_and_a_broken_rewrite_keeps_the_old(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig("t1"))
    logs: list[str] = []
    source = KubeconfigSource(str(path), "keeper", lambda _level, msg: logs.append(msg))
    assert source.wait(lambda _s: False) is not None
    assert logs == []  # loaded at once: nothing logged
    config, generation = source.current()
    assert (config.token, generation) == ("t1", 1)
    # install-cni writes a new file and renames it over the old one (a new inode)
    (tmp_path / "new").write_text(kubeconfig("t2"))
    (tmp_path / "new").rename(path)
    config, generation = source.current()
    assert (config.token, generation) == ("t2", 2)
    assert "changed; reloaded" in logs[-1]
    path.write_text("not: [a kubeconfig")  # mid-write
    assert source.current() == (config, 2)
    assert "cannot be used" in logs[-1]
    count = len(logs)
    assert source.current() == (config, 2)
    assert len(logs) == count  # the same broken file is not reported twice
    path.unlink()
    assert source.current() == (config, 2)  # gone: the token loaded may still work


def test_the_parent_cache_shows_the_wait_and_drops_what_another_cluster_listed() -> None:
    cache = PodCache()
    cache.feed({"k": "identity", "waiting": True}, 0.0)
    assert "cnibox_agent_pod_cache_identity_waiting 1\n" in render_cache(CacheMetrics(), cache)
    assert cache.lookup_pod("ns", "p", "u", "c1", 0.0).miss == NOT_SYNCED
    cache.feed({"k": "identity", "waiting": False}, 0.0)
    assert "cnibox_agent_pod_cache_identity_waiting 0\n" in render_cache(CacheMetrics(), cache)
    assert "cnibox_agent_pod_cache_identity_waiting 0\n" in render_cache(CacheMetrics(), None)
    cache.feed({"k": "cluster", "id": "c1"}, 0.0)
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u"}}
    for message in ({"k": "init", "w": PODS}, {"k": "put", "w": PODS, "o": pod}):
        cache.feed(message, 0.0)
    cache.feed({"k": "done", "w": PODS}, 0.0)
    assert cache.lookup_pod("ns", "p", "u", "c1", 0.0).record is not None
    cache.feed({"k": "cluster", "id": "c1"}, 0.5)  # the same cluster again: kept
    assert cache.lookup_pod("ns", "p", "u", "c1", 0.5).record is not None
    cache.feed({"k": "cluster", "id": "c2"}, 1.0)
    assert cache.lookup_pod("ns", "p", "u", "c2", 1.0).miss == NOT_SYNCED
    assert cache.stores[PODS].objects == {}


def test_a_kubeconfig_not_written_yet_is_accepted_and_empty_or_a_directory_refused(
    tmp_path: Path,
) -> None:
    later = str(tmp_path / "net.d" / "ZZZ-linkerd-cni-kubeconfig")
    assert parse_args(["--kubeconfig", later])["kubeconfig"] == later
    assert parse_args([])["kubeconfig"] == ""  # left out: the service account, else none
    for value, words in (("", "leave the flag out"), (str(tmp_path), "is a directory")):
        with pytest.raises(UsageError) as caught:
            parse_args(["--kubeconfig", value])
        assert "--kubeconfig" in caught.value.message
        assert words in caught.value.message
