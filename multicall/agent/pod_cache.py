"""The pod cache in the agent's two kinds of process (docs/pod-cache.md): `CacheFeed`, the
parent's copy, fed by the cache process (agent/pod_cache_process.py) and asked by workers;
`CachedKube`, the `Kube` port a worker's ADD uses, which asks the parent first and the API
when the parent says the cache may not answer.

Rules of this module:
1. The parent holds the cache; a worker asks for one object at a time over its control
   socket ("Q" + JSON, answered "A" + JSON, agent/server.py rule 3), when its ADD reads it.
   A worker forked long before the request (the pool, --worker-requests) thus never reads a
   copy of the cache as it was at its fork.
2. The parent's loop reads the feed without blocking, at most FEED_SLICE bytes per turn,
   lines bounded by MAX_LINE (core/kube/watch.BodyLines); a line that is not a message is
   dropped. A question is answered at once: one dict lookup.
3. A worker waits ASK_TIMEOUT at most for its answer; an answer to an earlier question
   (its number) is discarded. No answer, a miss, or a cache of another API server: the ADD
   asks the API through the kubeconfig its config names, as the one-shot plugin does.
4. The keeper asks the same questions under the same rules, over its own channel (a
   SOCK_SEQPACKET socketpair each keeper process makes at its start and hands to the parent
   over its metrics socket: agent/keeper_process.py rule 5). Its in-place ADD reads with the
   agent's own identity (`CachedControllerKube`); its "is the pod still there" before a
   repair is answered by a record of the pod's UID (agent/keeper.py `CachedPods`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.core.kube.pod_cache import (
    MAX_RECORD,
    NO_ANSWER,
    NO_CACHE,
    CacheMetrics,
    PodCache,
    cluster_identity,
)
from multicall.core.kube.watch import BodyLines

if TYPE_CHECKING:
    from multicall.agent.identity import Current, FollowedKube
    from multicall.core.kube.kubeconfig import KubeConfig
    from multicall.core.kube.objects import Namespace, Pod, Service
    from multicall.plugin.ports import PodApi, RealKube

Ask = Callable[[dict[str, object]], dict[str, object] | None]
FEED_SLICE = 1024 * 1024  # bytes read from the feed per loop turn (rule 2)
MAX_LINE = MAX_RECORD + 4096  # a record and its envelope
ASK_TIMEOUT = 0.5  # seconds a worker waits for the parent's answer (rule 3)
MAX_ANSWER = MAX_RECORD + 4096


class CacheFeed:
    """The parent's side: the feed's read end and the cache it fills."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.cache = PodCache()
        self._lines = BodyLines(chunked=False, max_line=MAX_LINE)
        self.open = True

    def read(self, now: float) -> bool:
        """What the feed has now (rule 2); False at its end (the cache process is gone)."""
        taken = 0
        while taken < FEED_SLICE:
            try:
                data = os.read(self.fd, 64 * 1024)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                data = b""
            if not data:
                self.open = False
                return False
            taken += len(data)
            for line in self._lines.feed(data):
                self._message(line, now)
        return True

    def _message(self, line: bytes | None, now: float) -> None:
        if not line:
            return
        try:
            message = json.loads(line)
        except ValueError:
            return
        if isinstance(message, dict):
            self.cache.feed(message, now)

    def answer(self, question: bytes, now: float) -> bytes:
        """The "A" message for a worker's "Q" (rule 1)."""
        try:
            query = json.loads(question)
        except ValueError:
            query = None
        if not isinstance(query, dict):
            return b"A{}"
        reply: dict[str, object] = {"n": query.get("n"), **self.cache.answer(query, now)}
        data = json.dumps(reply, separators=(",", ":")).encode()
        if len(data) > MAX_ANSWER:  # never, with records bounded by MAX_RECORD
            return b"A" + json.dumps({"n": query.get("n"), "miss": NO_ANSWER}).encode()
        return b"A" + data


def no_cache_answer(question: bytes) -> bytes:
    """The "A" message of an agent without a cache."""
    try:
        query = json.loads(question)
    except ValueError:
        query = None
    number = query.get("n") if isinstance(query, dict) else None
    return b"A" + json.dumps({"n": number, "miss": NO_CACHE}).encode()


