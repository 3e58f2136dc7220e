"""A Kubernetes API stand-in for controllers (the sibling of kubeapi.py, which serves the
plugin's GETs): pods with resourceVersions, LIST with label/field selectors, `limit` and
`continue`, WATCH streamed with chunked transfer encoding (bookmarks, timeoutSeconds), a
bounded event history whose compaction makes old resourceVersions answer 410 Gone, DELETE of
pods and POST of events.k8s.io Events, over real TLS with bearer-token checks.

Faults on purpose: `drop_after` (a watch connection is cut after N events, no terminal
chunk), `trickle` (each event is written in 7-byte chunks with pauses, so lines cross chunk
boundaries), `silent` (a watch gets its headers and then nothing), `restart()` (the server
goes away and comes back on the same port, optionally with its history compacted), slow or
failing DELETEs and POSTs, and slow watchers (a watch whose client does not read within
`send_timeout` is closed, as kube-apiserver's cacher does).

Rules: it listens on 127.0.0.1 only; every request is recorded.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import re
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.kubeapi import (
    TOKEN,
    UNAUTHORIZED,
    JsonHandler,
    TlsServer,
    _in_netns,
    adopt_listener,
    not_found,
    status_body,
)
from tests.support.pki import Pki


@dataclass
class Request:
    method: str
    path: str
    body: Any = None


def pod_doc(
    name: str,
    exit_code: int | None = 95,
    *,
    node: str = "node-a",
    namespace: str = "app",
    labeled: bool = True,
    deleting: bool = False,
    filler: int = 0,
) -> dict[str, Any]:
    """A pod as the proxy injector leaves it with CNI enabled (linkerd-network-validator +
    linkerd-proxy); `exit_code` is its validator's lastState exit code (None: no status)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "annotations": {"filler": "z" * filler},
    }
    if labeled:
        meta["labels"] = {"linkerd.io/control-plane-ns": "linkerd", "app": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    doc: dict[str, Any] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "initContainers": [{"name": "linkerd-network-validator"}],
            "containers": [{"name": "linkerd-proxy"}, {"name": "app"}],
        },
    }
    if exit_code is not None:
        doc["status"] = {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "linkerd-network-validator",
                    "ready": False,
                    "restartCount": 1,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": "Error",
                            "finishedAt": "2026-01-01T00:00:00Z",
                        }
                    },
                }
            ],
        }
    return doc


