"""Response framings against cnibox's HTTP client, each outcome as Go's net/http transport's
(tests/support/framing.py, the table; tests/tools/test_http_framing_oracle.py checks the
table against the real Go client): the first request's status and body or error, and
whether a second request reuses the connection or makes a new one and succeeds. Both
clients on the same transport: the plugin's (effects/kube/client.py's `_request` loop on a
`Connection`) and the repair controller's `Session`. Cost: about 5 s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from multicall.effects.http import Connection, StaleConnection, failure
from multicall.effects.kube.client import KubeClient
from multicall.effects.kube.config import endpoint, read_kubeconfig
from multicall.effects.kube.stream import ClientOptions, Session, Token
from multicall.errors import KubeError
from tests.support.framing import FRAMINGS, Err, Framing, Ok, replay
from tests.support.kubeapi import namespace_doc
from tests.support.pods import MESHED

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
        kubeconfig = write_kubeconfig(tmp_path, server.port)
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


def write_kubeconfig(tmp_path: Path, port: int) -> Path:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: linkerd-cni-context, context: {cluster: c, user: u}}]\n"
        "current-context: linkerd-cni-context\n"
    )
    return kubeconfig


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


POD = json.dumps(MESHED).encode()
NS, NAME = MESHED["metadata"]["namespace"], MESHED["metadata"]["name"]


def answer(status: str, *headers: str, body: bytes = POD) -> bytes:
    head = "".join(f"{h}\r\n" for h in (f"HTTP/1.1 {status}", *headers))
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def get_pod(raw: bytes, tmp_path: Path) -> tuple[str | None, float]:
    """The plugin client's pod GET against `raw`, then a namespace GET on the same client:
    the first error's text (None: both succeeded) and the time taken."""
    namespace = json.dumps(namespace_doc(NS)).encode()
    with replay(Framing("x", raw, Ok(0, b""), 0), answer("200 OK", body=namespace)) as api:
        kubeconfig = write_kubeconfig(tmp_path, api.port)
        client = KubeClient(read_kubeconfig(str(kubeconfig)), timeout=2.0)
        started = time.monotonic()
        try:
            assert client.get_pod(NS, NAME).name == NAME
            assert client.get_namespace(NS).name == NS
            error = None
        except KubeError as exc:
            error = exc.message
        finally:
            client.close()
        return error, time.monotonic() - started


class TestIssueExamples:
    """Issue 29's examples, each through the plugin's client (all failed on 7e4bf2a)."""

    def test_a_302_with_a_pod_body_is_not_the_pod(self, tmp_path: Path) -> None:
        error, _ = get_pod(answer("302 Found", "Location: /elsewhere"), tmp_path)
        assert error == (
            "the server responded with the status code 302 but did not return more "
            f"information (get pods {NAME})"
        )

    @pytest.mark.parametrize("informational", ["100 Continue", "103 Early Hints"])
    def test_an_unsolicited_1xx_is_skipped(self, tmp_path: Path, informational: str) -> None:
        raw = f"HTTP/1.1 {informational}\r\nLink: </x>\r\n\r\n".encode() + answer("200 OK")
        error, elapsed = get_pod(raw, tmp_path)
        assert error is None
        assert elapsed < 1, "not the deadline"

    def test_a_204_does_not_wait_for_the_end(self, tmp_path: Path) -> None:
        error, elapsed = get_pod(b"HTTP/1.1 204 No Content\r\n\r\n", tmp_path)
        assert error is not None
        assert "invalid JSON" in error
        assert elapsed < 1, "not the deadline"

    def test_disagreeing_content_lengths_are_refused(self, tmp_path: Path) -> None:
        raw = answer("200 OK", f"Content-Length: {len(POD) + 1}")
        error, _ = get_pod(raw, tmp_path)
        assert error is not None
        assert "http: message cannot contain multiple Content-Length headers" in error

    def test_a_stray_crlf_does_not_break_the_next_request(self, tmp_path: Path) -> None:
        error, _ = get_pod(answer("200 OK") + b"\r\n", tmp_path)
        assert error is None

    def test_a_utf16_pod_is_refused(self, tmp_path: Path) -> None:
        body = json.dumps(MESHED).encode("utf-16")
        error, _ = get_pod(answer("200 OK", body=body), tmp_path)
        assert error is not None
        assert error.endswith("the server answered with invalid JSON")

    def test_a_huge_error_body_is_cut(self, tmp_path: Path) -> None:
        raw = answer("500 Internal Server Error", "Content-Type: text/plain", body=b"x" * (3 << 20))
        error, _ = get_pod(raw, tmp_path)
        assert error is not None
        assert error.startswith('an error on the server ("' + "x" * 2048 + '")')
        assert len(error) < 2048 + 200


def test_a_watch_with_a_content_length_body_ends_with_it(tmp_path: Path) -> None:
    """A WATCH answered with a whole body (not a stream): its lines, then the end, not a
    wait for the server to close (the connection stays open here)."""
    with replay(Framing("x", answer("200 OK", body=b'{"a":1}\n{"b":2}\n'), Ok(0, b""), 0)) as api:
        kubeconfig = write_kubeconfig(tmp_path, api.port)
        config = read_kubeconfig(str(kubeconfig))
        session = Session(config, Token(config), ClientOptions(headers_timeout=TIMEOUT))
        started = time.monotonic()
        lines = list(session.watch_lines("/w", timeout_seconds=5))
        elapsed = time.monotonic() - started
    assert lines == [b'{"a":1}', b'{"b":2}']
    assert elapsed < 1
