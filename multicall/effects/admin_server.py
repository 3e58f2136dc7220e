"""The admin HTTP server of cnibox's long-running applets: health probes and `/metrics`,
answered from their own threads so that they answer while the applet waits on the API or
the kernel. Each applet names its routes: the repair controller serves kubert's `/live`,
`/ready` and `/metrics`; the node agent serves `/healthz`, `/readyz` and `/metrics`.

Rules of this module:
1. A route answers GET and HEAD (`probe`: text/plain, 200 while its check holds, else 500;
   `metrics`: the exposition, gzip when the client accepts it); other methods get 405,
   with `Allow: GET, HEAD` where the route asks for it; unknown paths get 404 with an empty
   body.
2. A probe never waits behind another client (issues 24 #5, 30 #8: sixteen idle or slow
   keep-alive clients used to hold every slot, and the kubelet restarted the applet). One
   thread (`_io`) accepts and reads every request head without blocking on any client; a
   whole head goes to a pool of its own: probe routes to PROBE_THREADS threads no other
   request reaches, everything else (scrapes, 404s, 400s) to OTHER_THREADS. So however many
   scrapes are slow or queued, a probe waits only for the probes ahead of it.
3. Bounded: a request head must arrive whole within HEAD_TIMEOUT of the connection or of the
   previous reply (kubert's `http1_header_read_timeout`, which hyper also applies to an idle
   keep-alive connection) and fit MAX_HEAD (kubert's `http1_max_buf_size`); a reply must be
   written within REPLY_TIMEOUT; at most MAX_CONNECTIONS are open, and the one more accepted
   beyond closes the connection that has waited longest for its head or its turn (not one
   being answered: at most the pools' threads), so a new probe always gets in. Request
   bodies are not read.
4. A process forked while a server runs holds none of its sockets: the node agent forks its
   workers and the legacy firewall backend forks a child per table operation, and a copy of
   the listener or of a probe's connection there would keep the port bound or the probe's
   connection open after the server is gone. Sockets are accepted, recorded and closed
   under the server's lock, which an at-fork hook holds across every os.fork(), and the
   child closes what is recorded (`_forked_child`). (subprocess' exec never inherits them:
   Python's sockets and pipes are close-on-exec.)
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from multicall.core.go.strconv import leading_uint64
from multicall.errors import CniboxError, UsageError

HEAD_TIMEOUT = 2.0
REPLY_TIMEOUT = 2.0
MAX_HEAD = 8 * 1024
MAX_CONNECTIONS = 64  # x MAX_HEAD: at most 512 KiB of buffered heads
PROBE_THREADS = 2  # two: one probe whose check hangs (the agent's loop, 2 s) delays no other
OTHER_THREADS = 2


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
    # Rust's port: ASCII digits, leading zeros free, any length, at most 65535 (read without
    # handing long text to int(): CPython refuses more than 4,300 digits).
    number = leading_uint64(port) if port else None
    if not sep or not host or number is None or number[1] != len(port) or number[0] > 65535:
        raise _bad_address(text)
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except (OSError, ValueError):  # ValueError: a NUL or a lone surrogate in the text
        raise _bad_address(text) from None
    return host, number[0]


def _bad_address(text: str) -> UsageError:
    shown = text if len(text) <= 200 else f"{text[:200]}..."
    return UsageError(
        f"invalid value {shown!r} for '--admin-addr <ADMIN_ADDR>': invalid socket address syntax"
    )


Handler = Callable[[Mapping[str, str]], Reply]  # the request's headers (lower-case names)


@dataclass(frozen=True, slots=True)
class Route:
    """The handler of one admin path."""

    handler: Handler
    announce_allow: bool = False  # a 405 says `Allow: GET, HEAD`
    is_probe: bool = False  # served by the probe threads (rule 2)


def probe(check: Callable[[], bool], ok: bytes, failing: bytes = b"") -> Route:
    """A health probe: 200 with `ok` while `check()` holds, else 500 with `failing`."""

    def answer(_headers: Mapping[str, str]) -> Reply:
        if check():
            return Reply(200, ok, "text/plain")
        return Reply(500, failing, "text/plain")

    return Route(answer, is_probe=True)


def metrics(render: Callable[[], bytes], content_type: str) -> Route:
    """A metrics exposition rendered per scrape, gzip-compressed when the client accepts it."""

    def answer(headers: Mapping[str, str]) -> Reply:
        body = render()
        if "gzip" in headers.get("accept-encoding", ""):
            import gzip

            return Reply(200, gzip.compress(body, 1), content_type, (("Content-Encoding", "gzip"),))
        return Reply(200, body, content_type)

    return Route(answer, announce_allow=True)


@dataclass(eq=False, slots=True)
class _Conn:
    """One client connection: `reading` its next head (in `_io`), `queued` for a pool,
    `serving` (a pool thread answers it) or `closed`."""

    sock: socket.socket
    since: float  # when it started waiting for its head or its turn
    state: str = "reading"
    buffer: bytes = b""
    request: tuple[str, str, dict[str, str], bool] | None = None  # method, path, headers, k-a
    error: Reply | None = None  # answered instead, then closed


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
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._listener.setblocking(False)
        self.routes = dict(routes)
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # rule 4: held for accept, record, close; and at fork
        self._open: dict[socket.socket, _Conn] = {}
        self._probes: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._others: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._returned: deque[_Conn] = deque()  # answered keep-alive connections, for `_io`
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        _LIVE.add(self)

    def start(self) -> None:
        threading.Thread(target=self._io, name="admin", daemon=True).start()
        for jobs, count in ((self._probes, PROBE_THREADS), (self._others, OTHER_THREADS)):
            for _ in range(count):
                threading.Thread(target=self._answer, args=(jobs,), daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        with self._lock:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            for conn in self._open.values():  # a keep-alive client learns at once
                conn.state = "closed"
                conn.sock.close()
            self._open.clear()
        self._wake()
        for _ in range(PROBE_THREADS):
            self._probes.put(None)
        for _ in range(OTHER_THREADS):
            self._others.put(None)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full: a wake-up is pending; closed: stopping
            os.write(self._wake_w, b"\0")

    # ------------------------------------------------------------------ the io thread

    def _io(self) -> None:
        """Accepts, reads heads, hands whole ones to the pools, closes what overstays."""
        poller = select.poll()
        poller.register(self._listener.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        reading: dict[int, _Conn] = {}
        while not self._stopped.is_set():
            now = time.monotonic()
            soonest = min((c.since for c in reading.values()), default=now) + HEAD_TIMEOUT
            try:
                events = poller.poll(max(10, min(1000, int((soonest - now) * 1000) + 1)))
            except (OSError, ValueError):
                return
            if self._stopped.is_set():
                return
            for fd, _ in events:
                if fd == self._wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 4096)
                elif fd == self._listener.fileno():
                    self._accept_all(poller, reading)
                elif (conn := reading.get(fd)) is not None:
                    self._receive(conn)
                    if conn.state != "reading":
                        poller.unregister(fd)
                        del reading[fd]
            self._take_back(poller, reading)
            now = time.monotonic()
            for fd, conn in list(reading.items()):
                if now - conn.since > HEAD_TIMEOUT:  # a slow or idle client (rule 3)
                    poller.unregister(fd)
                    del reading[fd]
                    self._close(conn)

    def _take_back(self, poller: select.poll, reading: dict[int, _Conn]) -> None:
        """Keep-alive connections the pools answered wait for their next head here again."""
        while self._returned:
            conn = self._returned.popleft()
            if conn.state != "reading":
                continue  # closed meanwhile
            self._parse(conn)  # a pipelined request may be whole already
            if conn.state == "reading":
                reading[conn.sock.fileno()] = conn
                poller.register(conn.sock.fileno(), select.POLLIN)

    def _accept_all(self, poller: select.poll, reading: dict[int, _Conn]) -> None:
        while True:
            with self._lock:
                if self._stopped.is_set():
                    return
                try:
                    sock, _ = self._listener.accept()
                except OSError:
                    return
                if len(self._open) >= MAX_CONNECTIONS and not self._evict(poller, reading):
                    sock.close()  # every connection is being answered: the pools are busy
                    continue
                sock.setblocking(False)
                conn = _Conn(sock, time.monotonic())
                self._open[sock] = conn
            reading[sock.fileno()] = conn
            poller.register(sock.fileno(), select.POLLIN)

    def _evict(self, poller: select.poll, reading: dict[int, _Conn]) -> bool:
        """Close the connection that has waited longest for its head or its turn (rule 3);
        False when every one is being answered. Called with the lock held."""
        waiting = [c for c in self._open.values() if c.state in ("reading", "queued")]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.since)
        fd = oldest.sock.fileno()
        if reading.pop(fd, None) is not None:  # (not yet when `_returned` still holds it)
            poller.unregister(fd)
        oldest.state = "closed"  # a queued one: its pool thread skips it
        del self._open[oldest.sock]
        oldest.sock.close()
        return True

    def _receive(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.buffer += data
        self._parse(conn)

    def _parse(self, conn: _Conn) -> None:
        """Queue `conn` for its pool once its buffer holds a whole head (or an error)."""
        head, sep, rest = conn.buffer.partition(b"\r\n\r\n")
        if len(head) > MAX_HEAD:
            conn.error = Reply(431)
        elif not sep:
            return
        else:
            conn.request, conn.error = _parse_head(head)
            conn.buffer = rest if conn.request is not None and conn.request[3] else b""
        route = self.routes.get(conn.request[1].split("?", 1)[0]) if conn.request else None
        with self._lock:
            if conn.state != "reading":
                return
            conn.state, conn.since = "queued", time.monotonic()
        (self._probes if route is not None and route.is_probe else self._others).put(conn)

    # ------------------------------------------------------------------ the pools

    def _answer(self, jobs: queue.SimpleQueue[_Conn | None]) -> None:
        while (conn := jobs.get()) is not None:
            with self._lock:
                if conn.state != "queued":
                    continue  # evicted while it waited
                conn.state = "serving"
            keep_alive = False
            head_only = False
            if conn.request is None:
                reply = conn.error or Reply(400)
            else:
                method, path, headers, keep_alive = conn.request
                head_only = method == "HEAD"
                try:
                    reply = self.route(method, path, headers)
                except Exception:  # noqa: BLE001 - a handler's bug: a 500, never a dead thread
                    reply, keep_alive = Reply(500), False
            try:
                conn.sock.settimeout(REPLY_TIMEOUT)  # for the whole sendall (rule 3)
                conn.sock.sendall(_render(reply, head_only, keep_alive))
                conn.sock.setblocking(False)
            except (OSError, ValueError):
                keep_alive = False
            if not keep_alive or self._stopped.is_set():
                self._close(conn)
                continue
            with self._lock:
                if conn.state != "serving":
                    continue
                conn.state, conn.since, conn.request = "reading", time.monotonic(), None
            self._returned.append(conn)
            self._wake()

    def _close(self, conn: _Conn) -> None:
        with self._lock:
            if conn.state == "closed":
                return
            conn.state = "closed"
            self._open.pop(conn.sock, None)
            conn.sock.close()

    def _forked_child(self) -> None:
        """In a child just forked (rule 4): close every socket of this server, never serve."""
        self._stopped.set()
        for sock in (self._listener, *self._open):
            if sock.fileno() >= 0:
                os.close(sock.detach())  # detached: no later collection closes a reused number
        self._open.clear()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def route(self, method: str, path: str, headers: Mapping[str, str]) -> Reply:
        route = self.routes.get(path.split("?", 1)[0])
        if route is None:
            return Reply(404)
        if method not in ("GET", "HEAD"):
            allow = (("Allow", "GET, HEAD"),) if route.announce_allow else ()
            return Reply(405, headers=allow)
        return route.handler(headers)


def _parse_head(head: bytes) -> tuple[tuple[str, str, dict[str, str], bool] | None, Reply | None]:
    """A request head as (method, path, headers, keep-alive), or the error to answer."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None, Reply(400)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers:
        return (parts[0], parts[1], headers, False), None  # a body we will not read: close after
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if parts[2] == "HTTP/1.1" else connection == "keep-alive"
    return (parts[0], parts[1], headers, keep_alive), None


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
