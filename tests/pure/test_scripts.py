"""The repository's helper scripts (packaging/, bench/, build/): argparse command lines,
`--help` on stdout with exit 0, a bad argument as argparse's usage error (exit 2), and
never a traceback (docs/cli.md). Every file with a `__main__` block is picked up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.scripts import load_script

# cnibox's own entry point: its command line is the applets' (test_cli_convention.py).
NOT_HELPERS = {"build/cnibox_main.py"}
# A script that runs at import (it wraps cnibox with runpy), so has no __main__ block.
ALSO = ["bench/dcprof.py"]
GENERATED = ("build/out/", "bench/results/")  # git-ignored: copies, not scripts


def helper_scripts() -> list[str]:
    found = []
    for folder in ("packaging", "bench", "build"):
        for path in sorted((REPO / folder).rglob("*.py")):
            name = str(path.relative_to(REPO))
            if name.startswith(GENERATED) or name in NOT_HELPERS:
                continue
            if 'if __name__ == "__main__":' in path.read_text():
                found.append(name)
    return found + ALSO


SCRIPTS = helper_scripts()


def run(script: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def test_the_scripts_are_found() -> None:
    assert {
        "packaging/talos/check_extension.py",
        "packaging/helm/tools.py",
        "bench/bench.py",
        "build/binary.py",
    } <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script: str) -> None:
    """--help: argparse's usage and description on stdout, exit 0, nothing on stderr."""
    proc = run(script, "--help")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("usage: ")


@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_argument(script: str) -> None:
    """An unknown option: argparse's usage line and `error:` on stderr, exit 2, no traceback."""
    proc = run(script, "--no-such-option")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("usage: ")
    assert f"{Path(script).name}: error: " in proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_extension_refuses_what_is_no_image(tmp_path: Path) -> None:
    """A file that is neither an extension, an OCI layout nor an oci-archive, or a missing
    path: one line naming it, exit 1 (an OCI layout directory is checked in
    tests/tools/test_packaging.py)."""
    junk = tmp_path / "junk"
    junk.write_text("not a tar\n")
    for target, words in ((junk, "not an extension, OCI layout or oci-archive"),
                          (tmp_path / "missing", "No such file or directory")):  # fmt: skip
        proc = run("packaging/talos/check_extension.py", str(target))
        assert proc.returncode == 1
        assert proc.stderr.startswith(f"{target}: {words}")
        assert proc.stderr.count("\n") == 1
        assert "Traceback" not in proc.stderr


def test_bench_binary_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench.py --binary dist/cnibox` from the repository links plugin names to the
    absolute path (a relative target dangled); a missing file is a usage error."""
    bench = load_script("bench/bench.py")
    exe = tmp_path / "dist" / "cnibox"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    assert bench.executable_file("dist/cnibox") == str(exe)
    proc = run("bench/bench.py", "--binary", "dist/nothing-here", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--binary: dist/nothing-here: not an executable file" in proc.stderr
