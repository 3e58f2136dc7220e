"""Kubeconfig fields as client-go reads them (issue 29 class 3): kubeconfigs are often
written by other tools than cnibox's installer."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicall.core.kube.kubeconfig import CONTEXT, parse_kubeconfig
from multicall.effects.kube.config import read_kubeconfig, read_token, tls_context
from multicall.errors import KubeError
from tests.support.fuzzing import fuzz


def kubeconfig(cluster: str, user: str) -> str:
    return (
        f"apiVersion: v1\nkind: Config\ncurrent-context: {CONTEXT}\n"
        f"contexts:\n- name: {CONTEXT}\n  context: {{cluster: k, user: u}}\n"
        f"clusters:\n- name: k\n  cluster:\n    server: https://10.0.0.1:443\n{cluster}"
        f"users:\n- name: u\n  user:\n{user}"
    )


def write(tmp_path: Path, cluster: str = "", user: str = "") -> str:
    path = tmp_path / "kube" / "config"
    path.parent.mkdir(exist_ok=True)
    path.write_text(kubeconfig(cluster, user))
    return str(path)


def test_token_file_wins_over_token(tmp_path: Path) -> None:
    """Both set: client-go sends the file's token (its file token source)."""
    (tmp_path / "t").write_text("from-file\n")
    path = write(tmp_path, user=f"    token: inline\n    tokenFile: {tmp_path / 't'}\n")
    assert read_token(read_kubeconfig(path)) == "from-file"


def test_inline_token_when_the_file_cannot_be_read(tmp_path: Path) -> None:
    """Both set, the file missing: client-go falls back to the inline token."""
    path = write(tmp_path, user=f"    token: inline\n    tokenFile: {tmp_path / 'none'}\n")
    assert read_token(read_kubeconfig(path)) == "inline"


def test_relative_paths_are_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    """ResolveLocalPaths: `tokenFile: t` and `certificate-authority: ca.crt` next to it."""
    path = write(tmp_path, "    certificate-authority: ca.crt\n", "    tokenFile: t\n")
    (tmp_path / "kube" / "t").write_text("relative\n")
    config = read_kubeconfig(path)
    assert config.ca_file == str(tmp_path / "kube" / "ca.crt")
    assert read_token(config) == "relative"


@fuzz(100)
@given(st.binary(min_size=1, max_size=600), st.sampled_from([64, 76, 1000]), st.booleans())
def test_wrapped_ca_data(data: bytes, width: int, crlf: bool) -> None:
    """A literal block wrapped at any width (Go's StdEncoding skips CR and LF) decodes to
    the same bytes as the unwrapped value."""
    encoded = base64.b64encode(data).decode()
    lines = [encoded[i : i + width] for i in range(0, len(encoded), width)]
    newline = "\r\n" if crlf else "\n"
    block = "    certificate-authority-data: |\n" + "".join(
        f"      {line}{newline}" for line in lines
    )
    assert parse_kubeconfig(kubeconfig(block, "    token: t\n")).ca_data == data


def test_tls_server_name_is_read() -> None:
    """`tls-server-name` (client-go's TLSClientConfig.ServerName) reaches the endpoint the
    connection names in TLS (tests/tools/test_kube_client.py checks SNI and verification)."""
    from multicall.effects.kube.config import endpoint

    config = parse_kubeconfig(kubeconfig("    tls-server-name: api.internal\n", "    token: t\n"))
    assert config.tls_server_name == "api.internal"
    assert endpoint(config.server, config.tls_server_name).server_name == "api.internal"


@pytest.mark.parametrize(
    "ca", ["certificate-authority: /ca.crt", "certificate-authority-data: Zm9v"]
)
def test_insecure_with_a_ca_is_refused_as_client_go_does(tmp_path: Path, ca: str) -> None:
    """client-go's transport.TLSConfigFor refuses a CA together with the insecure flag;
    cnibox used to skip verification silently."""
    path = write(tmp_path, f"    insecure-skip-tls-verify: true\n    {ca}\n", "    token: t\n")
    with pytest.raises(KubeError) as caught:
        tls_context(read_kubeconfig(path))
    assert caught.value.message == (
        "specifying a root certificates file with the insecure flag is not allowed"
    )


