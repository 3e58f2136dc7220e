"""The node's pod cache without a process or an API: its records, when it answers and why not,
its bounds, its relist, the parent's feed and a worker's question (docs/pod-cache.md)."""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any, cast

import pytest

from multicall.agent import pod_cache as agent_cache
from multicall.agent.pod_cache import AddStats, CachedPodApi, CacheFeed, ask_parent
from multicall.core.kube import pod_cache as core
from multicall.core.kube.objects import Namespace, Pod, Service, parse_pod
from multicall.core.kube.pod_cache import (
    MAX_PODS,
    MAX_RECORD,
    MISS_REASONS,
    NAMESPACES,
    PODS,
    CacheMetrics,
    PodCache,
    reduce_pod,
    render_cache,
)
from tests.support import REPO
from tests.support.pods import MESHED, NOT_INJECTED, WITH_INIT

CLUSTER = core.cluster_identity("10.96.0.1:443", "https", "", "PEM")
NOW = 1000.0


def pod(name: str, uid: str = "", **annotations: str) -> dict[str, Any]:
    doc = copy.deepcopy(MESHED)
    doc["metadata"]["name"] = name
    doc["metadata"]["uid"] = uid or f"uid-{name}"
    doc["metadata"].setdefault("annotations", {}).update(annotations)
    doc["spec"]["nodeName"] = "node-a"
    return doc


def synced(*pods: dict[str, Any], namespaces: tuple[dict[str, Any], ...] = ()) -> PodCache:
    cache = PodCache()
    feed: list[dict[str, Any]] = [{"k": "cluster", "id": CLUSTER}]
    for watch, objects in ((PODS, pods), (NAMESPACES, namespaces)):
        feed.append({"k": "init", "w": watch})
        feed += [{"k": "put", "w": watch, "o": o} for o in objects]
        feed.append({"k": "done", "w": watch})
    for message in feed:
        cache.feed(message, NOW)
    return cache


def lookup(cache: PodCache, doc: dict[str, Any], *, uid: str | None = None, now: float = NOW,
           cluster: str = CLUSTER) -> core.Lookup:  # fmt: skip
    meta = doc["metadata"]
    return cache.lookup_pod(
        meta["namespace"], meta["name"], meta["uid"] if uid is None else uid, cluster, now
    )


@pytest.mark.parametrize("doc", [MESHED, WITH_INIT, NOT_INJECTED], ids=["meshed", "init", "plain"])
def test_a_record_parses_as_the_object_it_came_from(doc: dict[str, Any]) -> None:
    full = {**copy.deepcopy(doc), "status": {"phase": "Running"}}
    full["metadata"]["uid"] = "u1"
    full["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:x": {}}}]
    record = reduce_pod(full)
    assert record is not None
    assert parse_pod(record) == parse_pod(full)
    assert "managedFields" not in json.dumps(record)
    assert "status" not in record
    assert reduce_pod(record) == record  # the parent reduces again: the same


def test_the_cache_answers_a_pod_of_the_runtimes_uid_when_synced_and_live() -> None:
    web = pod("web")
    cache = synced(web)
    found = lookup(cache, web)
    assert found.miss == ""
    assert found.record is not None
    assert parse_pod(found.record) == parse_pod(web)


def test_every_other_case_asks_the_api() -> None:
    web = pod("web")
    cache = synced(web)
    assert lookup(cache, web, uid="").miss == core.NO_UID
    assert lookup(cache, web, uid="uid-older").miss == core.OTHER_UID
    assert lookup(cache, pod("new")).miss == core.NOT_CACHED
    assert lookup(cache, web, cluster="").miss == core.OTHER_CLUSTER
    other = core.cluster_identity("10.96.0.1:443", "https", "", "ANOTHER CA")
    assert lookup(cache, web, cluster=other).miss == core.OTHER_CLUSTER
    assert lookup(cache, web, now=NOW + core.BEAT_MAX + 0.1).miss == core.WATCH_DOWN
    assert lookup(PodCache(cluster=CLUSTER), web).miss == core.NOT_SYNCED
    cache.feed({"k": "down", "w": PODS}, NOW)
    assert lookup(cache, web).miss == core.WATCH_DOWN


