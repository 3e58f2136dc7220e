"""The zipapp (`make zipapp`, dist/cnibox.pyz): the same dispatcher on a host's own Python.

Runs when CNIBOX_PYZ names the file (`make test-binary` sets it), like the CNIBOX suites.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from multicall.applets import APPLETS, all_names

pytestmark = pytest.mark.binary


@pytest.fixture(scope="module")
def pyz() -> Path:
    path = os.environ.get("CNIBOX_PYZ")
    if not path:
        pytest.skip("CNIBOX_PYZ is not set: the zipapp suite runs in `make test-binary`")
    return Path(path).resolve()


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    # The shebang is `/usr/bin/env python3`: put this interpreter first on PATH.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_runs_as_the_multiplexer(pyz: Path) -> None:
    result = run([str(pyz), "--list"])
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.split() == all_names()
    bare = run([str(pyz)])
    assert bare.returncode == 0  # the usage, as BusyBox prints it
    assert bare.stdout.startswith("usage: cnibox")


def test_symlinks_dispatch_by_name(pyz: Path, tmp_path: Path) -> None:
    for applet in APPLETS:
        for name in applet.names:
            (tmp_path / name).symlink_to(pyz)
            result = run([str(tmp_path / name), "--help"])
            assert (result.returncode, bool(result.stdout)) == (0, True), (name, result.stderr)
    (tmp_path / "no-such-applet").symlink_to(pyz)
    unknown = run([str(tmp_path / "no-such-applet")])
    assert (unknown.returncode, unknown.stderr) == (127, "no-such-applet: applet not found\n")


def test_ships_bytecode_and_no_native_code(pyz: Path) -> None:
    names = zipfile.ZipFile(pyz).namelist()
    assert "__main__.py" in names
    assert "multicall/dispatch.pyc" in names, "without .pyc every start compiles its modules"
    assert not [n for n in names if n.endswith(".so")]
