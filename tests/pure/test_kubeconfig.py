"""The plugin's kubeconfig as the installer writes it, read as client-go reads it (the client
itself is tested against a TLS API server in tests/tools/test_kube_client.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from multicall.core.installer.config import render_kubeconfig
from multicall.core.kube.kubeconfig import ServerUrl, check_token, parse_kubeconfig, parse_server
from multicall.effects.kube.client import KubeClient
from multicall.effects.kube.config import read_kubeconfig, timeout_from_env
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
        with pytest.raises(CniError, match=r"^CNIBOX_KUBE_TIMEOUT=.* is not a number") as info:
            timeout_from_env({"CNIBOX_KUBE_TIMEOUT": value})
        assert info.value.code == CNI_INVALID_ENV


class TestValuesSent:
    """What the client puts on the wire from a kubeconfig (issue 12, class 6): the request
    line and Host header from `server`, the Authorization header from the token."""

    @pytest.mark.parametrize(
        ("server", "expected"),
        [
            ("https://10.96.0.1:443", ServerUrl("https", "10.96.0.1", 443, "")),
            ("http://api", ServerUrl("http", "api", 80, "")),
            ("https://[fd00::1]:6443/k8s/", ServerUrl("https", "fd00::1", 6443, "/k8s")),
            # Go's URL.EscapedPath: a raw space is escaped, a valid escape is kept as written
            ("https://h/a b/c", ServerUrl("https", "h", 443, "/a%20b/c")),
            ("https://h/a%20b", ServerUrl("https", "h", 443, "/a%20b")),
            ("https://h/caf\u00e9", ServerUrl("https", "h", 443, "/caf%C3%A9")),
            ("https://h/p;v=1/@x", ServerUrl("https", "h", 443, "/p;v=1/@x")),
        ],
    )
    def test_server_urls(self, server: str, expected: ServerUrl) -> None:
        assert parse_server(server) == expected

    @pytest.mark.parametrize(
        ("server", "reason"),
        [
            ("https://h/api\r\nX-Injected: 1", "invalid control character in URL"),
            ("https://h/a\nb", "invalid control character in URL"),
            ("https://h\x00/", "invalid control character in URL"),
            ("https://h:99999", "out of range"),
            ("https://h:0", "port 0"),
            ("https://h:x1", "Port could not be cast"),
            ("https://h/%zz", "invalid URL escape"),
            ("https://a b/", "invalid character in host name"),
            ("https://[fd00::1/", "Invalid IPv6 URL"),
            ("https://fd00::1]:6443/", "Invalid IPv6 URL"),
        ],
    )
    def test_server_urls_refused(self, server: str, reason: str) -> None:
        """Refused with the kubeconfig field named, never a ValueError."""
        with pytest.raises(ConfigError, match=r"clusters\[\]\.cluster\.server") as info:
            parse_server(server)
        assert reason in info.value.message

    @pytest.mark.parametrize(
        ("token", "what"),
        [
            ("abc\r\nX-Injected: 1", "a carriage return (CR)"),
            ("abc\nHost: evil", "a line feed (LF)"),
            ("ab c", "a space"),
            ("abc\x00", "U+0000"),
            ("t\u00f6ken", "U+00F6"),
        ],
    )
    def test_tokens_refused(self, token: str, what: str) -> None:
        """A token that would end the Authorization header (or is no header value)."""
        with pytest.raises(ConfigError, match=r"users\[\]\.user\.token contains") as info:
            check_token(token)
        assert what in info.value.message

    def test_token_file_with_a_line_break_is_refused(self, tmp_path: Path) -> None:
        """tokenFile is trimmed as client-go does; a line break inside it is refused."""
        (tmp_path / "token").write_text("good-token\n")
        (tmp_path / "evil").write_text("abc\r\nX-Injected: 1\n")
        kubeconfig = tmp_path / "kc"
        for name, ok in (("token", True), ("evil", False)):
            kubeconfig.write_text(
                "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
                f"users: [{{name: u, user: {{tokenFile: '{tmp_path / name}'}}}}]\n"
                "contexts: [{name: linkerd-cni-context, context: {cluster: c, user: u}}]\n"
            )
            if ok:
                assert KubeClient(read_kubeconfig(str(kubeconfig)))._token == "good-token"
            else:
                with pytest.raises(KubeError, match=r"tokenFile.* contains a carriage return"):
                    KubeClient(read_kubeconfig(str(kubeconfig)))