def test_insecure_alone_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path, "    insecure-skip-tls-verify: true\n", "    token: t\n")
    assert tls_context(read_kubeconfig(path)).check_hostname is False


DUPLICATES = [
    ("clusters", "*[]NamedCluster into *map[string]*api.Cluster", "k"),
    ("users", "*[]NamedAuthInfo into *map[string]*api.AuthInfo", "u"),
    ("contexts", "*[]NamedContext into *map[string]*api.Context", CONTEXT),
]


@pytest.mark.parametrize(("section", "conversion", "name"), DUPLICATES)
def test_duplicate_names_are_refused_as_client_go_does(
    tmp_path: Path, section: str, conversion: str, name: str
) -> None:
    """client-go's loader converts each named list into a map and refuses a name seen twice
    (cnibox used the first entry). Its text ends with the whole list in Go syntax, tokens
    included: cnibox stops after the name (docs/hardening.md)."""
    text = kubeconfig("", "    token: secret-token\n")
    body = {"clusters": "  cluster: {server: https://x}", "users": "  user: {token: secret-token}",
            "contexts": "  context: {cluster: k, user: u}"}[section]  # fmt: skip
    text = text.replace(f"{section}:\n", f"{section}:\n- name: {name}\n{body}\n", 1)
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(KubeError) as caught:
        read_kubeconfig(str(path))
    assert caught.value.message == (
        f'error loading config file "{path}": error converting {conversion}: '
        f'duplicate name "{name}" in list'
    )
    assert "secret-token" not in caught.value.message


def test_duplicate_names_in_an_unused_section_are_refused_too(tmp_path: Path) -> None:
    """client-go converts every entry, used by the context or not (two nameless users too)."""
    text = kubeconfig("", "    token: t\n") + "- user: {token: a}\n- user: {token: b}\n"
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(KubeError, match=r'duplicate name "" in list$'):
        read_kubeconfig(str(path))


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"\xff", "invalid leading UTF-8 octet"),
        (b"\x80", "invalid leading UTF-8 octet"),
        (b"\xe2\x82A", "invalid trailing UTF-8 octet"),
        (b"\xc0\x80", "invalid length of a UTF-8 sequence"),
        (b"\xed\xa0\x80", "invalid Unicode character"),
        (b"\xf5\x80\x80\x80", "invalid Unicode character"),
        (b"\x01", "control characters are not allowed"),
        (b"\x7f", "control characters are not allowed"),
        (b"\x1b[31m", "control characters are not allowed"),
        (b"\x01\xff", "control characters are not allowed"),  # read in order, as go-yaml
    ],
)
def test_bytes_go_yaml_refuses(tmp_path: Path, raw: bytes, problem: str) -> None:
    """client-go reads the file with go-yaml, which refuses invalid UTF-8 and control
    characters (no U+FFFD): the same refusal, in its words."""
    path = tmp_path / "config"
    path.write_bytes(kubeconfig("", "    token: t\n").encode() + b"# " + raw + b"\n")
    with pytest.raises(KubeError) as caught:
        read_kubeconfig(str(path))
    assert caught.value.message == f'error loading config file "{path}": yaml: {problem}'


def test_a_file_ending_inside_a_utf8_sequence(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_bytes(kubeconfig("", "    token: t\n").encode() + b"# \xe2\x82")
    with pytest.raises(KubeError, match=r"yaml: incomplete UTF-8 octet sequence$"):
        read_kubeconfig(str(path))


def test_a_utf8_bom_and_printable_unicode_are_read(tmp_path: Path) -> None:
    path = tmp_path / "config"
    text = kubeconfig("", "    token: t\n") + "# caf\u00e9 \u2603 \U0001f600 \x85\n"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert read_kubeconfig(str(path)).token == "t"
