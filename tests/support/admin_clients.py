"""Hostile clients of an admin server (effects/admin_server.py) and the kubelet's probe, to
show that probes are answered whatever the others do (issues 24 #5 and 30 #8).

`HostileClients` drives many connections from ONE thread (non-blocking sockets), so that the
test process adds little load of its own: idle connections that never send, slow ones that
trickle a request head a byte at a time, keep-alive ones that scrape now and then and keep
their connection, and scrapers that ask /metrics again as soon as answered. Each reconnects
as soon as the server closes it: the pressure never lets up.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from dataclasses import dataclass, field

PROBE_TIMEOUT = 5.0  # a probe not answered by then counts as this long (a failure)


@dataclass(eq=False)
class _Client:
    kind: str
    sock: socket.socket | None = None
    sent: int = 0  # bytes of the current request sent
    buffer: bytes = b""
    waiting: bool = False  # for a reply
    next_at: float = 0.0


@dataclass
class HostileClients:
    port: int
    idle: int = 0
    slow: int = 0
    keep_alive: int = 0
    scrapers: int = 0
    path: str = "/metrics"
    answered: int = 0  # replies the keep-alive clients and scrapers got
    connects: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> HostileClients:
        kinds = ["idle"] * self.idle + ["slow"] * self.slow + ["keep-alive"] * self.keep_alive
        self._clients = [_Client(kind) for kind in kinds + ["scraper"] * self.scrapers]
        for client in self._clients:
            self._connect(client)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        time.sleep(0.5)  # all of them in place before the first probe
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for client in self._clients:
            if client.sock is not None:
                client.sock.close()

    def _request(self) -> bytes:
        return f"GET {self.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()

    def _connect(self, client: _Client) -> None:
        if client.sock is not None:
            client.sock.close()
        client.sock = None
        try:
            client.sock = socket.create_connection(("127.0.0.1", self.port), timeout=1)
        except OSError:
            client.next_at = time.monotonic() + 0.05  # retried
            return
        self.connects += 1
        client.sock.setblocking(False)
        client.sent, client.buffer, client.waiting, client.next_at = 0, b"", False, 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for client in self._clients:
                if client.sock is None:
                    if now >= client.next_at:
                        self._connect(client)
                    continue
                if client.waiting or now < client.next_at or client.kind == "idle":
                    continue
                request = self._request()
                step = 1 if client.kind == "slow" else len(request)
                try:
                    client.sock.send(request[client.sent : client.sent + step])
                except BlockingIOError:
                    continue
                except OSError:
                    self._connect(client)
                    continue
                client.sent += step
                if client.kind == "slow":
                    client.next_at = now + 0.3
                    if client.sent >= len(request) - 1:  # never the last byte: never whole
                        client.sent = 0
                elif client.sent >= len(request):
                    client.sent, client.waiting = 0, True
            socks = [c.sock for c in self._clients if c.sock is not None]
            with contextlib.suppress(OSError, ValueError):
                readable, _, _ = select.select(socks, [], [], 0.05)
                for client in self._clients:
                    if client.sock is not None and client.sock in readable:
                        self._read(client)

    def _read(self, client: _Client) -> None:
        assert client.sock is not None
        try:
            data = client.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._connect(client)  # closed by the server: straight back
            return
        client.buffer += data
        head, sep, body = client.buffer.partition(b"\r\n\r\n")
        if not sep:
            return
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(body) >= length:
            self.answered += 1
            client.buffer, client.waiting = b"", False
            client.next_at = time.monotonic() + (1.0 if client.kind == "keep-alive" else 0.0)


def probe_seconds(port: int, path: str) -> float:
    """One probe as the kubelet sends it (a new connection, `Connection: close`): seconds to a
    200, or PROBE_TIMEOUT when it was not answered 200 by then."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(4096):
                data += chunk
    except OSError:
        return PROBE_TIMEOUT
    return time.monotonic() - started if data.startswith(b"HTTP/1.1 200 ") else PROBE_TIMEOUT


def probe_series(port: int, path: str, count: int = 10, every: float = 0.2) -> list[float]:
    """`count` probes, `every` seconds apart: the seconds each took."""
    times = []
    for _ in range(count):
        times.append(probe_seconds(port, path))
        time.sleep(every)
    return times


def assert_probes_answer_through_hostile_clients(port: int, path: str) -> None:
    """Issues 24 #5 / 30 #8 against a running applet: 8 idle, 8 trickling and 8 keep-alive
    clients, then 32 scrapers asking /metrics as soon as answered; 10 probes of `path`
    through each must all answer 200 within 1 s, and the scrapes be served too."""
    with HostileClients(port, idle=8, slow=8, keep_alive=8):
        times = probe_series(port, path, count=10)
    assert max(times) < 1.0, times
    with HostileClients(port, scrapers=32) as flood:
        times = probe_series(port, path, count=10)
    assert max(times) < 1.0, times
    assert flood.answered > 10