def gone(message: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(status_body(410, message, "Expired", None))
    return doc


def _selected(pod: Mapping[str, Any], labels: str, fields: str) -> bool:
    meta = pod.get("metadata", {})
    for term in filter(None, labels.split(",")):
        key, eq, value = term.partition("=")
        have = meta.get("labels", {}) or {}
        if key not in have or (eq and have[key] != value):
            return False
    for term in filter(None, fields.split(",")):
        key, _, value = term.partition("=")
        actual: Any = pod
        for part in key.split("."):
            actual = actual.get(part, "") if isinstance(actual, Mapping) else ""
        if actual != value:
            return False
    return True


@dataclass
class WatchApi:
    pki: Pki
    history_size: int = 100_000
    bookmark_interval: float = 0.0  # 0: bookmarks only just before a watch times out
    drop_after: int = 0  # cut each watch connection after this many events (0: never)
    trickle: bool = False
    silent: bool = False
    send_timeout: float = 10.0
    delete_delay: float = 0.0
    delete_status: int = 0  # answer every DELETE with this status (0: really delete)
    event_delay: float = 0.0
    event_status: int = 0
    list_status: int = 0  # answer every LIST with this status (403: RBAC missing)
    # every WATCH answers one event and ends at once: "bookmark" (a BOOKMARK) or "gone" (an
    # ERROR 410, so the client lists again): the loops issue 30 item 7 found spinning
    watch_answer: str = ""
    port: int = 0
    requests: list[Request] = field(default_factory=list)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)  # listed and watched too
    # GET only (a control-plane pod's ADD reads `default/kubernetes`); absent: 404
    services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    watches_served: int = 0
    events_sent: int = 0
    _rv: int = 1000
    _history: deque[tuple[int, str, dict[str, Any], dict[str, Any] | None]] = field(
        default_factory=deque
    )
    _oldest: int = 1000  # a watch from before this resourceVersion is Gone
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _server: _TlsServer | None = None
    token: str = TOKEN  # the bearer token accepted (tests rotate it)
    _netns: str | None = None
    _generation: int = 0

    # -- data

    def apply(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """Create or update a pod, or a namespace (`kind: Namespace`) (ADDED or MODIFIED),
        returning the stored copy."""
        with self._cond:
            doc = copy.deepcopy(dict(pod))
            meta = doc.setdefault("metadata", {})
            kind = doc.get("kind")
            store = self.store_of(kind if isinstance(kind, str) else "Pod")
            key = meta["name"] if store is self.namespaces else (meta["namespace"], meta["name"])
            old = store.get(key)
            meta["uid"] = old["metadata"]["uid"] if old else meta.get("uid") or str(uuid.uuid4())
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            store[key] = doc
            self._record("MODIFIED" if old else "ADDED", doc, old)
            return doc

    def delete(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Delete a pod, or (`namespace` "") a namespace."""
        with self._cond:
            store: dict[Any, dict[str, Any]] = self.namespaces if not namespace else self.pods
            old = store.pop(name if not namespace else (namespace, name), None)
            if old is None:
                return None
            self._rv += 1
            doc = copy.deepcopy(old)
            doc["metadata"]["resourceVersion"] = str(self._rv)
            self._record("DELETED", doc, old)
            return doc

    def _record(self, kind: str, doc: dict[str, Any], old: dict[str, Any] | None) -> None:
        self._history.append((self._rv, kind, doc, old))
        while len(self._history) > self.history_size:
            self._oldest = self._history.popleft()[0]
        self._cond.notify_all()

    def compact(self) -> None:
        """Forget all history: every resourceVersion seen so far answers 410 Gone."""
        with self._cond:
            self._history.clear()
            self._oldest = self._rv
            self._cond.notify_all()

    @property
    def resource_version(self) -> int:
        return self._rv

    def deletes(self) -> list[str]:
        return [r.path for r in self.requests if r.method == "DELETE"]

    # -- lifecycle

    def object_gets(self) -> list[str]:
        """The paths of the GETs of one object so far (a plugin's pod, namespace and service
        reads): LIST and WATCH carry a query."""
        return [r.path for r in self.requests if r.method == "GET" and "?" not in r.path]

    def start(self, netns: str | None = None) -> None:
        """Listen on 127.0.0.1 of `netns` (None: this process's own netns)."""
        self._netns = netns
        with _in_netns(netns):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        server = _TlsServer(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        server.api = self
        server.tls = adopt_listener(server, listener, self.pki)
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Go away: stop accepting, and cut every open connection (watches included)."""
        with self._cond:
            self._generation += 1  # open watches notice and end without a terminal chunk
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            for conn in list(self._server.open):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self._server = None

    def restart(self, *, lose_history: bool = False, downtime: float = 0.5) -> None:
        self.stop()
        if lose_history:
            self.compact()
        time.sleep(downtime)
        self.start(self._netns)

    def kubeconfig_text(self, token: str = TOKEN, context: str = "linkerd-cni-context") -> str:
        """The installer's kubeconfig layout: the plugin (which forces this context) and the
        controller (which uses the current one) both read it."""
        ca = base64.b64encode(self.pki.ca_cert.read_bytes()).decode()
        return (
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n"
            f"    server: https://127.0.0.1:{self.port}\n"
            f"    certificate-authority-data: {ca}\nusers:\n- name: controller\n  user:\n"
            f"    token: {token}\ncontexts:\n- name: {context}\n  context:\n"
            f"    cluster: standin\n    user: controller\ncurrent-context: {context}\n"
        )

    # -- request handling (called from the handler threads)

    def store_of(self, kind: str) -> dict[Any, dict[str, Any]]:
        """The objects of one kind: Namespace, Service, else Pod."""
        if kind == "Namespace":
            return self.namespaces
        return self.services if kind == "Service" else self.pods

    def list_pods(
        self, query: Mapping[str, str], resource: str = "Pod"
    ) -> tuple[int, dict[str, Any]]:
        labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
        objects: Mapping[Any, dict[str, Any]] = self.store_of(resource)
        limit = int(query.get("limit", "0") or 0)
        with self._cond:
            if "continue" in query:
                start_rv, offset = json.loads(base64.b64decode(query["continue"]))
                if start_rv < self._oldest:
                    return 410, gone(
                        "The provided continue parameter is too old to display "
                        "a consistent list result."
                    )
            else:
                start_rv, offset = self._rv, 0
            matching = sorted(
                (p for p in objects.values() if _selected(p, labels, fields)),
                key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"]["name"]),
            )
            page = matching[offset : offset + limit] if limit else matching[offset:]
            meta: dict[str, Any] = {"resourceVersion": str(start_rv)}
            if limit and offset + limit < len(matching):
                token = json.dumps([start_rv, offset + limit]).encode()
                meta["continue"] = base64.b64encode(token).decode()
            return 200, {
                "kind": f"{resource}List",
                "apiVersion": "v1",
                "metadata": meta,
                "items": copy.deepcopy(page),
            }

    def watch_events(
        self,
        since: int,
        labels: str,
        fields: str,
        timeout: float,
        bookmarks: bool,
        *,
        resource: str = "Pod",
    ) -> Iterator[dict[str, Any]]:
        """Events after `since` as the apiserver sends them: a 410 ERROR when `since` is
        compacted away, ADDED/DELETED where a change crosses the selector, bookmarks."""
        end = time.monotonic() + timeout
        next_bookmark = time.monotonic() + (self.bookmark_interval or timeout)
        generation = self._generation
        position = since
        while True:
            with self._cond:  # never yield while holding the lock
                oldest = self._oldest
                pending = [h for h in self._history if h[0] > position]
                if position >= oldest and not pending:
                    now = time.monotonic()
                    if generation != self._generation or now >= end:
                        break
                    self._cond.wait(min(end, next_bookmark) - now)
                    if generation != self._generation:
                        return  # the server went away: no terminal chunk
            if position < oldest:  # compacted away, or a watcher too slow for the history
                yield {
                    "type": "ERROR",
                    "object": gone(f"too old resource version: {position} ({oldest})"),
                }
                return
            for rv, kind, doc, old in pending:
                position = rv
                if doc.get("kind", "Pod") != resource:
                    continue
                out = _crossing(kind, doc, old, labels, fields)
                if out is not None:
                    yield {"type": out, "object": doc}
            if bookmarks and time.monotonic() >= next_bookmark and time.monotonic() < end:
                next_bookmark = time.monotonic() + (self.bookmark_interval or timeout)
                yield _bookmark(position)
        if bookmarks:
            yield _bookmark(position)


def _crossing(
    kind: str, doc: Mapping[str, Any], old: Mapping[str, Any] | None, labels: str, fields: str
) -> str | None:
    now = kind != "DELETED" and _selected(doc, labels, fields)
    before = old is not None and _selected(old, labels, fields)
    if kind == "DELETED":
        return "DELETED" if before else None
    if now and before:
        return "MODIFIED"
    if now:
        return "ADDED"
    return "DELETED" if before else None


def _bookmark(rv: int) -> dict[str, Any]:
    return {
        "type": "BOOKMARK",
        "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)}},
    }


class _TlsServer(TlsServer):
    api: WatchApi
    open: set[socket.socket]  # client connections, which restart() cuts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open = set()

    def finish_request(self, request: Any, client_address: Any) -> None:
        self.open.add(request)
        try:
            super().finish_request(request, client_address)
        except (OSError, ssl.SSLError):
            pass  # a connection cut on purpose (restart, slow watcher)
        finally:
            self.open.discard(request)


class _Handler(JsonHandler):
    server: _TlsServer

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.server.api.token}":
            return True
        self._send(401, UNAUTHORIZED)
        return False

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def do_GET(self) -> None:
        api = self.server.api
        api.requests.append(Request("GET", self.path))
        if not self._authorized():
            return
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        resource = {"/api/v1/pods": "Pod", "/api/v1/namespaces": "Namespace"}.get(parts.path)
        in_namespace = re.fullmatch(r"/api/v1/namespaces/([^/]+)/services", parts.path)
        if in_namespace:  # a namespace's services: its namespace is one more field term
            resource = "Service"
            terms = [query.get("fieldSelector", ""), f"metadata.namespace={in_namespace[1]}"]
            query["fieldSelector"] = ",".join(filter(None, terms))
        if resource is None:
            self._get_one(parts.path.strip("/").split("/"))
            return
        if query.get("watch") == "true":
            self._watch(query, resource)
            return
        if api.list_status:
            message = (
                'pods is forbidden: User "system:serviceaccount:linkerd-cni:linkerd-cni" '
                'cannot list resource "pods" in API group "" at the cluster scope'
            )
            self._send(api.list_status, status_body(api.list_status, message, "Forbidden", {}))
            return
        status, doc = api.list_pods(query, resource)
        self._send(status, json.dumps(doc).encode())

    def _get_one(self, parts: list[str]) -> None:
        """The plugin's GETs: one pod, its namespace (no annotations when not stored), or a
        stored service."""
        api = self.server.api
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "services":
            with api._cond:
                service = copy.deepcopy(api.services.get((parts[3], parts[5])))
            if service is not None:
                self._send(200, json.dumps(service).encode())
                return
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4:
            with api._cond:
                stored = copy.deepcopy(api.namespaces.get(parts[3]))
            doc = stored or {
                "kind": "Namespace",
                "apiVersion": "v1",
                "metadata": {"name": parts[3]},
            }
            self._send(200, json.dumps(doc).encode())
            return
        if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
            with api._cond:
                pod = copy.deepcopy(api.pods.get((parts[3], parts[5])))
            if pod is not None:
                self._send(200, json.dumps(pod).encode())
                return
        self._send(404, not_found(parts[-2] if len(parts) > 1 else "", parts[-1]))

    def do_DELETE(self) -> None:
        api = self.server.api
        body = self._body()
        api.requests.append(Request("DELETE", self.path, body))
        if not self._authorized():
            return
        if api.delete_delay:
            time.sleep(api.delete_delay)
        if api.delete_status:
            self._send(api.delete_status, status_body(api.delete_status, "forced", "Forced", None))
            return
        parts = self.path.strip("/").split("/")  # api v1 namespaces NS pods NAME
        doc = api.delete(parts[3], parts[5]) if len(parts) == 6 else None
        if doc is None:
            self._send(404, not_found("pods", parts[-1]))
            return
        self._send(200, json.dumps(doc).encode())

    def do_POST(self) -> None:
        api = self.server.api
        body = self._body()
        api.requests.append(Request("POST", self.path, body))
        if not self._authorized():
            return
        if api.event_delay:
            time.sleep(api.event_delay)
        if api.event_status:
            self._send(api.event_status, status_body(api.event_status, "forced", "Forced", None))
            return
        api.events.append(body)
        created = copy.deepcopy(body)
        created["metadata"]["uid"] = str(uuid.uuid4())
        self._send(201, json.dumps(created).encode())

    def _watch(self, query: Mapping[str, str], resource: str = "Pod") -> None:
        api = self.server.api
        api.watches_served += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        if api.silent:  # headers, then nothing until the server goes away
            generation = api._generation
            with api._cond:
                while api._generation == generation:
                    api._cond.wait(1)
            return
        self.connection.settimeout(api.send_timeout)  # a slow watcher is cut off
        if api.watch_answer:
            rv = int(query.get("resourceVersion") or 0)
            event = (
                _bookmark(rv)
                if api.watch_answer == "bookmark"
                else {
                    "type": "ERROR",
                    "object": gone(f"too old resource version: {rv} ({rv + 1})"),
                }
            )
            self._chunk(json.dumps(event).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True
            return
        for sent, event in enumerate(
            api.watch_events(
                int(query.get("resourceVersion") or 0),
                query.get("labelSelector", ""),
                query.get("fieldSelector", ""),
                float(query.get("timeoutSeconds") or 290),
                query.get("allowWatchBookmarks") == "true",
                resource=resource,
            ),
            start=1,
        ):
            line = json.dumps(event).encode() + b"\n"
            if api.trickle:
                for i in range(0, len(line), 7):
                    self._chunk(line[i : i + 7])
                    time.sleep(0.0005)
            else:
                self._chunk(line)
            api.events_sent += 1
            if api.drop_after and sent >= api.drop_after:
                self.connection.shutdown(socket.SHUT_RDWR)  # cut: no terminal chunk
                self.close_connection = True
                return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