def test_a_kubeconfig_verifying_another_server_name_is_another_cluster() -> None:
    """tls-server-name is part of the trust (rule 2): the cache built from one kubeconfig
    does not answer a caller whose TLS verifies (and sends as SNI) another name, which the
    server's certificate may refuse. Naming the host itself is the same trust as no name."""
    from dataclasses import replace

    from multicall.agent.pod_cache import config_identity
    from multicall.core.kube.kubeconfig import KubeConfig

    base = KubeConfig(server="https://10.96.0.1:443", token="t", ca_data=b"PEM")
    same = config_identity(base)
    assert config_identity(KubeConfig(server="https://10.96.0.1:443", ca_data=b"PEM")) == same
    assert config_identity(replace(base, tls_server_name="10.96.0.1")) == same
    others = [
        replace(base, tls_server_name="kubernetes.default.svc"),
        replace(base, ca_data=b"ANOTHER CA"),
        replace(base, server="https://10.96.0.1:6443"),
        replace(base, server="https://10.96.0.1:443/prefix"),
    ]
    assert [config_identity(o) == same for o in others] == [False] * len(others)
    named = replace(base, server="https://Kube.Example:443")
    assert config_identity(replace(named, tls_server_name="kube.example")) == (
        config_identity(named)
    )


def test_a_relist_answers_nothing_until_it_completes_and_forgets_what_it_did_not_list() -> None:
    a, b = pod("a"), pod("b")
    cache = synced(a, b)
    cache.feed({"k": "init", "w": PODS}, NOW)  # a 410 Gone: listing again
    assert lookup(cache, a).miss == core.WATCH_DOWN
    cache.feed({"k": "put", "w": PODS, "o": a}, NOW)
    assert lookup(cache, a).miss == core.WATCH_DOWN
    cache.feed({"k": "done", "w": PODS}, NOW)
    assert lookup(cache, a).record is not None
    assert lookup(cache, b).miss == core.NOT_CACHED  # deleted while the watch was gone
    assert cache.stores[PODS].relists == 2


def test_watch_events_update_and_delete() -> None:
    a = pod("a")
    cache = synced(a)
    changed = pod("a", **{"config.linkerd.io/skip-inbound-ports": "4000"})
    cache.feed({"k": "put", "w": PODS, "o": changed}, NOW)
    record = lookup(cache, a).record
    assert record is not None
    assert parse_pod(record).annotation("config.linkerd.io/skip-inbound-ports") == "4000"
    cache.feed({"k": "del", "w": PODS, "o": changed}, NOW)
    assert lookup(cache, a).miss == core.NOT_CACHED


def test_namespaces_answer_under_the_same_terms() -> None:
    ns = {"kind": "Namespace", "metadata": {"name": "emojivoto", "annotations": {"x": "1"}}}
    cache = synced(namespaces=(ns,))
    found = cache.lookup_namespace("emojivoto", CLUSTER, NOW)
    assert found.record is not None
    assert json.loads(json.dumps(found.record))["metadata"]["annotations"] == {"x": "1"}
    assert cache.lookup_namespace("other", CLUSTER, NOW).miss == core.NOT_CACHED
    assert cache.lookup_namespace("emojivoto", "", NOW).miss == core.OTHER_CLUSTER


def test_memory_is_bounded_by_count_record_and_bytes() -> None:
    pods = [pod(f"p{i}") for i in range(MAX_PODS + 50)]
    cache = synced(*pods)
    store = cache.stores[PODS]
    assert len(store.objects) == MAX_PODS
    assert store.dropped == 50
    assert lookup(cache, pods[-1]).miss == core.NOT_CACHED  # not kept: the API answers
    # A record that grows past MAX_RECORD is dropped, its older version with it.
    big = pod("p0", filler="z" * MAX_RECORD)
    cache.feed({"k": "put", "w": PODS, "o": big}, NOW)
    assert lookup(cache, pods[0]).miss == core.NOT_CACHED
    # The process sends a "drop" for it (its identity only): the same outcome.
    cache.feed({"k": "put", "w": PODS, "o": pods[1]}, NOW)
    drop = {"metadata": {k: pods[1]["metadata"][k] for k in ("name", "namespace", "uid")}}
    cache.feed({"k": "drop", "w": PODS, "o": drop}, NOW)
    assert lookup(cache, pods[1]).miss == core.NOT_CACHED
    # Bytes: records of 60 KiB stop well below MAX_PODS.
    fat = [pod(f"f{i}", filler="y" * (60 * 1024)) for i in range(700)]
    cache = synced(*fat)
    store = cache.stores[PODS]
    assert store.size <= core.MAX_BYTES
    assert len(store.objects) < 700
    assert store.size == sum(core.record_size(r) for r in store.objects.values())


