"""The cnibox under test: `python -m multicall` from this checkout, or the built executable
when `CNIBOX=/path/to/binary` is set (`make test-binary`)."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def cnibox_argv(applet: str | None = None) -> list[str]:
    """How to invoke cnibox (optionally as APPLET) in command-level tests."""
    binary = os.environ.get("CNIBOX")
    base = [binary] if binary else [sys.executable, "-m", "multicall"]
    return [*base, applet] if applet else base


def cnibox_executable() -> str:
    """A file to link applet names to: $CNIBOX, else the venv's console script."""
    binary = os.environ.get("CNIBOX")
    if binary:
        return binary
    script = Path(sys.executable).parent / "cnibox"
    if not script.exists():
        raise AssertionError(f"no cnibox console script next to {sys.executable}")
    return str(script)


def run_applet_inproc(name: str, args: Sequence[str], stdin: bytes = b"") -> tuple[int, str, str]:
    """An applet through the dispatcher's boundary, in this process: (status, out, err)."""
    from multicall.applets import find_applet
    from multicall.dispatch import run_applet

    applet = find_applet(name)
    assert applet is not None, name
    out, err = io.BytesIO(), io.BytesIO()
    rc = run_applet(applet, [name, *args], {}, (io.BytesIO(stdin), out, err))
    # An applet may echo input bytes that are not UTF-8 (a save's comment): shown replaced.
    return rc, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")
