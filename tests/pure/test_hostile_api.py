"""The Kubernetes client against API servers that misbehave on purpose (plain HTTP on
127.0.0.1, tests/support/hostile_api.py): one deadline per invocation holds whatever the
server does, memory stays bounded, a keep-alive connection the server closed is retried
once (tests/hostile_inputs.md, class 1).

The command-level cases run `linkerd-cni ADD` (the source tree, or the built binary under
CNIBOX=...) with CNIBOX_KUBE_TIMEOUT=2 and assert it ends within the deadline + 1 s of its
start. Cost: about 25 s.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from multicall.effects.kube.client import KubeClient
from multicall.effects.kube.config import read_kubeconfig
from multicall.effects.kube.stream import ClientOptions, Session, Token
from multicall.errors import KubeError
from tests.support import cnibox_argv
from tests.support.hostile import (
    RSS_BOUND,
    Measured,
    cni_env,
    run_measured,
    write_plugin_config,
)
from tests.support.hostile_api import POD_PATH, HostileApi, hostile_api
from tests.support.pods import MESHED

NS, NAME = MESHED["metadata"]["namespace"], MESHED["metadata"]["name"]
URL = "http://127.0.0.1:{port}" + POD_PATH
TIMEOUT = 1.0
ADD_TIMEOUT = 2.0
LIMIT = "the limit for it (docs/hardening.md)"
CASES = [
    ("drip-reply", "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"),
    ("drip-body", "context deadline exceeded (Client.Timeout exceeded while reading body)"),
    ("drip-head", "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"),
    ("endless-head", f"the response head is larger than 1 MiB, {LIMIT}"),
    ("endless-chunks", f"the response body is larger than 4 MiB, {LIMIT}"),
    ("huge-length", f"the response body is larger than 4 MiB, {LIMIT}"),
    ("unterminated", f"the response body is larger than 4 MiB, {LIMIT}"),
    ("bad-chunk", "invalid byte in chunk length"),
    ("garbage", 'malformed HTTP response "SSH-2.0-OpenSSH_9.2"'),
    ("close-unanswered", "EOF"),
]


def client(api: HostileApi, tmp_path: Path, timeout: float = TIMEOUT) -> KubeClient:
    return KubeClient(read_kubeconfig(str(api.kubeconfig(tmp_path / "kc"))), timeout=timeout)


class TestClient:
    @pytest.mark.parametrize(("mode", "detail"), CASES)
    def test_bounded(self, tmp_path: Path, mode: str, detail: str) -> None:
        """Each misbehaviour is a KubeError in client-go's shape within the deadline + 1 s."""
        with hostile_api(mode) as api:
            c = client(api, tmp_path)
            started = time.monotonic()
            with pytest.raises(KubeError) as info:
                c.get_pod(NS, NAME)
            elapsed = time.monotonic() - started
            c.close()
        assert info.value.message == f'Get "{URL.format(port=api.port)}": {detail}'
        assert elapsed < TIMEOUT + 1

    def test_deep_json_answer(self, tmp_path: Path) -> None:
        """A reply nesting 100 000 deep: a plain message, not a RecursionError."""
        with hostile_api("deep-json") as api:
            c = client(api, tmp_path)
            with pytest.raises(KubeError) as info:
                c.get_pod(NS, NAME)
            c.close()
        assert info.value.message == (
            f"{URL.format(port=api.port)}: the server answered with JSON nested too deeply"
        )

    def test_one_deadline_for_all_requests(self, tmp_path: Path) -> None:
        """The deadline covers the invocation, not each request: a server answering every
        GET after 0.4 s passes the first of three under a 1 s deadline, not the third (with
        a deadline per request, all three would pass)."""
        with hostile_api("pause") as api:
            c = client(api, tmp_path, timeout=1.0)
            started = time.monotonic()
            assert c.get_pod(NS, NAME).name == NAME

            def the_rest() -> None:
                c.get_namespace(NS)
                c.get_service("default", "kubernetes")

            with pytest.raises(KubeError, match=r"Client\.Timeout exceeded while awaiting"):
                the_rest()
            elapsed = time.monotonic() - started
            c.close()
        assert len(api.requests) == 3
        assert elapsed < 1.0 + 1

    def test_closed_keep_alive_is_retried_once(self, tmp_path: Path) -> None:
        """A server that closes its keep-alive connection after each reply: every GET after
        the first is retried on a new connection, as Go's transport retries idempotent
        requests; nothing fails."""
        with hostile_api("close-after-reply") as api:
            c = client(api, tmp_path, timeout=5)
            assert c.get_pod(NS, NAME).name == NAME
            time.sleep(0.1)  # the server has closed the connection by now
            assert c.get_namespace(NS).name == NS
            assert c.get_service("default", "kubernetes").name == "kubernetes"
            c.close()
        assert len(api.requests) == 3
        assert api.connections == 3

    def test_a_fresh_connection_is_not_retried(self, tmp_path: Path) -> None:
        """Only a reused connection is retried: a server that never answers is one try."""
        with hostile_api("close-unanswered") as api:
            c = client(api, tmp_path, timeout=5)
            with pytest.raises(KubeError, match=r": EOF$"):
                c.get_pod(NS, NAME)
            c.close()
        assert api.connections == 1


# ----------------------------------------------------------------------------- the command


def add(api: HostileApi, tmp_path: Path, netns: str = "/var/run/netns/cbx-hostile-api") -> Measured:
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    config = write_plugin_config(tmp_path / "conf.json", kubeconfig=str(kubeconfig))
    env = cni_env(
        CNI_NETNS=netns,
        CNI_ARGS=f"K8S_POD_NAMESPACE={NS};K8S_POD_NAME={NAME}",
        CNIBOX_KUBE_TIMEOUT=str(ADD_TIMEOUT),
    )
    return run_measured(cnibox_argv("linkerd-cni"), stdin=config, env=env, timeout=60)


