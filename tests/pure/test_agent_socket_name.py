"""The agent's temporary socket name (agent/server.py `listen`): a socket path that fits a
sun_path (108 bytes with its NUL) is bound whatever its length, because the temporary name
that is renamed over it is as long as the socket's own, in the same directory. Before, it
was `{path}.{pid}.{16 hex}.tmp`, ~28 bytes longer than the path: an agent whose socket
path had 80-107 bytes could not start ("cannot listen on …: None"). No root: tmp_path."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from multicall.agent.server import Server, ServerOptions


def test_a_socket_path_near_the_sun_path_limit_is_bound(tmp_path: Path) -> None:
    base = tmp_path / "s"
    base.mkdir()
    room = 107 - len(str(base)) - len("/agent.sock") - 1  # a path of 107 bytes in all
    assert room > 0, "tmp_path too long for this test"
    directory = base / ("d" * room)
    path = directory / "agent.sock"
    assert len(str(path)) == 107
    server = Server(ServerOptions(socket_path=str(path), admin_addr=""), lambda *a: None, None)  # type: ignore[arg-type]
    server.listen()
    try:
        assert path.is_socket()
        assert [p.name for p in directory.iterdir()] == ["agent.sock"]  # no temporary left
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(str(path))
        client.close()
    finally:
        assert server.listener is not None
        server.listener.close()
        os.unlink(path)


def test_a_directory_created_meanwhile_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper (forked before the server binds) creates the socket's directory for its
    records at the same moment: CI saw "cannot listen on …: File exists" from the check
    then create. Here the directory appears between the two."""
    directory = tmp_path / "run"
    path = directory / "agent.sock"
    real_makedirs = os.makedirs

    def racing_makedirs(name: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        real_makedirs(name, mode, exist_ok=True)  # the keeper got there first
        return real_makedirs(name, mode, exist_ok=exist_ok)

    monkeypatch.setattr(os, "makedirs", racing_makedirs)
    server = Server(ServerOptions(socket_path=str(path), admin_addr=""), lambda *a: None, None)  # type: ignore[arg-type]
    server.listen()
    try:
        assert path.is_socket()
    finally:
        assert server.listener is not None
        server.listener.close()
        os.unlink(path)
