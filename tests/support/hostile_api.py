"""A Kubernetes API stand-in that misbehaves on purpose, in plain HTTP on 127.0.0.1 (no PKI
needed): the slowest possible servers, endless heads and bodies, broken framing, and a
server that closes keep-alive connections after one reply (tests/hostile_inputs.md, class 1).

Every behaviour is a `mode`; the server answers pod, namespace and service GETs with the
documents tests/support/kubeapi.py serves, and counts requests and connections.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.kubeapi import namespace_doc, service_doc
from tests.support.pods import MESHED

POD_PATH = "/api/v1/namespaces/{ns}/pods/{name}".format(
    ns=MESHED["metadata"]["namespace"], name=MESHED["metadata"]["name"]
)
MODES = (
    "ok",  # answers, keep-alive
    "pause",  # answers each request after 0.4 s
    "close-after-reply",  # answers one request per connection, then closes it (no header)
    "close-unanswered",  # reads the request and closes without a byte
    "drip-reply",  # a valid reply, one byte every 50 ms
    "drip-head",  # the head one byte every 0.5 s
    "drip-body",  # the head at once, then the body one byte every 50 ms
    "endless-head",  # header lines forever, fast
    "endless-chunks",  # a chunked body forever, fast
    "huge-length",  # Content-Length: 10 GB
    "unterminated",  # no length, body until close: forever
    "deep-json",  # a valid reply whose JSON nests 100 000 deep
    "bad-chunk",  # a chunk size that is not hex
    "garbage",  # not HTTP at all
)


def body_for(path: str) -> bytes:
    if path == POD_PATH:
        return json.dumps(MESHED).encode()
    if path.endswith("/services/kubernetes"):
        return json.dumps(service_doc([{"name": "https", "port": 443}])).encode()
    return json.dumps(namespace_doc(path.rstrip("/").rsplit("/", 1)[-1])).encode()


@dataclass
class Listening:
    """A test server on 127.0.0.1: a free port, a thread per connection (`_serve`), counted."""

    port: int = field(default=0, kw_only=True)
    connections: int = field(default=0, kw_only=True)
    _listener: socket.socket | None = field(default=None, kw_only=True)
    _stop: threading.Event = field(default_factory=threading.Event, kw_only=True)

    def start(self) -> None:
        self._listener = listener = listening()
        self.port = listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()

    def _accept(self) -> None:
        assert self._listener is not None
        for conn in accepted(self._listener, self._stop):
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = conn.makefile("rb")
        try:
            while not self._stop.is_set():
                path = _read_request(reader)
                if path is None:
                    return
                if not self._answer(conn, path):
                    return
        except OSError:
            return
        finally:
            reader.close()
            conn.close()

    def _answer(self, conn: socket.socket, path: str) -> bool:
        """Answer one request; False when the connection is to be closed."""
        raise NotImplementedError


@dataclass
class HostileApi(Listening):
    mode: str
    requests: list[str] = field(default_factory=list)
    sent: int = 0  # bytes written in all

    def start(self) -> None:
        assert self.mode in MODES, self.mode
        super().start()

    def kubeconfig(self, path: Path, *, host: str = "127.0.0.1") -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: c, cluster: {{server: 'http://{host}:{self.port}'}}}}]\n"
            "users: [{name: u, user: {token: cnibox-test-token}}]\n"
            "contexts: [{name: linkerd-cni-context, context: {cluster: c, user: u}}]\n"
            "current-context: linkerd-cni-context\n"
        )
        return path

    # -- serving

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def _answer(self, conn: socket.socket, path: str) -> bool:
        self.requests.append(path)
        body = body_for(path)
        reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        reply += b"Content-Length: %d\r\n\r\n" % len(body) + body
        mode = self.mode
        if mode.startswith("drip-"):
            return self._drip(conn, reply)
        if mode in _STARTS or mode in _FOREVER:
            self._flood(conn)
            return False
        if mode == "pause" and self._stop.wait(0.4):
            return False
        if mode != "close-unanswered":
            self._send(conn, reply)
        if mode == "close-after-reply":
            time.sleep(0.05)  # the client's next request finds the connection closed
        return mode in ("ok", "pause")

    def _drip(self, conn: socket.socket, reply: bytes) -> bool:
        pause = 0.5 if self.mode == "drip-head" else 0.05
        head_end = reply.index(b"\r\n\r\n") + 4 if self.mode == "drip-body" else 0
        self._send(conn, reply[:head_end])
        for i in range(head_end, len(reply)):
            if self._stop.wait(pause):
                return False
            self._send(conn, reply[i : i + 1])
        return True

    def _flood(self, conn: socket.socket) -> None:
        self._send(conn, _STARTS.get(self.mode, b"HTTP/1.1 200 OK\r\n"))
        forever = _FOREVER.get(self.mode)
        while forever is not None and not self._stop.is_set():
            self._send(conn, forever)


_STARTS = {
    "endless-chunks": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    "huge-length": b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n",
    "unterminated": b"HTTP/1.1 200 OK\r\n\r\n",
    "deep-json": b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n"
    + b"[" * 100000
    + b"]" * 100000,
    "bad-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
    "garbage": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
}
_FOREVER = {
    "endless-head": b"X-Padding: " + b"a" * 100 + b"\r\n",
    "endless-chunks": b"1000\r\n" + b"a" * 4096 + b"\r\n",
    "unterminated": b"a" * 65536,
}


def listening() -> socket.socket:
    """A listening socket on 127.0.0.1 (a free port) whose accept times out (`accepted`)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    return listener


def accepted(listener: socket.socket, stop: threading.Event) -> Iterator[socket.socket]:
    """Each connection `listener` (with an accept timeout) takes, until `stop` or its close."""
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        yield conn


def _read_request(reader: object) -> str | None:
    """The path of one request (its head read and dropped); None at the end."""
    readline = reader.readline  # type: ignore[attr-defined]
    line = readline(65536)
    if not line:
        return None
    parts = line.split()
    while readline(65536).strip():
        pass
    return parts[1].decode() if len(parts) > 1 else ""


@contextmanager
def hostile_api(mode: str) -> Iterator[HostileApi]:
    api = HostileApi(mode)
    api.start()
    try:
        yield api
    finally:
        api.stop()