def ask_parent(
    ctl: socket.socket, question: dict[str, object], number: int
) -> dict[str, object] | None:
    """A worker's question to its parent, answered within ASK_TIMEOUT, or None (rule 3)."""
    deadline = time.monotonic() + ASK_TIMEOUT
    try:
        ctl.send(b"Q" + json.dumps({**question, "n": number}).encode())
        while (left := deadline - time.monotonic()) > 0:
            ctl.settimeout(left)
            msg = ctl.recv(MAX_ANSWER + 1)
            if not msg:
                return None
            if msg[:1] != b"A":
                continue
            try:
                answer = json.loads(msg[1:])
            except ValueError:
                continue
            if isinstance(answer, dict) and answer.get("n") == number:
                return answer
    except OSError:  # TimeoutError among them
        return None
    finally:
        ctl.settimeout(None)
    return None


@dataclass(slots=True)
class AddStats:
    """What one request's API reads were: the pod's source, why not the cache, how many
    API requests it made (the parent's metrics, core/kube/pod_cache.CacheMetrics)."""

    source: str = ""  # "cache" or "api" once the pod was read; "" when it was not
    miss: str = ""
    api_requests: int = 0

    def report(self) -> dict[str, object]:
        if not self.source:
            return {}
        return {"pod_source": self.source, "miss": self.miss, "api_requests": self.api_requests}


def count_add(metrics: CacheMetrics, report: Mapping[str, object]) -> None:
    """A worker's report of an ADD counted (the parent, agent/server.py)."""
    source = report.get("pod_source")
    if not isinstance(source, str) or not source:
        return
    miss = report.get("miss")
    requests = report.get("api_requests")
    metrics.add_served(
        source,
        miss if isinstance(miss, str) else "",
        requests if isinstance(requests, int) and not isinstance(requests, bool) else 0,
    )


def config_identity(config: KubeConfig, read_ca: Callable[[str], str] | None = None) -> str:
    """`cluster_identity` of an API configuration: its endpoint and its trust (the CA's PEM
    text, "insecure", or "system" for the system's roots, and the name TLS verifies: its
    tls-server-name, else the host, as effects/http.py `Endpoint.server_name` says). `read_ca`
    reads a CA file (a worker reads its caller's, which the caller opens)."""
    from multicall.core.limits import CA_FILE
    from multicall.effects.kube.config import endpoint, read_text_file

    e = endpoint(config.server)
    if config.insecure_skip_tls_verify:
        trust = "insecure"
    elif config.ca_data:
        trust = config.ca_data.decode("ascii", "replace").strip()
    elif config.ca_file:
        reader = read_ca or (
            lambda path: read_text_file(path, limit=CA_FILE, what="certificate-authority file")
        )
        trust = reader(config.ca_file).strip()
    else:
        trust = "system"
    return cluster_identity(e.hostport, e.scheme, e.prefix, trust, config.tls_server_name or e.host)


class CachedKube:
    """The `Kube` port of a worker's request: `RealKube`'s, with the pod and its namespace
    asked of the parent's cache first (rule 3). `ask` None: the agent has no cache."""

    def __init__(self, real: RealKube, ask: Ask | None) -> None:
        self.real = real
        self.ask = ask
        self.stats = AddStats()

    def check_kubeconfig(self, path: str) -> None:
        self.real.check_kubeconfig(path)

    def connect(self, kubeconfig: str, env: Mapping[str, str]) -> PodApi:
        """What `RealKube.connect` does (the same reads, errors and order), then the cache's
        terms: the runtime's K8S_POD_UID and the kubeconfig's API server and trust."""
        from multicall.core.cni.skel import pod_uid
        from multicall.core.limits import CA_FILE
        from multicall.effects.kube.client import KubeClient
        from multicall.effects.kube.config import read_kubeconfig, read_text_file, timeout_from_env

        files = self.real.files
        timeout = timeout_from_env(env)
        config = read_kubeconfig(kubeconfig, files=files)
        client = KubeClient(config, timeout=timeout, files=files, warm=self.real.warm)
        cluster = ""
        if self.ask is not None:
            cluster = config_identity(
                config,
                lambda path: read_text_file(
                    path, limit=CA_FILE, what="certificate-authority file", files=files
                ),
            )
        return CachedPodApi(client, self.ask, cluster, pod_uid(env.get("CNI_ARGS", "")), self.stats)


