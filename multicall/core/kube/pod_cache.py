"""The node agent's pod cache as pure state: the pods bound to this node, the namespaces and
the `default/kubernetes` service, as three watches (core/kube/watch.py) report them, reduced
to what an ADD reads; when the cache may answer an ADD's GET, and why not otherwise; its
metrics (docs/pod-cache.md).

Rules of this module:
1. A record keeps only the fields `core/kube/objects.py` parses (names of containers and
   init containers, annotations, labels) plus the identity the cache checks (uid,
   resourceVersion, spec.nodeName) and, when set, deletionTimestamp (the keeper does not
   repair a terminating pod: core/keeper.py `pod_gone`). `parse_pod` of a record equals
   `parse_pod` of the object. A service's keeps its name, namespace, resourceVersion and
   each port's `port` and `targetPort` (what `parse_service` reads): `parse_service` of a
   record is that of the object, its errors included.
2. Memory is bounded: at most MAX_PODS pods and MAX_NAMESPACES namespaces, each record at
   most MAX_RECORD bytes of JSON, and MAX_BYTES of records per resource. What does not fit
   is not kept (an older version of it is dropped too): a lookup then misses and the ADD
   asks the API, as it would without a cache.
3. A relist (the first LIST, or after 410 Gone or a failed watch) starts from nothing at its
   Init and counts as down until its InitDone (kube-rs's reflector: Init, InitApply,
   InitDone): nothing is answered from a list half read, and memory holds one generation.
4. The cache answers a pod GET only when every condition of `lookup_pod` holds; anything else
   is a miss with a reason from MISS_REASONS, and the ADD asks the API.
5. A cache process that names another cluster than the one it named before (the agent's
   kubeconfig now reaches another server, or trusts it otherwise) empties every store: what
   was listed with one identity never answers a caller of another. While the process
   waits for the agent's kubeconfig (docs/agent.md), it says so (`waiting`): not synced,
   and a gauge, not an unready agent (ADDs are served, from the API).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from multicall.core.openmetrics import text_family

PODS = "pods"
NAMESPACES = "namespaces"
SERVICES = "services"  # `default/kubernetes` only: a control-plane pod's ADD reads it
WATCHES = (PODS, NAMESPACES, SERVICES)
# The kubelet's --max-pods is 110 by default and rarely above 250: twice the largest node
# seen, with room for pods still listed while their replacements start.
MAX_PODS = 2048
MAX_NAMESPACES = 10_000
MAX_SERVICES = 4  # the watch selects one object by name
# A record is a pod's annotations, labels and a few names: Linkerd's injector writes under
# 2 KiB of annotations. kube-apiserver allows 256 KiB of them; a pod above MAX_RECORD is not
# cached (its ADD reads the API) so that an answer fits one control message of a worker.
MAX_RECORD = 64 * 1024
MAX_BYTES = 32 * 1024 * 1024  # of records, per resource
# The cache process reports every BEAT seconds; a parent that heard nothing for BEAT_MAX
# takes its watches as down (the process is stuck or gone).
BEAT = 1.0
BEAT_MAX = 5.0

# Why an ADD's GET went to the API (the metric's `reason` label: a fixed set, rule 4).
NO_UID = "no pod uid"  # CNI_ARGS carried no K8S_POD_UID: which pod is meant is not known
NO_CACHE = "no cache"  # the agent runs without one (no API configuration, no node name)
OTHER_CLUSTER = "other cluster"  # the config's kubeconfig is not the cache's API server
NOT_SYNCED = "not synced"  # the first LIST (or a relist after 410) has not completed
WATCH_DOWN = "watch down"  # the watch failed, is being re-established, or no beat
NOT_CACHED = "not cached"  # no such pod (namespace) bound to this node, yet
OTHER_UID = "other uid"  # the cache holds an older pod of that name
NO_ANSWER = "no answer"  # the agent's parent did not answer in time
MISS_REASONS = frozenset(
    {NO_UID, NO_CACHE, OTHER_CLUSTER, NOT_SYNCED, WATCH_DOWN, NOT_CACHED, OTHER_UID, NO_ANSWER}
)
SOURCES = ("cache", "api")  # where an ADD's pod came from


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def _names(value: object) -> list[dict[str, str]]:
    if not isinstance(value, list):
        return []
    return [{"name": str(c.get("name", ""))} for c in value if isinstance(c, Mapping)]


def _meta(doc: Mapping[str, object]) -> Mapping[str, object]:
    meta = doc.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def reduce_pod(doc: Mapping[str, object]) -> dict[str, object] | None:
    """A pod's record (rule 1), or None when it is not a pod with a name and uid."""
    meta = _meta(doc)
    spec = doc.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    if not (isinstance(name, str) and isinstance(namespace, str) and isinstance(uid, str)):
        return None
    if not (name and namespace and uid):
        return None
    version = meta.get("resourceVersion")
    node = spec.get("nodeName")
    kept: dict[str, object] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": version if isinstance(version, str) else "",
        "annotations": _strings(meta.get("annotations")),
        "labels": _strings(meta.get("labels")),
    }
    deleting = meta.get("deletionTimestamp")
    if isinstance(deleting, str) and deleting:
        kept["deletionTimestamp"] = deleting
    return {
        "kind": "Pod",
        "metadata": kept,
        "spec": {
            "nodeName": node if isinstance(node, str) else "",
            "containers": _names(spec.get("containers")),
            "initContainers": _names(spec.get("initContainers")),
        },
    }


