"""The plugin's kubeconfig as the installer writes it, read as client-go reads it (the client
itself is tested against a TLS API server in tests/tools/test_kube_client.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicall.core.installer.config import render_kubeconfig
from multicall.core.kube.kubeconfig import parse_kubeconfig
from multicall.effects.kube import read_kubeconfig, timeout_from_env
from multicall.errors import CNI_INVALID_ENV, CniError, ConfigError, KubeError
from tests.support import FIXTURES
from tests.support.kubeapi import pods_from_golden

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
        """Unset: 5 s; a positive number is taken, clamped to 600 s (inf too)."""
        assert timeout_from_env({}) == 5.0
        assert timeout_from_env({"CNIBOX_KUBE_TIMEOUT": ""}) == 5.0
        assert timeout_from_env({"CNIBOX_KUBE_TIMEOUT": "0.5"}) == 0.5
        assert timeout_from_env({"CNIBOX_KUBE_TIMEOUT": "1e300"}) == 600.0
        assert timeout_from_env({"CNIBOX_KUBE_TIMEOUT": "inf"}) == 600.0

    @pytest.mark.parametrize("value", ["-1", "0", "nan", "-inf", "five", "1e-400"])
    def test_timeout_env_refused(self, value: str) -> None:
        """Anything that is not a positive number of seconds is an invalid environment (CNI
        code 4) naming the variable, never an OverflowError or a silent default."""
        with pytest.raises(CniError, match="^CNIBOX_KUBE_TIMEOUT=.* is not a number") as info:
            timeout_from_env({"CNIBOX_KUBE_TIMEOUT": value})
        assert info.value.code == CNI_INVALID_ENV
