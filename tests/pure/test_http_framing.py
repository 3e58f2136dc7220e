"""Response framings against cnibox's HTTP client, each outcome as Go's net/http transport's
(tests/support/framing.py, the table; tests/tools/test_http_framing_oracle.py checks the
table against the real Go client): the first request's status and body or error, and
whether a second request reuses the connection or makes a new one and succeeds. Both
clients on the same transport: the plugin's (effects/kube/client.py's `_request` loop on a
`Connection`) and the repair controller's `Session`. Cost: about 5 s.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from multicall.effects.http import Connection, StaleConnection, failure
from multicall.effects.kube.config import endpoint, read_kubeconfig
from multicall.effects.kube.stream import ClientOptions, Session, Token
from multicall.errors import KubeError
from tests.support.framing import FRAMINGS, Err, Framing, Ok, replay

TIMEOUT = 3.0


def plugin_get(conn: Connection) -> tuple[int, bytes] | str:
    """One GET as the plugin's client makes it: retried once on a stale connection, the
    connection closed on any failure; the failure in the client's words."""
    deadline = time.monotonic() + TIMEOUT
    for attempt in (1, 2):
        try:
            conn.open(deadline, None)
            return conn.get("/x", "Host: h\r\n", deadline)
        except StaleConnection as exc:
            conn.close()
            if attempt == 2:
                return failure(exc, conn)
        except (OSError, ValueError) as exc:
            conn.close()
            return failure(exc, conn)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("framing", FRAMINGS, ids=lambda f: f.name)
def test_plugin_connection(framing: Framing) -> None:
    with replay(framing) as server:
        conn = Connection(endpoint(f"http://127.0.0.1:{server.port}"))
        started = time.monotonic()
        first = plugin_get(conn)
        second = plugin_get(conn)
        elapsed = time.monotonic() - started
        conn.close()
    check(framing, first)
    assert second == (200, b"ok")
    assert server.connections == framing.connections
    assert elapsed < 1.5, "no framing costs a deadline"


@pytest.mark.parametrize("framing", FRAMINGS, ids=lambda f: f.name)
def test_controller_session(framing: Framing, tmp_path: Path) -> None:
    with replay(framing) as server:
        kubeconfig = tmp_path / "kc"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.port}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: linkerd-cni-context, context: {cluster: c, user: u}}]\n"
            "current-context: linkerd-cni-context\n"
        )
        config = read_kubeconfig(str(kubeconfig))
        session = Session(config, Token(config), ClientOptions(headers_timeout=TIMEOUT))
        try:
            answer = session.request("GET", "/x")
            first: tuple[int, bytes] | str = (answer.status, answer.body)
        except KubeError as exc:
            first = exc.message
        second = session.request("GET", "/x")
        session.close()
    check(framing, first)
    assert (second.status, second.body) == (200, b"ok")
    assert server.connections == framing.connections


def check(framing: Framing, outcome: tuple[int, bytes] | str) -> None:
    expected = framing.outcome
    if isinstance(expected, Ok):
        assert outcome == (expected.status, expected.body)
    else:
        assert isinstance(expected, Err)
        assert isinstance(outcome, str), outcome
        assert expected.text in outcome
        assert "Error" not in outcome  # no Python exception name reaches a user
        assert "Traceback" not in outcome
