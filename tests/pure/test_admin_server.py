"""The admin server's routes and bounds (kubert's): a request head must arrive whole within
2 s, at most MAX_CONNECTIONS are open at once, and /live answers within 1 s whatever other
clients do (idle, slow, keep-alive, a scrape flood: issues 24 #5 and 30 #8)."""

from __future__ import annotations

import contextlib
import socket
import stat
import time
from collections.abc import Callable, Iterator

import pytest

from multicall.effects.admin_server import (
    HEAD_TIMEOUT,
    MAX_CONNECTIONS,
    OTHER_THREADS,
    AdminServer,
    metrics,
    probe,
)
from tests.support.admin_clients import HostileClients, probe_series


@pytest.fixture
def server() -> Iterator[AdminServer]:
    routes = {
        "/live": probe(lambda: True, b"alive\n"),
        "/ready": probe(lambda: False, b"ready\n", b"not ready\n"),
        "/metrics": metrics(lambda: b"# EOF\n", "text/plain"),
    }
    admin = AdminServer("127.0.0.1:0", routes)
    admin.start()
    try:
        yield admin
    finally:
        admin.stop()


@contextlib.contextmanager
def serving(render: Callable[[], bytes]) -> Iterator[AdminServer]:
    """A started server with /live and a /metrics rendered by `render`."""
    admin = AdminServer("127.0.0.1:0", {
        "/live": probe(lambda: True, b"alive\n"),
        "/metrics": metrics(render, "text/plain"),
    })  # fmt: skip
    admin.start()
    try:
        yield admin
    finally:
        admin.stop()


def live(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return data


def ask(port: int, method: str, path: str) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return data


def test_live_answers(server: AdminServer) -> None:
    answer = live(server.port)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert answer.endswith(b"\r\n\r\nalive\n")


def test_routes_methods_and_unknown_paths(server: AdminServer) -> None:
    """A failing probe is 500 with its text; HEAD has no body; other methods are 405, with
    `Allow` where the route asks for it; an unknown path is 404."""
    assert ask(server.port, "GET", "/ready").startswith(b"HTTP/1.1 500 ")
    assert ask(server.port, "GET", "/ready?verbose").endswith(b"\r\n\r\nnot ready\n")
    head = ask(server.port, "HEAD", "/live")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 6\r\n" in head
    assert head.endswith(b"\r\n\r\n")
    assert b"Allow: GET, HEAD" in ask(server.port, "POST", "/metrics")
    refused = ask(server.port, "POST", "/live")
    assert refused.startswith(b"HTTP/1.1 405 ")
    assert b"Allow:" not in refused
    assert ask(server.port, "GET", "/healthz").startswith(b"HTTP/1.1 404 ")


def test_a_trickling_client_is_cut_off_after_the_head_timeout(server: AdminServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        started = time.monotonic()
        closed = False
        for byte in b"GET /live HTTP/1.1\r\nHost: slowloris\r\n":
            try:
                s.sendall(bytes([byte]))
                time.sleep(0.2)
            except OSError:
                closed = True
                break
            if time.monotonic() - started > HEAD_TIMEOUT + 4:
                break
        if not closed:
            s.settimeout(2)
            closed = s.recv(100) == b""  # the server closed without answering
        assert closed
        assert time.monotonic() - started < HEAD_TIMEOUT + 5  # a bound, not a speed test
    assert live(server.port).endswith(b"alive\n")


def test_beyond_the_limit_the_longest_waiting_connection_makes_room(server: AdminServer) -> None:
    """Rule 3: MAX_CONNECTIONS idle connections fill the server; one more is served, and the
    connection that waited longest is the one closed (not the newest: a probe gets in)."""
    idle = []
    try:
        for _ in range(MAX_CONNECTIONS):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=5))
            time.sleep(0.002)  # accepted in this order
        time.sleep(0.2)
        assert live(server.port).endswith(b"alive\n")
        assert len(server._open) <= MAX_CONNECTIONS
        idle[0].settimeout(2)
        assert idle[0].recv(100) == b""  # the oldest was closed, unanswered
    finally:
        for s in idle:
            s.close()


