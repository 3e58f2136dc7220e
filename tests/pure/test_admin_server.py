"""The admin server's routes and bounds (kubert's): a request head must arrive whole within
2 s, at most MAX_CONNECTIONS are served at once, and /live keeps answering through both."""

from __future__ import annotations

import contextlib
import socket
import stat
import time
from collections.abc import Iterator

import pytest

from multicall.effects.admin_server import (
    HEAD_TIMEOUT,
    MAX_CONNECTIONS,
    AdminServer,
    metrics,
    probe,
)


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


def test_connections_beyond_the_limit_are_refused_service(server: AdminServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as extra:
            time.sleep(0.2)  # the server has closed it already: no slot
            try:
                extra.sendall(b"GET /live HTTP/1.1\r\n\r\n")
                answer = extra.recv(100)
            except ConnectionResetError:
                answer = b""
            assert answer == b""
        time.sleep(HEAD_TIMEOUT + 0.5)  # the idle ones time out and free their slots
        assert live(server.port).endswith(b"alive\n")
    finally:
        for s in idle:
            s.close()


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
