"""A test Kubernetes API server: real TLS (tests/support/pki.py, one CA per test session),
bearer-token checks, Pod/Namespace/Service JSON and `Status` errors shaped as the real API's.

Rules of this module:
1. It listens on 127.0.0.1 of the network namespace it is started for (a rig's node netns,
   where libcni runs the plugin), never on the machine's own loopback unless told.
2. Modes make it misbehave on purpose: `status` (every GET answers that HTTP status with a
   Status body), `hang` (requests are read, never answered), `silent` (TCP accepted by the
   kernel, TLS never answered). `refused_port()` gives a port nobody listens on.
3. It records every request path, so tests can count namespace GETs.
4. Nodes (the readiness gate): GET, PATCH with a JSON patch (test/add/replace/remove; a failed
   `test` answers 422 as kube-apiserver does) and PATCH of nodes/NAME/status with a strategic
   merge of `conditions` by `type` (`$patch: delete` too). Every write moves the
   resourceVersion. `conflicts` answers that many PATCHes of a node (not its status) 409;
   `before_patch` runs ahead of each PATCH (a concurrent writer).
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from multicall.effects.ns import entered_netns
from tests.support.pki import Pki

TOKEN = "cnibox-test-token"


def status_body(code: int, message: str, reason: str, details: Mapping[str, Any] | None) -> bytes:
    """A metav1.Status the way kube-apiserver serialises it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return json.dumps(body).encode() + b"\n"


def not_found(resource: str, name: str) -> bytes:
    return status_body(
        404, f'{resource} "{name}" not found', "NotFound", {"name": name, "kind": resource}
    )


UNAUTHORIZED = status_body(401, "Unauthorized", "Unauthorized", None)
INTERNAL = status_body(
    500,
    "Internal error occurred: etcdserver: request timed out",
    "InternalError",
    {"causes": [{"message": "etcdserver: request timed out"}]},
)


