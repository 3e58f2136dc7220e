"""The admin HTTP server of cnibox's long-running applets: health probes and `/metrics`,
answered from their own threads so that they answer while the applet waits on the API or
the kernel. Each applet names its routes: the repair controller serves kubert's `/live`,
`/ready` and `/metrics`; the node agent serves `/healthz`, `/readyz` and `/metrics`.

Rules of this module:
1. A route answers GET and HEAD (`probe`: text/plain, 200 while its check holds, else 500;
   `metrics`: the exposition, gzip when the client accepts it); other methods get 405,
   with `Allow: GET, HEAD` where the route asks for it; unknown paths get 404 with an empty
   body.
2. Bounded: a request head must arrive within 2 s and fit 8 KiB (kubert's
   `http1_header_read_timeout`/`http1_max_buf_size`); at most MAX_CONNECTIONS are served at
   once, others are closed unanswered; request bodies are not read.
3. A process forked while a server runs holds none of its sockets: the node agent forks its
   workers and the legacy firewall backend forks a child per table operation, and a copy of
   the listener or of a probe's connection there would keep the port bound or the probe's
   connection open after the server is gone. Sockets are accepted, recorded and closed
   under the server's lock, which an at-fork hook holds across every os.fork(), and the
   child closes what is recorded (`_forked_child`). (subprocess' exec never inherits them:
   Python's sockets are close-on-exec.)
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from multicall.errors import CniboxError, UsageError

HEAD_TIMEOUT = 2.0
MAX_HEAD = 8 * 1024
MAX_CONNECTIONS = 16


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP response of the admin server."""

    status: int
    body: bytes = b""
    content_type: str = ""
    headers: tuple[tuple[str, str], ...] = ()


