"""The plugin's kubeconfig (as the installer writes it) and the stdlib Kubernetes client against
the TLS test API server on loopback: Status messages, refusals and deadlines."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from multicall.core.installer.config import render_kubeconfig
from multicall.core.kube.kubeconfig import parse_kubeconfig
from multicall.effects.kube import KubeClient, read_kubeconfig, timeout_from_env
from multicall.errors import ConfigError, KubeError
from tests.conftest import FIXTURES
from tests.kubeapi import KubeApi, Pki, make_pki, pods_from_golden, refused_port

GOLDEN = FIXTURES / "upstream" / "linkerd2" / "inject-goldens"
POD = pods_from_golden(GOLDEN / "inject_emojivoto_deployment_no_init_container.golden.yml")[0]
POD_NAME = POD["metadata"]["name"]


class TestParse:
    def test_installer_kubeconfig(self) -> None:
        """What install-cni writes parses to its server, token and CA."""
        text = render_kubeconfig(b" tok\n", b"-----CA-----\n", "10.96.0.1", "443").decode()
        config = parse_kubeconfig(text)
        assert config.server == "https://10.96.0.1:443"
        assert config.token == "tok"
        assert config.ca_data == b"-----CA-----"
        assert not config.insecure_skip_tls_verify

    @pytest.mark.parametrize(
        ("token", "ca", "host"),
        [
            (
                b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_",
                b"-----BEGIN CERT-----\nMII\n",
                "10.96.0.1",
            ),
            (b"t", b"c", "fd00::1"),
            (b"tok with space", b"ca", "10.0.0.1"),
            (b"#comment", b"ca", "10.0.0.1"),
        ],
    )
    def test_fast_path_agrees_with_yaml(self, token: bytes, ca: bytes, host: str) -> None:
        """The installer's layout read without PyYAML gives what PyYAML gives."""
        from multicall.core.kube import kubeconfig

        text = render_kubeconfig(token, ca, host, "443").decode()
        by_yaml = parse_kubeconfig(text + "# not the installer's layout any more\n")
        fast = kubeconfig._installer_form(text, kubeconfig.CONTEXT)
        assert fast is None or fast == by_yaml
        assert (fast is None) == (b" " in token or token.startswith(b"#"))
        assert parse_kubeconfig(text) == by_yaml

    def test_ipv6_server(self) -> None:
        text = render_kubeconfig(b"t", b"c", "fd00::1", "6443").decode()
        assert parse_kubeconfig(text).server == "https://[fd00::1]:6443"

    def test_context_is_forced(self) -> None:
        """current-context is ignored: only linkerd-cni-context counts."""
        text = render_kubeconfig(b"t", b"c", "h", "1").decode()
        other = text.replace("- name: linkerd-cni-context", "- name: other")
        with pytest.raises(ConfigError, match="context was not found for specified context"):
            parse_kubeconfig(other)

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("", "no configuration has been provided"),
            ("contexts: [{name: linkerd-cni-context, context: {cluster: c}}]",
             "cluster has no server defined"),
            ("clusters: [{name: c, cluster: {server: 'https://h', "
             "certificate-authority-data: '%%%'}}]\n"
             "contexts: [{name: linkerd-cni-context, context: {cluster: c}}]", "not valid base64"),
            ("a: [", "error loading config"),
        ],
    )  # fmt: skip
    def test_errors(self, text: str, message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            parse_kubeconfig(text)

    def test_missing_file_reads_like_client_go(self, tmp_path: Path) -> None:
        with pytest.raises(KubeError, match=f"^stat {tmp_path}/nope: no such file or directory$"):
            read_kubeconfig(str(tmp_path / "nope"))

    def test_timeout_env(self) -> None:
        assert timeout_from_env({}) == 5.0
        assert timeout_from_env({"CNIBOX_KUBE_TIMEOUT": "0.5"}) == 0.5
        assert timeout_from_env({"CNIBOX_KUBE_TIMEOUT": "-1"}) == 5.0


@pytest.fixture
def api(pki: Pki) -> Iterator[KubeApi]:
    server = KubeApi(pki)
    server.add_pod(POD)
    server.start(None)  # the machine's loopback: no netns needed for the client alone
    try:
        yield server
    finally:
        server.stop()


def client(api: KubeApi, tmp_path: Path, timeout: float = 2.0, **kw: object) -> KubeClient:
    path = api.kubeconfig(tmp_path / "kc", **kw)  # type: ignore[arg-type]
    return KubeClient(read_kubeconfig(str(path)), timeout=timeout)


class TestClient:
    def test_pod_namespace_and_one_connection(self, api: KubeApi, tmp_path: Path) -> None:
        """GETs share one keep-alive TLS connection and parse into values."""
        c = client(api, tmp_path)
        try:
            pod = c.get_pod("emojivoto", POD_NAME)
            assert "linkerd-proxy" in pod.init_containers
            assert c.get_namespace("emojivoto").name == "emojivoto"
        finally:
            c.close()
        assert api.requests == [
            f"/api/v1/namespaces/emojivoto/pods/{POD_NAME}",
            "/api/v1/namespaces/emojivoto",
        ]

    @pytest.mark.parametrize(
        ("setup", "message"),
        [
            ("404", '^pods "ghost" not found$'),
            ("401", "^Unauthorized$"),
            ("500", "^Internal error occurred: etcdserver: request timed out$"),
        ],
    )
    def test_status_messages(self, api: KubeApi, tmp_path: Path, setup: str, message: str) -> None:
        """API errors surface as the Status object's message, as client-go reports them."""
        name = "ghost" if setup == "404" else POD_NAME
        token = "wrong" if setup == "401" else "cnibox-test-token"
        if setup == "500":
            api.mode = "status"
        with (
            closing(client(api, tmp_path, token=token)) as c,
            pytest.raises(KubeError, match=message),
        ):
            c.get_pod("emojivoto", name)

    def test_refused(self, api: KubeApi, tmp_path: Path) -> None:
        port = refused_port(None)
        c = client(api, tmp_path, port=port)
        c.close()
        url = f"https://127.0.0.1:{port}/api/v1/namespaces/emojivoto/pods/{POD_NAME}"
        expected = f'Get "{url}": dial tcp 127.0.0.1:{port}: connect: connection refused'
        with pytest.raises(KubeError) as info:
            c.get_pod("emojivoto", POD_NAME)
        assert info.value.message == expected

    @pytest.mark.parametrize("mode", ["hang", "silent"])
    def test_deadline(self, pki: Pki, tmp_path: Path, mode: str) -> None:
        """A server that never answers (HTTP or TLS) costs one timeout."""
        server = KubeApi(pki, mode=mode)
        server.start(None)
        try:
            started = time.monotonic()
            with (
                closing(client(server, tmp_path, timeout=0.5)) as c,
                pytest.raises(KubeError, match=r"TLS handshake timeout|deadline exceeded"),
            ):
                c.get_pod("emojivoto", POD_NAME)
            assert time.monotonic() - started < 5
        finally:
            server.stop()

    def test_unknown_ca(self, api: KubeApi, tmp_path: Path, pki: Pki) -> None:
        """A server certificate from another CA is refused, unless verification is off."""
        other = make_pki(tmp_path / "other")
        path = api.kubeconfig(tmp_path / "kc")
        text = path.read_text()
        config = read_kubeconfig(str(path))
        from dataclasses import replace

        wrong = replace(config, ca_data=other.ca_cert.read_bytes())
        with pytest.raises(KubeError, match="x509: certificate signed by unknown authority"):
            KubeClient(wrong, timeout=2).get_pod("emojivoto", POD_NAME)
        insecure = replace(wrong, insecure_skip_tls_verify=True)
        with closing(KubeClient(insecure, timeout=2)) as c:
            assert c.get_pod("emojivoto", POD_NAME).name == POD_NAME
        assert "certificate-authority-data" in text