def test_idle_connections_are_closed_after_the_head_timeout(server: AdminServer) -> None:
    """An idle keep-alive connection holds nothing for longer than HEAD_TIMEOUT."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=HEAD_TIMEOUT + 5) as s:
        s.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive
        assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")
        started = time.monotonic()
        assert s.recv(100) == b""
        assert time.monotonic() - started < HEAD_TIMEOUT + 3  # a bound, not a speed test
    deadline = time.monotonic() + 2
    while server._open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server._open


def test_pipelined_keep_alive_requests_are_each_answered(server: AdminServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /live HTTP/1.1\r\n\r\nGET /ready HTTP/1.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.count(b"HTTP/1.1 ") == 2
    assert data.endswith(b"not ready\n")


@pytest.mark.parametrize("kind", ["idle", "slow", "keep-alive"])
def test_probes_answer_through_hostile_keep_alive_clients(kind: str) -> None:
    """Issues 24 #5 / 30 #8: 24 clients that never finish a head, or hold their keep-alive
    connection between scrapes, reconnecting as soon as closed, filled every slot of the old
    server (0 of 10 probes answered); now each probe answers within 1 s."""
    with serving(lambda: b"# EOF\n" * 1000) as admin:
        hostile_clients = HostileClients(
            admin.port,
            idle=24 if kind == "idle" else 0,
            slow=24 if kind == "slow" else 0,
            keep_alive=24 if kind == "keep-alive" else 0,
        )
        with hostile_clients as hostile:
            times = probe_series(admin.port, "/live", count=10)
        assert max(times) < 1.0, times
        assert hostile.connects >= 24
        if kind == "keep-alive":
            assert hostile.answered >= 24  # they were served too


def test_probes_answer_through_a_scrape_flood() -> None:
    """32 scrapers asking a /metrics that takes 0.3 s to render, again as soon as answered:
    probes never wait behind them (their own threads), each answers within 1 s."""

    def slow_render() -> bytes:
        time.sleep(0.3)
        return b"# EOF\n"

    with serving(slow_render) as admin:
        with HostileClients(admin.port, scrapers=32) as hostile:
            times = probe_series(admin.port, "/live", count=10)
        assert max(times) < 1.0, times
        assert hostile.answered >= 2  # the scrapes were served all along


def test_a_handler_that_raises_is_a_500_and_the_server_goes_on() -> None:
    def broken() -> bytes:
        raise RuntimeError("bug")

    with serving(broken) as admin:
        for _ in range(OTHER_THREADS + 1):  # every thread of its pool survives
            assert ask(admin.port, "GET", "/metrics").startswith(b"HTTP/1.1 500 ")
        assert live(admin.port).endswith(b"alive\n")


def test_a_forked_child_holds_none_of_the_servers_sockets(server: AdminServer) -> None:
    """Rule 3: forked while a probe's connection is open (the agent's workers, the legacy
    backend's children), the child has neither the listener nor that connection, and the
    parent goes on serving."""
    import os

    def server_sockets() -> set[tuple[int, int]]:
        """(device, inode) of every TCP socket this process holds open."""
        found = set()
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                st = os.stat(f"/proc/self/fd/{name}")
                if stat.S_ISSOCK(st.st_mode):
                    found.add((st.st_dev, st.st_ino))
        return found

    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as held:
        deadline = time.monotonic() + 5
        while not server._open and time.monotonic() < deadline:  # accepted and recorded
            time.sleep(0.01)
        owned = {(os.fstat(s.fileno()).st_dev, os.fstat(s.fileno()).st_ino)
                 for s in (server._listener, *server._open)}  # fmt: skip
        assert len(owned) == 2
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            os.close(read_end)
            os.write(write_end, b"leaked" if owned & server_sockets() else b"clean")
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as verdict:
            assert verdict.read() == b"clean"
        os.waitpid(pid, 0)
        held.sendall(b"GET /live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert held.recv(4096).startswith(b"HTTP/1.1 200 OK")
    assert live(server.port).endswith(b"alive\n")