def test_miss_reasons_in_the_source_are_all_labels() -> None:
    """A reason a lookup or a worker can give is one of MISS_REASONS (the metric's fixed
    label set); an unknown one counts as "no answer"."""
    used = set()
    for path in ("multicall/core/kube/pod_cache.py", "multicall/agent/pod_cache.py"):
        text = (REPO / path).read_text()
        used |= set(re.findall(r"miss=([A-Z_]+)\b", text))
        used |= set(re.findall(r"return ([A-Z_]+)\n", text))
    values = {getattr(core, name) for name in used}
    assert values
    assert values <= MISS_REASONS
    metrics = CacheMetrics()
    metrics.add_served("api", "something new", 2)
    metrics.add_served("cache", "", 0)
    text = render_cache(metrics, synced(pod("a")))
    for reason in MISS_REASONS:
        assert f'cnibox_agent_pod_cache_misses_total{{reason="{reason}"}}' in text
    assert 'cnibox_agent_pod_cache_misses_total{reason="no answer"} 1' in text
    assert 'cnibox_agent_pod_cache_adds_total{source="cache"} 1' in text
    assert "cnibox_agent_add_api_requests_total 2" in text
    assert 'cnibox_agent_pod_cache_objects{resource="pods"} 1' in text


def test_the_parents_feed_reads_lines_drops_junk_and_answers_with_the_question_number() -> None:
    r, w = os.pipe2(os.O_NONBLOCK)
    feed = CacheFeed(r)
    web = pod("web")
    lines = [
        {"k": "cluster", "id": CLUSTER},
        {"k": "init", "w": PODS},
        {"k": "put", "w": PODS, "o": web},
        {"k": "done", "w": PODS},
    ]
    data = b"not json\n" + b"".join(json.dumps(m).encode() + b"\n" for m in lines)
    data += b"[1]\n" + b"x" * (agent_cache.MAX_LINE + 10) + b"\n"
    os.write(w, data[:50])
    assert feed.read(NOW)
    os.write(w, data[50:])
    assert feed.read(NOW)
    meta = web["metadata"]
    question = {"what": "pod", "ns": meta["namespace"], "name": meta["name"], "n": 7,
                "uid": meta["uid"], "cluster": CLUSTER}  # fmt: skip
    answer = json.loads(feed.answer(json.dumps(question).encode(), NOW)[1:])
    assert answer["n"] == 7
    assert parse_pod(answer["doc"]) == parse_pod(web)
    assert feed.answer(b"\xff", NOW) == b"A{}"
    os.close(w)
    assert not feed.read(NOW)
    assert not feed.open
    os.close(r)


def test_a_worker_question_ignores_stale_answers_and_gives_up_in_time() -> None:
    worker, parent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with worker, parent:

        def serve() -> None:
            msg = parent.recv(4096)
            number = json.loads(msg[1:])["n"]
            parent.send(b'A{"n": 1, "miss": "stale"}')  # an answer to an earlier question
            parent.send(b"R")  # not an answer at all
            parent.send(b"A" + json.dumps({"n": number, "doc": {"x": 1}}).encode())

        thread = threading.Thread(target=serve)
        thread.start()
        assert ask_parent(worker, {"what": "pod"}, 2) == {"n": 2, "doc": {"x": 1}}
        thread.join()
        assert ask_parent(worker, {"what": "pod"}, 3) is None  # nobody answers: ASK_TIMEOUT
        assert worker.gettimeout() is None


class CountingApi:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_pod(self, namespace: str, name: str) -> Pod:
        self.calls.append("pod")
        return parse_pod(pod(name))

    def get_namespace(self, name: str) -> Namespace:
        self.calls.append("namespace")
        return Namespace(name, {})

    def get_service(self, namespace: str, name: str) -> Service:
        self.calls.append("service")
        return Service(name, namespace)

    def close(self) -> None:
        self.calls.append("close")