@pytest.mark.parametrize(("mode", "detail"), [c for c in CASES if c[0] != "bad-chunk"])
def test_add_ends_within_the_deadline(tmp_path: Path, mode: str, detail: str) -> None:
    """ADD against the slowest and the most endless servers: CNI error JSON within the
    deadline + 1 s of the process's start, in bounded memory."""
    with hostile_api(mode) as api:
        result = add(api, tmp_path)
    assert result.returncode == 1, result.out + result.err
    error = json.loads(result.stdout)
    assert error["msg"] == f'Get "{URL.format(port=api.port)}": {detail}'
    assert result.seconds < ADD_TIMEOUT + 1
    assert result.peak_rss < RSS_BOUND


def test_add_with_a_fifo_as_netns(tmp_path: Path) -> None:
    """A meshed pod whose CNI_NETNS is a FIFO: the API answers, then ADD fails at once with
    CNI error 8 (it used to block forever in open())."""
    fifo = tmp_path / "netns-fifo"
    os.mkfifo(fifo)
    with hostile_api("ok") as api:
        result = add(api, tmp_path, netns=str(fifo))
    assert result.returncode == 1
    assert json.loads(result.stdout) == {
        "code": 8,
        "msg": f"{fifo} is a FIFO, not a network namespace",
    }
    assert len(api.requests) == 2  # the pod and its namespace
    assert result.seconds < ADD_TIMEOUT + 1


@pytest.mark.parametrize("mode", ["drip-reply", "endless-chunks"])
def test_iptables_verify_fetch_ends_within_the_deadline(tmp_path: Path, mode: str) -> None:
    """`iptables-verify --namespace NS --pod NAME` has the same one deadline (exit 2)."""
    config = tmp_path / "conf.json"
    config.write_text('{"cniVersion":"1.0.0","name":"n","type":"linkerd-cni"}')
    with hostile_api(mode) as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        argv = [*cnibox_argv("iptables-verify"), "--config", str(config), "--input", "-"]
        argv += ["--namespace", NS, "--pod", NAME, "--kubeconfig", str(kubeconfig)]
        env = {"PATH": os.environ.get("PATH", ""), "CNIBOX_KUBE_TIMEOUT": str(ADD_TIMEOUT)}
        result = run_measured(argv, env=env)
    assert result.returncode == 2
    assert result.err.startswith(f'iptables-verify: Get "{URL.format(port=api.port)}": ')
    assert result.seconds < ADD_TIMEOUT + 1
    assert result.peak_rss < RSS_BOUND


# ----------------------------------------------------------------------------- the controller


def session(api: HostileApi, tmp_path: Path, headers_timeout: float = TIMEOUT) -> Session:
    """The repair controller's API session (effects/kube/stream.py) on the same primitives."""
    config = read_kubeconfig(str(api.kubeconfig(tmp_path / "kc")))
    return Session(config, Token(config), ClientOptions(headers_timeout=headers_timeout))


class TestControllerSession:
    """The controller's LIST/WATCH/DELETE share the plugin client's connection, so they get
    the same bounds: every read within its deadline, capped bodies, the stale retry."""

    @pytest.mark.parametrize(
        ("mode", "method", "detail"),
        [
            ("drip-reply", "GET", "(Client.Timeout exceeded while awaiting headers)"),
            ("drip-body", "DELETE", "(Client.Timeout exceeded while reading body)"),
            ("endless-head", "GET", "the response head is larger than 1 MiB"),
        ],
    )
    def test_requests_are_bounded(
        self, tmp_path: Path, mode: str, method: str, detail: str
    ) -> None:
        with hostile_api(mode) as api:
            s = session(api, tmp_path)
            started = time.monotonic()
            with pytest.raises(KubeError) as info:
                s.request(method, POD_PATH, timeout=TIMEOUT)
            elapsed = time.monotonic() - started
            s.close()
        assert detail in info.value.message
        assert elapsed < TIMEOUT + 1

    def test_a_dripping_watch_ends_at_its_deadline(self, tmp_path: Path) -> None:
        """A watch whose server drips bytes forever ends at timeoutSeconds + grace (here
        1 s + 1 s), not whenever the server stops."""
        with hostile_api("drip-body") as api:
            s = session(api, tmp_path)
            started = time.monotonic()
            with pytest.raises(KubeError, match="stayed silent past its 1s timeout"):
                list(s.watch_lines(POD_PATH, timeout_seconds=1))
            elapsed = time.monotonic() - started
        assert elapsed < 2 + 1

    def test_get_is_retried_on_a_closed_keep_alive(self, tmp_path: Path) -> None:
        with hostile_api("close-after-reply") as api:
            s = session(api, tmp_path, headers_timeout=5)
            assert s.request("GET", POD_PATH).status == 200
            time.sleep(0.1)
            assert s.request("GET", POD_PATH).status == 200
            s.close()
        assert api.connections == 2

    def test_a_token_with_a_line_break_is_never_sent(self, tmp_path: Path) -> None:
        with hostile_api("ok") as api:
            config = read_kubeconfig(str(api.kubeconfig(tmp_path / "kc")))
            evil = replace(config, token="abc\r\nX-Injected: 1")
            with pytest.raises(KubeError, match="contains a carriage return"):
                Session(evil, Token(evil), ClientOptions()).request("GET", POD_PATH)
        assert api.requests == []
