"""Warm API connections (effects/kube/warm.py): a node agent's worker dials before its
request; the request adopts the connection only when it is the same server and TLS settings,
young, and still open. Sockets only (no TLS needed: the checks are the same)."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from multicall.core.kube.kubeconfig import KubeConfig
from multicall.effects.kube import warm as kube_warm
from multicall.effects.kube.client import KubeClient
from multicall.effects.kube.config import endpoint
from multicall.effects.kube.warm import WarmConnections
from multicall.errors import KubeError

CONFIG = KubeConfig(server="https://10.96.0.1:443", ca_data=b"PEM")


@pytest.fixture
def warm() -> Iterator[WarmConnections]:
    connections = WarmConnections()
    yield connections
    connections.drop_warm()


@pytest.fixture
def pair(warm: WarmConnections) -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    warm.drop_warm()
    adopted.clear()
    ours.close()
    theirs.close()


def install(
    warm: WarmConnections, sock: socket.socket, config: KubeConfig = CONFIG, age: float = 0.0
) -> None:
    """`sock` as `warm`'s warm connection for `config`, made `age` seconds ago."""
    key = kube_warm._warm_key(endpoint(config.server), config)
    warm._warm = kube_warm._Warm(key, sock, time.monotonic() - age)


adopted: list[socket.socket] = []


def adopt(warm: WarmConnections, config: KubeConfig = CONFIG) -> bool:
    sock = warm.adopt(endpoint(config.server), config)
    if sock is not None:
        adopted.append(sock)
    return sock is not None


def test_adopted_when_same_server_and_ca(
    warm: WarmConnections, pair: tuple[socket.socket, socket.socket]
) -> None:
    install(warm, pair[0])
    assert adopt(warm)
    assert warm.warm_fds() == frozenset()  # taken: one request, one connection


@pytest.mark.parametrize(
    "other",
    [
        KubeConfig(server="https://10.96.0.2:443", ca_data=b"PEM"),
        KubeConfig(server="https://10.96.0.1:6443", ca_data=b"PEM"),
        KubeConfig(server="https://10.96.0.1:443", ca_data=b"OTHER"),
        KubeConfig(server="https://10.96.0.1:443", ca_data=b"PEM", insecure_skip_tls_verify=True),
        KubeConfig(server="https://10.96.0.1:443", ca_data=b"PEM", ca_file="/ca.crt"),
    ],
)
def test_not_adopted_for_another_server_or_trust(
    warm: WarmConnections, pair: tuple[socket.socket, socket.socket], other: KubeConfig
) -> None:
    install(warm, pair[0])
    assert not adopt(warm, other)
    assert pair[0].fileno() == -1  # closed, never kept for later


def test_not_adopted_when_old(
    warm: WarmConnections, pair: tuple[socket.socket, socket.socket]
) -> None:
    install(warm, pair[0], age=kube_warm.WARM_MAX_AGE + 1)
    assert not adopt(warm)


def test_not_adopted_when_the_server_closed_it(
    warm: WarmConnections, pair: tuple[socket.socket, socket.socket]
) -> None:
    install(warm, pair[0])
    pair[1].close()
    assert not adopt(warm)


def test_not_adopted_when_the_server_spoke_out_of_turn(
    warm: WarmConnections, pair: tuple[socket.socket, socket.socket]
) -> None:
    install(warm, pair[0])
    pair[1].send(b"H")
    assert not adopt(warm)


def test_hint_carries_no_token(warm: WarmConnections) -> None:
    assert warm.warm_hint() is None  # no request yet
    warm.remember(KubeConfig(server="https://h:1", token="secret", ca_data=b"PEM"))
    hint = warm.warm_hint()
    assert hint == {
        "server": "https://h:1",
        "ca_data": "PEM",
        "insecure": False,
        "tls_server_name": "",
    }
    warm.remember(KubeConfig(server="https://h:1", ca_file="/ca.crt"))
    assert warm.warm_hint() is None  # a file is read per request, through the caller's root


def test_a_client_remembers_its_config_only_with_warm_connections(
    warm: WarmConnections,
) -> None:
    """The one-shot plugin's client has no pool: nothing of it outlives the client."""
    config = KubeConfig(server="https://h:1", token="t", insecure_skip_tls_verify=True)
    KubeClient(config).close()
    assert warm.warm_hint() is None
    KubeClient(config, warm=warm).close()
    assert warm.warm_hint() == {
        "server": "https://h:1",
        "ca_data": "",
        "insecure": True,
        "tls_server_name": "",
    }