def reduce_namespace(doc: Mapping[str, object]) -> dict[str, object] | None:
    meta = _meta(doc)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    version = meta.get("resourceVersion")
    return {
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "resourceVersion": version if isinstance(version, str) else "",
            "annotations": _strings(meta.get("annotations")),
        },
    }


def reduce_service(doc: Mapping[str, object]) -> dict[str, object] | None:
    """A service's record (rule 1): its ports as `parse_service` reads them, anything that is
    not a port object kept as it is (so a malformed service fails the same way)."""
    meta = _meta(doc)
    name, namespace = meta.get("name"), meta.get("namespace")
    if not (isinstance(name, str) and isinstance(namespace, str) and name and namespace):
        return None
    version = meta.get("resourceVersion")
    spec = doc.get("spec")
    if isinstance(spec, Mapping):
        ports = spec.get("ports")
        if isinstance(ports, list):
            ports = [
                {k: p[k] for k in ("port", "targetPort") if k in p} if isinstance(p, Mapping) else p
                for p in ports
            ]
        spec = {"ports": ports} if "ports" in spec else {}
    record: dict[str, object] = {
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": version if isinstance(version, str) else "",
        },
    }
    if spec is not None:
        record["spec"] = spec
    return record


def record_size(record: Mapping[str, object]) -> int:
    return len(json.dumps(record, separators=(",", ":")))


REDUCE = {PODS: reduce_pod, NAMESPACES: reduce_namespace, SERVICES: reduce_service}
LIMITS = {PODS: MAX_PODS, NAMESPACES: MAX_NAMESPACES, SERVICES: MAX_SERVICES}


def key_of(watch: str, record: Mapping[str, object]) -> str:
    meta = _meta(record)
    name = str(meta.get("name", ""))
    return name if watch == NAMESPACES else f"{meta.get('namespace', '')}/{name}"


@dataclass(frozen=True, slots=True)
class Lookup:
    """A lookup's outcome: the record (the cache answers) or why not (the API does)."""

    record: Mapping[str, object] | None = None
    miss: str = ""


@dataclass
class Store:
    """One watch's objects and state (rules 2-3)."""

    limit: int
    objects: dict[str, Mapping[str, object]] = field(default_factory=dict)
    listing: dict[str, Mapping[str, object]] | None = None  # a relist in progress
    synced: bool = False  # a LIST completed at least once
    live: bool = False  # the watch is open (from the LIST's end to its next failure)
    dropped: int = 0  # objects not kept: over the bounds (rule 2)
    relists: int = 0
    sizes: dict[str, int] = field(default_factory=dict)  # of `objects` and `listing` both
    size: int = 0  # their sum

    def target(self) -> dict[str, Mapping[str, object]]:
        return self.listing if self.listing is not None else self.objects

    def put(self, key: str, record: Mapping[str, object] | None, size: int) -> None:
        """Keep `record` under `key` when it fits (rule 2); else drop what was there."""
        target = self.target()
        self.remove(key)
        if record is None:
            return
        if size > MAX_RECORD or len(target) >= self.limit or self.size + size > MAX_BYTES:
            self.dropped += 1
            return
        target[key] = record
        self.sizes[key] = size
        self.size += size

    def remove(self, key: str) -> None:
        if self.target().pop(key, None) is not None:
            self.size -= self.sizes.pop(key, 0)

    def begin_list(self) -> None:
        """A relist: the old objects answer nothing more (the watch is down) and their
        budget goes to the new list's."""
        self.objects, self.listing, self.sizes, self.size = {}, {}, {}, 0
        self.live = False
        self.relists += 1