def test_cached_pod_api_counts_what_it_asks_the_api() -> None:
    web = pod("web")
    ns = {"kind": "Namespace", "metadata": {"name": web["metadata"]["namespace"]}}
    cache = synced(web, namespaces=(ns,))

    def ask(question: dict[str, object]) -> dict[str, object] | None:
        return cache.answer(question, NOW)

    client, stats = CountingApi(), AddStats()
    api = CachedPodApi(client, ask, CLUSTER, "uid-web", stats)
    assert api.get_pod(web["metadata"]["namespace"], "web") == parse_pod(web)
    api.get_namespace(web["metadata"]["namespace"])
    assert client.calls == []
    assert stats.report() == {"pod_source": "cache", "miss": "", "api_requests": 0}
    client, stats = CountingApi(), AddStats()
    api = CachedPodApi(client, None, "", "uid-web", stats)
    api.get_pod("emojivoto", "web")
    api.get_namespace("emojivoto")
    api.get_service("default", "kubernetes")
    assert client.calls == ["pod", "namespace", "service"]
    assert stats.report() == {"pod_source": "api", "miss": core.NO_CACHE, "api_requests": 3}
    assert AddStats().report() == {}  # no pod read (a pod without a name): not counted


class FakeSession:
    """A Session's two calls the cache process makes: LIST pages and a WATCH's lines."""

    def __init__(self, pages: list[dict[str, Any]], lines: list[bytes | None]) -> None:
        self.pages = pages
        self.lines = lines
        self.paths: list[str] = []

    def request(self, method: str, path: str, **_: Any) -> Any:
        from multicall.effects.kube.stream import Response

        self.paths.append(path)
        return Response(200, json.dumps(self.pages.pop(0)).encode(), path)

    def watch_lines(self, path: str, timeout_seconds: float) -> Iterator[bytes | None]:
        self.paths.append(path)
        yield from self.lines


def test_the_cache_process_sends_a_list_then_events_and_drops_what_is_too_large() -> None:
    from multicall.agent.pod_cache_process import cursor_for, step
    from multicall.errors import KubeError

    small, large = pod("small"), pod("large", filler="z" * MAX_RECORD)
    page = {"metadata": {"resourceVersion": "10"}, "items": [small, large]}
    event = {"type": "MODIFIED", "object": {**pod("small", x="1"),
             "metadata": {**pod("small", x="1")["metadata"], "resourceVersion": "11"}}}  # fmt: skip
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    session = FakeSession([page], [json.dumps(event).encode(), json.dumps(gone).encode()])
    sent: list[Mapping[str, Any]] = []
    cursor = cursor_for(PODS, "node-a")
    step(session, cursor, PODS, sent.append)  # type: ignore[arg-type]
    assert [m["k"] for m in sent] == ["init", "put", "drop", "done"]
    assert sent[2]["o"] == {"metadata": {"name": "large", "namespace": "emojivoto",
                                         "uid": "uid-large"}}  # fmt: skip
    assert "fieldSelector=spec.nodeName%3Dnode-a" in session.paths[0]
    with pytest.raises(KubeError, match="too old"):
        step(session, cursor, PODS, sent.append)  # type: ignore[arg-type]
    assert sent[4]["k"] == "put"
    assert sent[4]["o"]["metadata"]["annotations"]["x"] == "1"
    assert "resourceVersion=10" in session.paths[1]
    assert cursor.phase.value == "list"  # 410: a new LIST next
    cache = PodCache(cluster=CLUSTER)
    for message in sent:
        cache.feed(message, NOW)
    assert lookup(cache, small).record is not None
    assert cache.stores[PODS].dropped == 1
    session = FakeSession([], [None])  # an event over the size limit: lost, so down
    cursor = cursor_for(PODS, "node-a")
    cursor.list_page({"metadata": {"resourceVersion": "12"}, "items": []})
    with pytest.raises(KubeError, match="size limit"):
        step(session, cursor, PODS, sent.append)  # type: ignore[arg-type]