REASONS = {
    200: "OK",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    400: "Bad Request",
    431: "Request Header Fields Too Large",
}


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT`, as Rust's SocketAddr parses `--admin-addr`."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an unbracketed IPv6 address is not a SocketAddr
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(
            f"invalid value {text!r} for '--admin-addr <ADMIN_ADDR>': invalid socket address syntax"
        )
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        raise UsageError(
            f"invalid value {text!r} for '--admin-addr <ADMIN_ADDR>': invalid socket address syntax"
        ) from None
    return host, int(port)


Handler = Callable[[Mapping[str, str]], Reply]  # the request's headers (lower-case names)


@dataclass(frozen=True, slots=True)
class Route:
    """The handler of one admin path."""

    handler: Handler
    announce_allow: bool = False  # a 405 says `Allow: GET, HEAD`


def probe(check: Callable[[], bool], ok: bytes, failing: bytes = b"") -> Route:
    """A health probe: 200 with `ok` while `check()` holds, else 500 with `failing`."""

    def answer(_headers: Mapping[str, str]) -> Reply:
        if check():
            return Reply(200, ok, "text/plain")
        return Reply(500, failing, "text/plain")

    return Route(answer)


def metrics(render: Callable[[], bytes], content_type: str) -> Route:
    """A metrics exposition rendered per scrape, gzip-compressed when the client accepts it."""

    def answer(headers: Mapping[str, str]) -> Reply:
        body = render()
        if "gzip" in headers.get("accept-encoding", ""):
            import gzip

            return Reply(200, gzip.compress(body, 1), content_type, (("Content-Encoding", "gzip"),))
        return Reply(200, body, content_type)

    return Route(answer, announce_allow=True)


class AdminServer:
    """Serves `routes` (path -> Route) on `address` from its own threads until stop()."""

    def __init__(self, address: str, routes: Mapping[str, Route]) -> None:
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, port))
        except OSError as exc:
            self._listener.close()
            raise CniboxError(
                f"failed to bind the admin server to {address}: {exc.strerror}"
            ) from None
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._listener.setblocking(False)
        self.routes = dict(routes)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # rule 3: held for accept, record, close; and at fork
        self._open: set[socket.socket] = set()
        _LIVE.add(self)

    def start(self) -> None:
        threading.Thread(target=self._accept, name="admin", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            with contextlib.suppress(OSError, ValueError):
                select.select([self._listener], [], [], 1.0)  # wakes on stop()'s shutdown
            with self._lock:
                if self._stopped.is_set():
                    return
                try:
                    conn, _ = self._listener.accept()
                except OSError:
                    continue
                if not self._slots.acquire(blocking=False):
                    conn.close()
                    continue
                conn.setblocking(True)
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            buffer = b""
            while True:
                head, buffer = _read_head(conn, buffer)
                if head is None:
                    return
                method, path, headers, keep_alive = head
                reply = self.route(method, path, headers)
                conn.settimeout(HEAD_TIMEOUT)
                conn.sendall(_render(reply, method == "HEAD", keep_alive))
                if not keep_alive:
                    return
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._open.discard(conn)
                conn.close()
            self._slots.release()

    def _forked_child(self) -> None:
        """In a child just forked (rule 3): close every socket of this server, never serve."""
        self._stopped.set()
        for sock in (self._listener, *self._open):
            if sock.fileno() >= 0:
                os.close(sock.detach())  # detached: no later collection closes a reused number
        self._open.clear()

    def route(self, method: str, path: str, headers: Mapping[str, str]) -> Reply:
        route = self.routes.get(path.split("?", 1)[0])
        if route is None:
            return Reply(404)
        if method not in ("GET", "HEAD"):
            allow = (("Allow", "GET, HEAD"),) if route.announce_allow else ()
            return Reply(405, headers=allow)
        return route.handler(headers)


def _read_head(
    conn: socket.socket, buffer: bytes
) -> tuple[tuple[str, str, dict[str, str], bool] | None, bytes]:
    """The next request (method, path, headers, keep-alive) and what followed its head, or
    None when the connection is to be closed (answered 400/431 where that helps)."""
    head, rest = _receive_head(conn, buffer)
    if head is None:
        return None, b""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        conn.sendall(_render(Reply(400), False, False))
        return None, b""
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers:
        return (parts[0], parts[1], headers, False), b""  # a body we will not read: close after
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if parts[2] == "HTTP/1.1" else connection == "keep-alive"
    return (parts[0], parts[1], headers, keep_alive), rest


def _receive_head(conn: socket.socket, buffer: bytes) -> tuple[bytes | None, bytes]:
    """A request head, which must arrive whole within HEAD_TIMEOUT (a client sending a byte
    at a time holds a slot no longer than one that sends nothing) and fit MAX_HEAD."""
    deadline = time.monotonic() + HEAD_TIMEOUT
    while b"\r\n\r\n" not in buffer and len(buffer) <= MAX_HEAD:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, b""
        conn.settimeout(remaining)
        data = conn.recv(4096)
        if not data:
            return None, b""
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    if len(head) > MAX_HEAD:
        conn.sendall(_render(Reply(431), False, False))
        return None, b""
    return head, rest


def _render(reply: Reply, head_only: bool, keep_alive: bool) -> bytes:
    lines = [f"HTTP/1.1 {reply.status} {REASONS.get(reply.status, '')}"]
    if reply.content_type:
        lines.append(f"Content-Type: {reply.content_type}")
    lines += [f"{name}: {value}" for name, value in reply.headers]
    lines.append(f"Content-Length: {len(reply.body)}")
    if not keep_alive:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + reply.body


_LIVE: weakref.WeakSet[AdminServer] = weakref.WeakSet()
_HELD: list[AdminServer] = []  # the servers whose locks the forking thread holds


def _before_fork() -> None:
    for server in list(_LIVE):
        server._lock.acquire()
        _HELD.append(server)


def _after_fork_in_parent() -> None:
    while _HELD:
        _HELD.pop()._lock.release()


def _after_fork_in_child() -> None:
    while _HELD:
        server = _HELD.pop()
        server._forked_child()
        server._lock.release()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
