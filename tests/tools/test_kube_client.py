"""The stdlib Kubernetes client (multicall/effects/kube/client.py) against the TLS test API
server on loopback: Status messages, refusals and deadlines (the PKI needs the openssl CLI)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from multicall.effects.kube.client import KubeClient
from multicall.effects.kube.config import read_kubeconfig
from multicall.errors import KubeError
from tests.support.kubeapi import KubeApi, refused_port
from tests.support.pki import Pki, make_pki
from tests.support.pods import golden_pod

POD = golden_pod("_no_init_container")
POD_NAME = POD["metadata"]["name"]


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
        with pytest.raises(KubeError, match="root certificates file with the insecure flag"):
            KubeClient(replace(wrong, insecure_skip_tls_verify=True), timeout=2)
        insecure = replace(wrong, insecure_skip_tls_verify=True, ca_data=b"")
        with closing(KubeClient(insecure, timeout=2)) as c:
            assert c.get_pod("emojivoto", POD_NAME).name == POD_NAME
        assert "certificate-authority-data" in text

    @pytest.mark.parametrize("insecure", [False, True])
    def test_tls_server_name(self, api: KubeApi, tmp_path: Path, insecure: bool) -> None:
        """`tls-server-name` is the name TLS sends (SNI) and verifies, as client-go's
        TLSClientConfig.ServerName: the certificate (127.0.0.1 and localhost) is refused for
        another name although the URL's IP is in it, and accepted for `localhost`; with
        insecure-skip-tls-verify the name is still sent. cnibox ignored the field."""
        from dataclasses import replace

        seen: list[str | None] = []
        server_tls = api._server.tls  # type: ignore[union-attr]
        server_tls.sni_callback = lambda _sock, name, _ctx: seen.append(name)
        config = read_kubeconfig(str(api.kubeconfig(tmp_path / "kc")))
        if insecure:
            config = replace(config, ca_data=b"", insecure_skip_tls_verify=True)
        for name in ("localhost", "api.internal"):
            named = replace(config, tls_server_name=name)
            with closing(KubeClient(named, timeout=2)) as c:
                if insecure or name == "localhost":
                    assert c.get_pod("emojivoto", POD_NAME).name == POD_NAME
                else:
                    with pytest.raises(KubeError, match="x509: Hostname mismatch"):
                        c.get_pod("emojivoto", POD_NAME)
        assert seen == ["localhost", "api.internal"]