@dataclass
class PodCache:
    """The parent's cache: the two stores, the cluster it was built from, the last beat."""

    stores: dict[str, Store] = field(default_factory=lambda: {w: Store(LIMITS[w]) for w in WATCHES})
    cluster: str = ""  # `cluster_identity` of the cache's API configuration
    beat_at: float | None = None  # monotonic seconds of the last message from the process
    waiting: bool = False  # for the agent's kubeconfig (rule 5)

    def feed(self, message: Mapping[str, object], now: float) -> None:
        """One message of the cache process (`feed_line` of agent/pod_cache_process.py)."""
        self.beat_at = now
        kind = message.get("k")
        if kind in ("cluster", "identity"):
            self._identity(message)
            return
        store = self.stores.get(str(message.get("w", "")))
        if store is None:
            return
        obj = message.get("o")
        if kind == "init":
            store.begin_list()
        elif kind == "done":
            if store.listing is not None:
                store.objects, store.listing = store.listing, None
            store.synced = store.live = True
        elif kind == "down":
            store.live = False
        elif kind in ("put", "del", "drop") and isinstance(obj, Mapping):
            watch = str(message["w"])
            record = REDUCE[watch](obj)
            if record is None:
                return
            key = key_of(watch, record)
            if kind == "del":
                store.remove(key)
            elif kind == "drop":  # over MAX_RECORD in the cache process: not kept
                store.remove(key)
                store.dropped += 1
            else:
                store.put(key, record, record_size(record))

    def _identity(self, message: Mapping[str, object]) -> None:
        """Rule 5: the cluster the process lists from, or whether it waits for one."""
        if message.get("k") == "identity":
            self.waiting = message.get("waiting") is True
            return
        cluster = str(message.get("id", ""))
        if self.cluster and cluster != self.cluster:  # counters kept
            for store in self.stores.values():
                store.objects, store.listing, store.sizes, store.size = {}, None, {}, 0
                store.synced = store.live = False
        self.cluster = cluster

    def usable(self, watch: str, cluster: str, now: float) -> str:
        """ "" when `watch` may answer for a caller of `cluster`, else the miss reason."""
        store = self.stores[watch]
        if not store.synced:
            return NOT_SYNCED
        if not cluster or cluster != self.cluster:
            return OTHER_CLUSTER
        if not store.live or self.beat_at is None or now - self.beat_at > BEAT_MAX:
            return WATCH_DOWN
        return ""

    def lookup_pod(self, namespace: str, name: str, uid: str, cluster: str, now: float) -> Lookup:
        """The cache answers for the pod `namespace/name` when all of these hold (else the
        ADD asks the API, docs/pod-cache.md "When the cache answers"):
        - the runtime named the pod's UID (CNI_ARGS K8S_POD_UID);
        - the caller's kubeconfig is of the cache's API server and trust (`cluster`);
        - the pod watch listed completely and is live (the last beat within BEAT_MAX);
        - the cache holds the pod, with that UID."""
        if not uid:
            return Lookup(miss=NO_UID)
        if reason := self.usable(PODS, cluster, now):
            return Lookup(miss=reason)
        record = self.stores[PODS].objects.get(f"{namespace}/{name}")
        if record is None:
            return Lookup(miss=NOT_CACHED)
        if _meta(record).get("uid") != uid:
            return Lookup(miss=OTHER_UID)
        return Lookup(record)

    def lookup_namespace(self, name: str, cluster: str, now: float) -> Lookup:
        if reason := self.usable(NAMESPACES, cluster, now):
            return Lookup(miss=reason)
        record = self.stores[NAMESPACES].objects.get(name)
        return Lookup(record) if record is not None else Lookup(miss=NOT_CACHED)

    def lookup_service(self, namespace: str, name: str, cluster: str, now: float) -> Lookup:
        """Under the namespace's terms (the cluster, its watch listed and live); only the
        `default/kubernetes` service is watched, any other is `not cached`."""
        if reason := self.usable(SERVICES, cluster, now):
            return Lookup(miss=reason)
        record = self.stores[SERVICES].objects.get(f"{namespace}/{name}")
        return Lookup(record) if record is not None else Lookup(miss=NOT_CACHED)

    def answer(self, query: Mapping[str, object], now: float) -> dict[str, object]:
        """A worker's question ({"what": "pod"|"namespace"|"service", "ns", "name", "uid",
        "cluster"}) and the answer it gets: {"doc": record} or {"miss": reason}."""
        cluster = str(query.get("cluster", ""))
        name = str(query.get("name", ""))
        if query.get("what") == "namespace":
            found = self.lookup_namespace(name, cluster, now)
        elif query.get("what") == "service":
            found = self.lookup_service(str(query.get("ns", "")), name, cluster, now)
        else:
            found = self.lookup_pod(
                str(query.get("ns", "")), name, str(query.get("uid", "")), cluster, now
            )
        return {"doc": found.record} if found.record is not None else {"miss": found.miss}


