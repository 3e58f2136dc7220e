"""The agent's temporary socket name (agent/server.py `listen`): a socket path that fits a
sun_path (108 bytes with its NUL) is bound whatever its length, because the temporary name
that is renamed over it is as long as the socket's own, in the same directory. Before, it
was `{path}.{pid}.{16 hex}.tmp`, ~28 bytes longer than the path: an agent whose socket
path had 80-107 bytes could not start ("cannot listen on …: None"). No root: tmp_path."""

from __future__ import annotations

import os
import socket
from pathlib import Path

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
