"""Applet links for `cnibox --install` and the installer: where the binary is, and linking."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from multicall.errors import CniboxError


def self_executable() -> str:
    """The file that should be linked or copied to run cnibox again.

    The static launcher exports CNIBOX_EXE (the single file itself, not the extracted
    payload); a standalone Nuitka binary is sys.argv[0] (Nuitka resolves it); a console
    script or zipapp is sys.argv[0] when it is an executable file.
    """
    exe = os.environ.get("CNIBOX_EXE")
    if exe:
        return exe
    candidate = os.path.abspath(sys.argv[0]) if sys.argv else ""
    if candidate and not candidate.endswith(".py") and os.access(candidate, os.X_OK):
        return candidate
    raise CniboxError(
        "cannot tell which executable to link to",
        hint="run --install from the built binary, the zipapp or the `cnibox` console script",
    )


def install_links(directory: str, names: Iterable[str], *, symbolic: bool) -> str:
    """Create DIR/NAME links to this executable; existing names are skipped. Returns a report."""
    target = self_executable()
    if not os.path.isdir(directory):
        raise CniboxError(f"{directory}: not a directory")
    lines = []
    for name in names:
        path = os.path.join(directory, name)
        if os.path.lexists(path):
            lines.append(f"{path}: exists, skipped\n")
            continue
        try:
            if symbolic:
                os.symlink(target, path)
            else:
                os.link(target, path)
        except OSError as exc:
            raise CniboxError(f"{path}: {exc.strerror}", errno=exc.errno) from exc
        lines.append(f"{path} -> {target}\n")
    return "".join(lines)