def cluster_identity(
    hostport: str, scheme: str, prefix: str, trust: str, server_name: str = ""
) -> str:
    """Which API server a configuration talks to, and how it trusts it: equal for the
    cache's configuration and a caller's kubeconfig when both reach the same server with the
    same CA (or both the system's, or both none) and verify its certificate against the same
    name (`server_name`: the kubeconfig's tls-server-name, else the server's host). That
    name is trust too: a caller verifying another one may be refused by the certificate
    where the cache's connection is not, and it is the SNI a proxy in front may route by.
    The token is not part of it. A digest: a worker's question stays small whatever the
    size of its CA bundle."""
    text = json.dumps([scheme, hostport.lower(), prefix, trust, server_name.lower()])
    return hashlib.sha256(text.encode()).hexdigest()


# ----------------------------------------------------------------------------- metrics


@dataclass
class CacheMetrics:
    """What the agent counts of ADDs and the cache (labels: SOURCES, MISS_REASONS)."""

    adds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    misses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(sorted(MISS_REASONS), 0))
    api_requests: int = 0  # GETs of pods, namespaces and services made by ADDs

    def add_served(self, source: str, miss: str, api_requests: int) -> None:
        self.adds[source if source in SOURCES else "api"] += 1
        if miss:
            self.misses[miss if miss in MISS_REASONS else NO_ANSWER] += 1
        self.api_requests += max(0, api_requests)


def render_cache(metrics: CacheMetrics, cache: PodCache | None) -> str:
    """The pod cache's families, as the Prometheus text format."""
    stores = cache.stores if cache is not None else {}
    return "".join(
        [
            text_family(
                "cnibox_agent_pod_cache_adds_total",
                "counter",
                "ADDs of a pod served by the agent, by where the pod came from: the node's "
                "pod cache or the API.",
                [({"source": s}, n) for s, n in metrics.adds.items()],
            ),
            text_family(
                "cnibox_agent_pod_cache_misses_total",
                "counter",
                "ADDs that read the API instead of the pod cache, by reason.",
                [({"reason": r}, n) for r, n in sorted(metrics.misses.items())],
            ),
            text_family(
                "cnibox_agent_add_api_requests_total",
                "counter",
                "Kubernetes API requests made by ADDs served by the agent (pod, namespace "
                "and service GETs; 0 per ADD the cache answers whole).",
                [({}, metrics.api_requests)],
            ),
            text_family(
                "cnibox_agent_pod_cache_objects",
                "gauge",
                "Objects in the pod cache, by resource.",
                [({"resource": w}, len(s.objects)) for w, s in sorted(stores.items())],
            ),
            text_family(
                "cnibox_agent_pod_cache_synced",
                "gauge",
                "1 when the resource's watch has listed and is live, else 0.",
                [({"resource": w}, int(s.synced and s.live)) for w, s in sorted(stores.items())],
            ),
            text_family(
                "cnibox_agent_pod_cache_relists_total",
                "counter",
                "LISTs of the resource (the first one, and after 410 Gone or a failed watch).",
                [({"resource": w}, s.relists) for w, s in sorted(stores.items())],
            ),
            text_family(
                "cnibox_agent_pod_cache_dropped_total",
                "counter",
                "Objects not kept because they exceeded the cache's bounds (their ADDs read "
                "the API).",
                [({"resource": w}, s.dropped) for w, s in sorted(stores.items())],
            ),
            text_family(
                "cnibox_agent_pod_cache_identity_waiting",
                "gauge",
                "1 while the pod cache waits for the agent's kubeconfig (--kubeconfig names "
                "a file that does not exist or cannot be used yet; ADDs read the API).",
                [({}, int(cache is not None and cache.waiting))],
            ),
        ]
    )
