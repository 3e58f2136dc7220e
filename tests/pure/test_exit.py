"""The entry points end with dispatch.exit_now (no interpreter teardown): output is complete
and the exit status is the applet's, whatever the stream."""

from __future__ import annotations

import subprocess
import sys

from multicall import applets
from tests.support import REPO, cnibox_argv


def run(args: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        [*cnibox_argv(), *args], cwd=REPO, capture_output=True, timeout=60, check=False, **kw
    )


def test_stdout_is_complete() -> None:
    """--list's text arrives whole through a pipe (flushed before the process ends)."""
    proc = run(["--list"])
    assert proc.returncode == 0
    assert proc.stdout.decode().splitlines() == applets.all_names()


def test_help_of_every_applet_arrives_whole() -> None:
    """Longer texts too: each applet's --help ends with its docstring's last line."""
    for applet in applets.APPLETS:
        proc = run([applet.name, "--help"])
        last = (applet.load().__doc__ or "").rstrip().splitlines()[-1]
        assert proc.stdout.decode().rstrip().endswith(last), applet
        assert proc.returncode == 0


def test_status_and_stderr_of_a_failure() -> None:
    """An unknown applet: 127 and its message on stderr."""
    proc = run(["no-such-applet"])
    assert proc.returncode == 127
    assert proc.stderr.decode().startswith("no-such-applet: applet not found")


def exit_now_child(code: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
    script = f"import sys\nfrom multicall.dispatch import exit_now\n{code}"
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-c", script], cwd=REPO, timeout=60, check=False, **kw
    )


def test_exit_now_flushes_buffered_text() -> None:
    """Text still in sys.stdout's and sys.stderr's buffers is written; the status is kept."""
    proc = exit_now_child(
        "sys.stdout.write('out' * 1000)\nsys.stderr.write('err')\nexit_now(5)",
        capture_output=True,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (5, b"out" * 1000, b"err")


def test_exit_now_keeps_the_status_when_stdout_fails() -> None:
    """A flush that fails (fd 1 closed under the buffered text) neither raises nor changes
    the status."""
    proc = exit_now_child(
        "import os\nsys.stdout.write('x')\nos.close(1)\nexit_now(3)", capture_output=True
    )
    assert proc.returncode == 3
    assert b"Traceback" not in proc.stderr


def test_module_entry_point_uses_exit_now() -> None:
    """`python -m multicall` and the Nuitka main file both end through exit_now."""
    for path in (REPO / "multicall" / "__main__.py", REPO / "build" / "cnibox_main.py"):
        assert "exit_now(main())" in path.read_text(), path