def ask_cache(
    ask: Ask | None, question: dict[str, object], cluster: str
) -> Mapping[str, object] | str:
    """The parent's cached record for `question` about `cluster` (a worker's or the
    keeper's), or why the API is asked instead (a miss reason)."""
    if ask is None:
        return NO_CACHE
    answer = ask({**question, "cluster": cluster})
    if answer is None:
        return NO_ANSWER
    doc = answer.get("doc")
    if isinstance(doc, Mapping):
        return doc
    miss = answer.get("miss")
    return miss if isinstance(miss, str) and miss else NO_ANSWER


class CachedPodApi:
    """`PodApi` over the parent's cache, then `client` (rule 3); every GET of `client`
    counted in `stats`."""

    def __init__(
        self, client: PodApi, ask: Ask | None, cluster: str, uid: str, stats: AddStats
    ) -> None:
        self.client = client
        self.ask = ask
        self.cluster = cluster
        self.uid = uid
        self.stats = stats

    def _cached(self, question: dict[str, object]) -> Mapping[str, object] | str:
        return ask_cache(self.ask, question, self.cluster)

    def get_pod(self, namespace: str, name: str) -> Pod:
        from multicall.core.kube.objects import parse_pod

        found = self._cached({"what": "pod", "ns": namespace, "name": name, "uid": self.uid})
        if not isinstance(found, str):
            self.stats.source = "cache"
            return parse_pod(found)
        self.stats.source, self.stats.miss = "api", found
        self.stats.api_requests += 1
        return self.client.get_pod(namespace, name)

    def get_namespace(self, name: str) -> Namespace:
        from multicall.core.kube.objects import parse_namespace

        found = self._cached({"what": "namespace", "name": name})
        if not isinstance(found, str):
            return parse_namespace(found)
        self.stats.api_requests += 1
        return self.client.get_namespace(name)

    def get_service(self, namespace: str, name: str) -> Service:
        """A control-plane pod's `default/kubernetes` (the one service watched)."""
        from multicall.core.kube.objects import parse_service

        found = self._cached({"what": "service", "ns": namespace, "name": name})
        if not isinstance(found, str):
            return parse_service(found)
        self.stats.api_requests += 1
        return self.client.get_service(namespace, name)

    def close(self) -> None:
        self.client.close()


class ClusterOf:
    """`config_identity` of the agent's own configuration as it is now (the keeper's),
    computed again only when its generation changed; "" when it cannot be (a CA file not
    readable): the cache then answers nothing (`other cluster`) and the API is asked."""

    def __init__(self, current: Current) -> None:
        self.current = current
        self._generation = -1
        self._cluster = ""

    def __call__(self) -> str:
        config, generation = self.current()
        if generation != self._generation:
            try:
                self._cluster = config_identity(config)
            except Exception:  # noqa: BLE001 - CniboxError, OSError: the API answers instead
                self._cluster = ""
            self._generation = generation
        return self._cluster


class CachedControllerKube:
    """The keeper's `Kube` port (rule 4): `FollowedKube`'s (the agent's identity as it is at
    each repair), with the pod and its namespace asked of the parent's cache first, under a
    worker's rules: the runtime's K8S_POD_UID (the sandbox's CNI_ARGS) and the cluster."""

    def __init__(self, real: FollowedKube, ask: Ask, cluster: ClusterOf) -> None:
        self.real = real
        self.ask = ask
        self.cluster = cluster

    def check_kubeconfig(self, path: str) -> None:
        self.real.check_kubeconfig(path)

    def connect(self, kubeconfig: str, env: Mapping[str, str]) -> PodApi:
        from multicall.core.cni.skel import pod_uid

        client = self.real.connect(kubeconfig, env)
        uid = pod_uid(env.get("CNI_ARGS", ""))
        return CachedPodApi(client, self.ask, self.cluster(), uid, AddStats())
