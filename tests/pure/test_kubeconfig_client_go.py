"""Kubeconfig fields as client-go reads them (issue 29 class 3): kubeconfigs are often
written by other tools than cnibox's installer."""

from __future__ import annotations

import base64
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from multicall.core.kube.kubeconfig import CONTEXT, parse_kubeconfig
from multicall.effects.kube.config import read_kubeconfig, read_token
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