@dataclass
class KubeApi:
    pki: Pki
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    namespaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    services: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    mode: str = "ok"
    status: int = 500
    requests: list[str] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    conflicts: int = 0
    patches: list[tuple[str, Any]] = field(default_factory=list)
    before_patch: Any = None
    port: int = 0
    _server: ThreadingHTTPServer | None = None
    _silent: socket.socket | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    # -- data

    def add_pod(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        self.pods[(meta["namespace"], meta["name"])] = dict(pod)
        self.namespaces.setdefault(meta["namespace"], namespace_doc(meta["namespace"]))

    def add_namespace(self, name: str, annotations: Mapping[str, str] | None = None) -> None:
        self.namespaces[name] = namespace_doc(name, annotations)

    def add_node(self, name: str, taints: list[dict[str, Any]] | None = None) -> None:
        spec: dict[str, Any] = {"taints": list(taints)} if taints is not None else {}
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        self.nodes[name] = {"kind": "Node", "apiVersion": "v1",
                            "metadata": {"name": name, "resourceVersion": "1"},
                            "spec": spec, "status": {"conditions": [ready]}}  # fmt: skip

    def patch_node(self, path: str, content_type: str, body: Any) -> tuple[int, bytes]:  # noqa: PLR0911 - one answer per way kube-apiserver refuses
        parts = path.split("?", 1)[0].strip("/").split("/")
        if parts[:3] != ["api", "v1", "nodes"] or len(parts) not in (4, 5):
            return 404, not_found("nodes", "")
        name = parts[3]
        with self._lock:
            if self.before_patch is not None:
                self.before_patch(self, name)
            node = self.nodes.get(name)
            if node is None:
                return 404, not_found("nodes", name)
            self.patches.append((path, body))
            if self.conflicts > 0 and len(parts) == 4:
                self.conflicts -= 1
                message = (
                    f'Operation cannot be fulfilled on nodes "{name}": the object has been modified'
                )
                return 409, status_body(409, message, "Conflict", {"name": name})
            updated = copy.deepcopy(node)
            if len(parts) == 5 and parts[4] == "status":
                if content_type != "application/strategic-merge-patch+json":
                    return 415, status_body(
                        415, "unsupported media type", "UnsupportedMediaType", None
                    )
                _merge_conditions(updated, body)
            elif content_type == "application/json-patch+json":
                problem = _json_patch(updated, body)
                if problem:
                    return 422, status_body(422, problem, "Invalid", {"name": name})
            else:
                return 415, status_body(415, "unsupported media type", "UnsupportedMediaType", None)
            self.bump(updated)
            self.nodes[name] = updated
            return 200, _json(updated)

    def bump(self, node: dict[str, Any]) -> None:
        meta = node["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def lookup(self, path: str) -> tuple[int, bytes]:
        parts = path.strip("/").split("/")
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            with self._lock:
                node = self.nodes.get(parts[3])
                return (200, _json(node)) if node else (404, not_found("nodes", parts[3]))
        if parts[:2] != ["api", "v1"] or len(parts) < 4 or parts[2] != "namespaces":
            return 404, status_body(404, "the server could not find the requested resource",
                                    "NotFound", {})  # fmt: skip
        ns = parts[3]
        if len(parts) == 4:
            doc = self.namespaces.get(ns)
            return (200, _json(doc)) if doc else (404, not_found("namespaces", ns))
        kind, name = parts[4], parts[5] if len(parts) > 5 else ""
        store = {"pods": self.pods, "services": self.services}.get(kind, {})
        found = store.get((ns, name))
        return (200, _json(found)) if found else (404, not_found(kind, name))

    @property
    def connections(self) -> int:
        """TCP connections accepted so far (each a TLS handshake)."""
        return self._server.connections if isinstance(self._server, TlsServer) else 0

    # -- lifecycle

    def start(self, netns: str | None) -> None:
        """Listen on 127.0.0.1 inside `netns` (None: this process's own netns)."""
        with _in_netns(netns):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        if self.mode == "silent":
            self._silent = listener  # the kernel accepts connections nobody reads
            return
        self._server = _server(self, listener)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._silent is not None:
            self._silent.close()

    def kubeconfig(self, path: Path, *, port: int | None = None, token: str = TOKEN) -> Path:
        """A kubeconfig like the installer's, pointing at this server."""
        import base64

        ca = base64.b64encode(self.pki.ca_cert.read_bytes()).decode()
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": f"https://127.0.0.1:{port or self.port}",
                "certificate-authority-data": ca}}],
            "users": [{"name": "linkerd-cni", "user": {"token": token}}],
            "contexts": [{"name": "linkerd-cni-context",
                          "context": {"cluster": "local", "user": "linkerd-cni"}}],
            "current-context": "linkerd-cni-context",
        }  # fmt: skip
        path.write_text("# kubeconfig file for linkerd.io/cni-plugin\n" + yaml.safe_dump(doc))
        return path


def refused_port(netns: str | None) -> int:
    """A port on 127.0.0.1 in `netns` with no listener (bound, then closed)."""
    with _in_netns(netns):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


@contextlib.contextmanager
def _in_netns(netns: str | None) -> Iterator[None]:
    if netns is None:
        yield
        return
    with entered_netns(netns):
        yield


def _json(doc: Mapping[str, Any] | None) -> bytes:
    return json.dumps(doc).encode()


def namespace_doc(name: str, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"kubernetes.io/metadata.name": name}}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"kind": "Namespace", "apiVersion": "v1", "metadata": meta, "spec": {}}


def service_doc(ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "spec": {"ports": ports, "type": "ClusterIP"},
    }


class TlsServer(ThreadingHTTPServer):
    """HTTPS for the API stand-ins (this one and kubewatch.py)."""

    daemon_threads = True
    tls: ssl.SSLContext
    connections = 0  # TCP connections accepted (each a TLS handshake)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake happens in the request's thread, so a stalled client blocks nobody.
        # Go servers set TCP_NODELAY; without it Nagle + delayed ACKs add ~40 ms per response.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections += 1
        try:
            wrapped = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            super().finish_request(wrapped, client_address)
        finally:
            wrapped.close()