def test_a_terminating_pods_record_keeps_its_deletion_timestamp() -> None:
    doc = pod("web")
    assert "deletionTimestamp" not in json.dumps(reduce_pod(doc))
    doc["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    record = reduce_pod(doc)
    assert record is not None
    assert record["metadata"]["deletionTimestamp"] == "2026-12-05T00:00:00Z"  # type: ignore[index]
    assert parse_pod(record) == parse_pod(doc)


def test_the_keeper_asks_the_cache_whether_the_pod_is_gone_then_the_api() -> None:
    """agent/keeper.py `CachedPods`: a record of the recorded UID answers (a terminating one
    refused as the API's object is); no record, another UID, a cache that cannot answer: the
    API's GET, as without a cache."""
    from multicall.agent.keeper import CachedPods
    from multicall.core.keeper import Refusal, SandboxRecord

    web, old = pod("web"), pod("old")
    dying = pod("dying")
    dying["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    cache = synced(web, old, dying)
    asked_api: list[str] = []

    class Api:
        def gone(self, record: SandboxRecord) -> Refusal | None:
            asked_api.append(record.pod)
            return Refusal.POD_GONE

    def record(name: str, uid: str) -> SandboxRecord:
        return cast(
            SandboxRecord, type("R", (), {"namespace": "emojivoto", "pod": name, "uid": uid})
        )

    def ask(question: dict[str, object]) -> dict[str, object]:
        return cache.answer(question, NOW)

    pods = CachedPods(cast(Any, Api()), ask, lambda: CLUSTER)
    assert pods.gone(record("web", "uid-web")) is None
    assert pods.gone(record("dying", "uid-dying")) is Refusal.POD_TERMINATING
    assert asked_api == []
    assert pods.gone(record("old", "uid-newer")) is Refusal.POD_GONE  # the API says so
    assert pods.gone(record("new", "uid-new")) is Refusal.POD_GONE
    assert pods.gone(record("web", "")) is Refusal.POD_GONE
    assert CachedPods(cast(Any, Api()), ask, lambda: "").gone(record("web", "uid-web")) is (
        Refusal.POD_GONE
    )  # another cluster
    assert (
        CachedPods(cast(Any, Api()), lambda q: None, lambda: CLUSTER).gone(record("web", "uid-web"))
        is Refusal.POD_GONE
    )  # no answer in time
    assert asked_api == ["old", "new", "web", "web", "web"]


KUBERNETES = {
    "kind": "Service",
    "apiVersion": "v1",
    "metadata": {"name": "kubernetes", "namespace": "default", "uid": "s1",
                 "resourceVersion": "9", "labels": {"component": "apiserver"}},
    "spec": {"clusterIP": "10.96.0.1", "ports": [
        {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
}  # fmt: skip


@pytest.mark.parametrize(
    "spec",
    [
        KUBERNETES["spec"],
        {"ports": [{"port": "443"}]},  # parse_service's errors are the record's too
        {"ports": "443"},
        {"ports": [443]},
        {},
        None,
    ],
)
def test_a_service_record_parses_as_the_service_it_came_from(spec: object) -> None:
    from multicall.core.kube.objects import parse_service
    from multicall.errors import ConfigError

    doc = {**KUBERNETES, "spec": spec} if spec is not None else {
        k: v for k, v in KUBERNETES.items() if k != "spec"
    }  # fmt: skip
    record = core.reduce_service(doc)
    assert record is not None
    assert core.reduce_service(record) == record
    assert "clusterIP" not in json.dumps(record)

    def parsed(d: Mapping[str, object]) -> object:
        try:
            return parse_service(d)
        except ConfigError as exc:
            return exc.message

    assert parsed(record) == parsed(doc)


def test_the_kubernetes_service_is_answered_when_its_watch_is_synced_and_live() -> None:
    from multicall.core.kube.objects import ServicePort

    web = pod("web")
    cache = synced(web)
    question = {"what": "service", "ns": "default", "name": "kubernetes", "cluster": CLUSTER}
    assert cache.answer(question, NOW) == {"miss": core.NOT_SYNCED}
    for message in ({"k": "init", "w": core.SERVICES}, {"k": "put", "w": core.SERVICES,
                    "o": KUBERNETES}, {"k": "done", "w": core.SERVICES}):  # fmt: skip
        cache.feed(message, NOW)
    assert cache.answer({**question, "name": "other"}, NOW) == {"miss": core.NOT_CACHED}
    assert cache.answer({**question, "cluster": ""}, NOW) == {"miss": core.OTHER_CLUSTER}
    calls: list[str] = []
    client = CountingApi()
    stats = AddStats()
    api = CachedPodApi(client, lambda q: cache.answer(q, NOW), CLUSTER, "uid-web", stats)
    service = api.get_service("default", "kubernetes")
    assert service.ports == (ServicePort(443, 6443),)
    assert client.calls == calls
    assert stats.api_requests == 0
    api.get_service("default", "other")  # not watched: the API
    assert client.calls == ["service"]
    assert stats.api_requests == 1
