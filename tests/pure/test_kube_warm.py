"""Warm API connections (effects/kube.py): a node agent's worker dials before its request;
the request adopts the connection only when it is the same server and TLS settings, young,
and still open. Sockets only (no TLS needed: the checks are the same)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from multicall.core.kube.kubeconfig import KubeConfig
from multicall.effects import kube
from multicall.errors import KubeError

CONFIG = KubeConfig(server="https://10.96.0.1:443", ca_data=b"PEM")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    kube.drop_warm()
    adopted.clear()
    ours.close()
    theirs.close()


def install(sock: socket.socket, config: KubeConfig = CONFIG, age: float = 0.0) -> None:
    endpoint = kube._endpoint(config.server)
    kube._warm[:] = [kube._Warm(kube._warm_key(endpoint, config), sock, time.monotonic() - age)]


adopted: list[socket.socket] = []


def adopt(config: KubeConfig = CONFIG) -> bool:
    warm = kube._adopt_warm(kube._endpoint(config.server), config)
    if warm is not None:
        adopted.append(warm)
    return warm is not None


def test_adopted_when_same_server_and_ca(pair: tuple[socket.socket, socket.socket]) -> None:
    install(pair[0])
    assert adopt()
    assert kube._warm == []  # taken: one request, one connection


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
    pair: tuple[socket.socket, socket.socket], other: KubeConfig
) -> None:
    install(pair[0])
    assert not adopt(other)
    assert pair[0].fileno() == -1  # closed, never kept for later


def test_not_adopted_when_old(pair: tuple[socket.socket, socket.socket]) -> None:
    install(pair[0], age=kube.WARM_MAX_AGE + 1)
    assert not adopt()


def test_not_adopted_when_the_server_closed_it(pair: tuple[socket.socket, socket.socket]) -> None:
    install(pair[0])
    pair[1].close()
    assert not adopt()


def test_not_adopted_when_the_server_spoke_out_of_turn(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    install(pair[0])
    pair[1].send(b"H")
    assert not adopt()


def test_hint_carries_no_token() -> None:
    kube._last_config[:] = [KubeConfig(server="https://h:1", token="secret", ca_data=b"PEM")]
    hint = kube.warm_hint()
    assert hint == {"server": "https://h:1", "ca_data": "PEM", "insecure": False}
    kube._last_config[:] = [KubeConfig(server="https://h:1", ca_file="/ca.crt")]
    assert kube.warm_hint() is None  # a file is read per request, through the caller's root
    kube._last_config.clear()


def test_a_request_on_a_warm_connection_that_times_out_is_not_retried(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """A server that takes the GET on an adopted connection and never answers: the request
    fails as the one-shot path's does, waiting for headers, with no second dial after the
    deadline (which would report a dial timeout instead)."""
    client = kube.KubeClient(KubeConfig(server="http://127.0.0.1:1", token="t"), timeout=0.3)
    install(pair[0], KubeConfig(server="http://127.0.0.1:1", token="t"))
    with pytest.raises(KubeError) as failed:
        client.get_pod("ns", "web")
    assert failed.value.message.endswith(
        "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    ), failed.value.message
    assert pair[1].recv(4096).startswith(b"GET /api/v1/namespaces/ns/pods/web HTTP/1.1\r\n")


def test_a_warm_connection_the_server_closed_meanwhile_is_retried(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """EOF on an adopted connection: the GET goes once more on a new connection (here to a
    port nobody listens on, so the second attempt's own error is what the caller sees)."""
    import threading

    from tests.support.kubeapi import refused_port

    server = f"http://127.0.0.1:{refused_port(None)}"
    config = KubeConfig(server=server, token="t")
    install(pair[0], config)
    client = kube.KubeClient(config, timeout=5)

    def close_after_the_request() -> None:
        pair[1].recv(4096)
        pair[1].shutdown(socket.SHUT_RDWR)

    closer = threading.Thread(target=close_after_the_request)
    closer.start()
    with pytest.raises(KubeError, match="connect: connection refused"):
        client.get_pod("ns", "web")
    closer.join()


def test_an_adopted_connection_reads_by_the_requests_deadline() -> None:
    """A real warm-up, whose own deadline has long passed when the request comes: the
    adopted connection is bounded by the request's deadline (it gets its own reader), and
    the request is served on it without a second dial."""
    import json
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    server = f"http://127.0.0.1:{listener.getsockname()[1]}"
    accepted: list[socket.socket] = []
    body = json.dumps({"kind": "Namespace", "metadata": {"name": "ns"}}).encode()

    def serve() -> None:
        conn, _ = listener.accept()
        accepted.append(conn)
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        conn.sendall(head + body)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        kube.warm_up({"server": server, "ca_data": "", "insecure": False}, timeout=0.2)
        assert len(kube._warm) == 1
        time.sleep(0.3)  # the warm-up's deadline is over
        client = kube.KubeClient(KubeConfig(server=server, token="t"), timeout=5)
        try:
            assert client.get_namespace("ns").name == "ns"
            assert client._conn is not None
            assert client._conn.warm  # adopted, not dialled
        finally:
            client.close()
        thread.join(5)
        assert len(accepted) == 1
    finally:
        kube.drop_warm()
        for conn in accepted:
            conn.close()
        listener.close()
