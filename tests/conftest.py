"""Shared fixtures: the netns rig, root/CI policy, and the cnibox command under test.

Policy: tests that need root, `ip` or oracle binaries are skipped on a developer's machine
that lacks them, but under CI (CI=true) a skip would hide untested code, so they fail.
`CNIBOX=/path/to/binary` runs the command-level suites against a built executable instead
of `python -m multicall`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.rig import Rig, run

if TYPE_CHECKING:
    from tests.kubeapi import Pki

REPO = Path(__file__).resolve().parent.parent
# Upstream files and outputs derived from upstream tools; tests/fixtures/PROVENANCE.md says
# where each one comes from.
FIXTURES = REPO / "tests" / "fixtures"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_or_fail(reason: str) -> None:
    if in_ci():
        pytest.fail(f"would skip under CI: {reason}")
    pytest.skip(reason)


def require_root() -> None:
    if os.geteuid() != 0:
        skip_or_fail("needs root")
    if shutil.which("ip") is None:
        skip_or_fail("needs iproute2's ip")


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"needs {name}")
        raise AssertionError  # unreachable: skip_or_fail raises
    return path


def cnibox_argv(applet: str | None = None) -> list[str]:
    """How to invoke cnibox (optionally as APPLET) in command-level tests."""
    binary = os.environ.get("CNIBOX")
    base = [binary] if binary else [sys.executable, "-m", "multicall"]
    return [*base, applet] if applet else base


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """One CA and server certificate (openssl CLI) for every test API server of the run."""
    require_tool("openssl")
    from tests.kubeapi import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def rig() -> Iterator[Rig]:
    require_root()
    r = Rig()
    try:
        yield r
    finally:
        r.cleanup()


def _host_firewall() -> str:
    out = []
    for tool in ("iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save"):
        if shutil.which(tool):
            out.append(subprocess.run([tool], capture_output=True, text=True, check=False).stdout)
    # Counters move with the host's own traffic; only the rules themselves must stay put.
    lines = (line for text in out for line in text.splitlines() if not line.startswith("#"))
    return "\n".join(re.sub(r"\[\d+:\d+\]", "[-]", line) for line in lines)


@pytest.fixture(scope="session", autouse=True)
def host_firewall_untouched() -> Iterator[None]:
    """Fail the run if anything changed the machine's own firewall."""
    if os.geteuid() != 0:
        yield
        return
    before = _host_firewall()
    yield
    after = _host_firewall()
    assert before == after, "the machine's own firewall changed during the test run"


__all__ = ["FIXTURES", "REPO", "cnibox_argv", "require_root", "require_tool", "run"]