def test_a_request_on_a_warm_connection_that_times_out_is_not_retried(
    warm: WarmConnections, pair: tuple[socket.socket, socket.socket]
) -> None:
    """A server that takes the GET on an adopted connection and never answers: the request
    fails as the one-shot path's does, waiting for headers, with no second dial after the
    deadline (which would report a dial timeout instead)."""
    config = KubeConfig(server="http://127.0.0.1:1", token="t")
    client = KubeClient(config, timeout=0.3, warm=warm)
    install(warm, pair[0], config)
    with pytest.raises(KubeError) as failed:
        client.get_pod("ns", "web")
    assert failed.value.message.endswith(
        "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    ), failed.value.message
    assert pair[1].recv(4096).startswith(b"GET /api/v1/namespaces/ns/pods/web HTTP/1.1\r\n")


def test_a_warm_connection_the_server_closed_meanwhile_is_retried(
    warm: WarmConnections, pair: tuple[socket.socket, socket.socket]
) -> None:
    """EOF on an adopted connection: the GET goes once more on a new connection (here to a
    port nobody listens on, so the second attempt's own error is what the caller sees)."""
    import threading

    from tests.support.kubeapi import refused_port

    server = f"http://127.0.0.1:{refused_port(None)}"
    config = KubeConfig(server=server, token="t")
    install(warm, pair[0], config)
    client = KubeClient(config, timeout=5, warm=warm)

    def close_after_the_request() -> None:
        pair[1].recv(4096)
        pair[1].shutdown(socket.SHUT_RDWR)

    closer = threading.Thread(target=close_after_the_request)
    closer.start()
    with pytest.raises(KubeError, match="connect: connection refused"):
        client.get_pod("ns", "web")
    closer.join()


class _OneConnectionApi:
    """An API server on loopback that accepts one connection and answers `answers` GETs on
    it with a Namespace; `accepted` says how many connections it took."""

    def __init__(self, answers: int) -> None:
        import threading

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.server = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, args=(answers,), daemon=True)
        self.thread.start()

    def _serve(self, answers: int) -> None:
        import json

        body = json.dumps({"kind": "Namespace", "metadata": {"name": "ns"}}).encode()
        conn, _ = self.listener.accept()
        self.accepted.append(conn)
        for _ in range(answers):
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            conn.sendall(head + body)

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.listener.close()


def _get_on_a_warm_connection(client: KubeClient) -> None:
    try:
        assert client.get_namespace("ns").name == "ns"
        assert client._conn is not None
        assert client._conn.warm  # adopted, not dialled
    finally:
        client.close()


def test_an_adopted_connection_reads_by_the_requests_deadline(warm: WarmConnections) -> None:
    """A real warm-up, whose own deadline has long passed when the request comes: the
    adopted connection is bounded by the request's deadline (it gets its own reader), and
    the request is served on it without a second dial."""
    api = _OneConnectionApi(answers=1)
    try:
        warm.warm_up({"server": api.server, "ca_data": "", "insecure": False}, timeout=0.2)
        assert len(warm.warm_fds()) == 1
        time.sleep(0.3)  # the warm-up's deadline is over
        _get_on_a_warm_connection(
            KubeClient(KubeConfig(server=api.server, token="t"), timeout=5, warm=warm)
        )
        api.thread.join(5)
        assert len(api.accepted) == 1
    finally:
        warm.drop_warm()
        api.close()


@pytest.mark.parametrize("parking", [True, False])
def test_a_parking_worker_keeps_the_connection_a_request_ended_with(
    warm: WarmConnections, parking: bool
) -> None:
    """`park_connections`: an intact connection outlives its client as the next request's
    warm one (one connection accepted for two clients); without it, the client closes it."""
    api = _OneConnectionApi(answers=2 if parking else 1)
    config = KubeConfig(server=api.server, token="t")
    if parking:
        warm.park_connections()
    try:
        first = KubeClient(config, timeout=5, warm=warm)
        assert first.get_namespace("ns").name == "ns"
        first.close()
        assert len(warm.warm_fds()) == (1 if parking else 0)
        if parking:
            _get_on_a_warm_connection(KubeClient(config, timeout=5, warm=warm))
        api.thread.join(5)
        assert len(api.accepted) == 1
    finally:
        warm.drop_warm()
        api.close()


def test_a_trust_settings_context_is_made_once_per_process(tmp_path: Path) -> None:
    """Rule 4: a reused worker's requests with the same CA data (or insecure) share one
    client context (making it was ~0.8 ms of each ADD); other CA bytes, insecure, or a CA
    file get their own, and a CA file's is made anew each time (the file is read per
    request). Nothing is kept beyond MAX_CONTEXTS."""
    from tests.support.pki import make_pki

    pki = make_pki(tmp_path / "pki")
    pem = pki.ca_cert.read_bytes()
    warm = WarmConnections()
    a = KubeConfig(server="https://10.96.0.1:443", ca_data=pem)
    other_server = KubeConfig(server="https://10.96.0.2:6443", ca_data=pem, tls_server_name="x")
    insecure = KubeConfig(server="https://10.96.0.1:443", insecure_skip_tls_verify=True)
    from_file = KubeConfig(server="https://10.96.0.1:443", ca_file=str(pki.ca_cert))
    ctx = warm.tls_context(a)
    assert warm.tls_context(a) is ctx
    assert warm.tls_context(other_server) is ctx  # the same trust: the name is per connection
    assert warm.tls_context(insecure) is not ctx
    assert warm.tls_context(insecure).verify_mode == ssl.CERT_NONE
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname
    assert warm.tls_context(from_file) is not warm.tls_context(from_file)
    for i in range(kube_warm.MAX_CONTEXTS + 1):
        warm.tls_context(KubeConfig(server="https://h:1", insecure_skip_tls_verify=bool(i % 2)))
    assert len(warm._contexts) <= kube_warm.MAX_CONTEXTS
