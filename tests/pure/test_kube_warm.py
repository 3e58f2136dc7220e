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

CONFIG = KubeConfig(server="https://10.96.0.1:443", ca_data=b"PEM")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    kube.drop_warm()
    for warm in adopted:
        warm.reader.close()
    adopted.clear()
    ours.close()
    theirs.close()


def install(sock: socket.socket, config: KubeConfig = CONFIG, age: float = 0.0) -> None:
    endpoint = kube._endpoint(config.server)
    kube._warm[:] = [
        kube._Warm(
            kube._warm_key(endpoint, config), sock, sock.makefile("rb"), time.monotonic() - age
        )
    ]


adopted: list[kube._Warm] = []


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