class _TlsServer(TlsServer):
    api: KubeApi


def _server(api: KubeApi, listener: socket.socket) -> ThreadingHTTPServer:
    server = _TlsServer(("127.0.0.1", 0), _Handler, bind_and_activate=False)
    server.api = api
    server.tls = adopt_listener(server, listener, api.pki)
    return server


def adopt_listener(
    server: ThreadingHTTPServer, listener: socket.socket, pki: Pki
) -> ssl.SSLContext:
    """Make `server` (built unbound) serve on `listener`; the TLS context for its requests."""
    server.socket.close()
    server.socket = listener
    server.server_address = listener.getsockname()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    return tls


class JsonHandler(BaseHTTPRequestHandler):
    """The API stand-ins' request handler base: HTTP/1.1, quiet, JSON answers."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Handler(JsonHandler):
    server: _TlsServer

    def do_GET(self) -> None:
        api = self.server.api
        api.requests.append(self.path)
        if api.mode == "hang":
            api._stop.wait(60)
            return
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, UNAUTHORIZED)
        elif api.mode == "status":
            self._send(api.status, INTERNAL if api.status == 500 else status_body(
                api.status, "forced", "Forced", None))  # fmt: skip
        else:
            self._send(*api.lookup(self.path))

    def do_PATCH(self) -> None:
        api = self.server.api
        api.requests.append("PATCH " + self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, UNAUTHORIZED)
            return
        self._send(*api.patch_node(self.path, self.headers.get("Content-Type", ""), body))


def _json_patch(doc: dict[str, Any], ops: Any) -> str:
    """RFC 6902 on `doc` in place; the failure's message ('' when every op applied)."""
    for op in ops:
        *parents, last = [
            p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]
        ]
        target: Any = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target.get(part)
            if target is None:
                return f"the path {op['path']!r} does not exist"
        exists = (
            (last in target)
            if isinstance(target, dict)
            else (last != "-" and int(last) < len(target))
        )
        if op["op"] == "test":
            if (
                not exists
                or (target[last] if isinstance(target, dict) else target[int(last)]) != op["value"]
            ):
                return f"the server rejected our request due to an error in our request: testing value {op['path']} failed"  # noqa: E501
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace" and not exists:
                return f"replace operation does not apply: doc is missing key: {op['path']}"
            if isinstance(target, list):
                target.append(op["value"]) if last == "-" else target.insert(int(last), op["value"])
            else:
                target[last] = op["value"]
        elif op["op"] == "remove":
            if not exists:
                return f"remove operation does not apply: doc is missing path: {op['path']}"
            del target[last if isinstance(target, dict) else int(last)]
        else:
            return f"unknown op {op['op']!r}"
    return ""


def _merge_conditions(node: dict[str, Any], patch: Any) -> None:
    """Strategic merge of status.conditions, merge key `type` (what the Node's schema says)."""
    conditions = node.setdefault("status", {}).setdefault("conditions", [])
    for item in patch.get("status", {}).get("conditions", []):
        at = next((i for i, c in enumerate(conditions) if c.get("type") == item["type"]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del conditions[at]
        elif at is None:
            conditions.append(dict(item))
        else:
            conditions[at] = {**conditions[at], **item}


def pods_from_golden(path: Path, *, namespace: str = "emojivoto") -> list[dict[str, Any]]:
    """Pods as the API would return them, built from an upstream inject golden (Deployments)."""
    pods = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") != "Deployment":
            continue
        template = doc["spec"]["template"]
        meta = dict(template.get("metadata") or {})
        meta["name"] = f"{doc['metadata']['name']}-7d4f8c9b5-x2x4q"
        meta["namespace"] = namespace
        pods.append({"kind": "Pod", "apiVersion": "v1", "metadata": meta,
                     "spec": template["spec"]})  # fmt: skip
    return pods
