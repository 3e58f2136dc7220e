"""Where bundled native libraries live, and the environment python-iptables needs to use them.

Rules of this module:
1. The bundle root is the directory holding the `multicall` package: the Nuitka dist (or the
   launcher's extraction dir) when compiled, the source tree otherwise. The build stages
   `iptlibs/` (libip4tc.so, libip6tc.so, libxtables.so.12) and `xtables/` (libxt_*.so) there.
2. `prepare_iptc()` must run before the first `import iptc`: python-iptables reads these
   variables at import time. When no bundle exists (source checkout), the host's libraries
   are used, as python-iptables would find them.
3. It also short-circuits ctypes.util.find_library("c"), which otherwise spawns ldconfig and
   gcc (absent in an empty root, and slow).
4. The launcher sets LOCPATH to the bundled locale; `child_environ()` drops it again for host
   programs a cnibox applet starts (their glibc must use the host's locales).
"""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Callable, Mapping
from functools import cache

import multicall

XTABLES_ABI = "12"
HOST_XTABLES_DIRS = (
    "/usr/lib/x86_64-linux-gnu/xtables",
    "/usr/lib/aarch64-linux-gnu/xtables",
    "/usr/lib/xtables",
    "/usr/lib64/xtables",
)


def bundle_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(multicall.__file__)))


@cache
def prepare_iptc() -> None:
    """Point python-iptables at the bundled (or host) libiptc and xtables extensions."""
    root = bundle_root()
    iptlibs = os.path.join(root, "iptlibs")
    xtables = os.path.join(root, "xtables")
    if os.path.isdir(iptlibs):
        os.environ.setdefault("IPTABLES_LIBDIR", iptlibs)
        os.environ.setdefault("PYTHON_IPTABLES_XTABLES_VERSION", XTABLES_ABI)
    if os.path.isdir(xtables):
        os.environ.setdefault("XTABLES_LIBDIR", xtables)
    else:
        host = next((d for d in HOST_XTABLES_DIRS if os.path.isdir(d)), None)
        if host:
            os.environ.setdefault("XTABLES_LIBDIR", host)
    _short_circuit_find_library()


def _short_circuit_find_library() -> None:
    original: Callable[[str], str | None] = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        return "libc.so.6" if name == "c" else original(name)

    ctypes.util.find_library = find_library


def child_environ(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for a host program started by an applet: without the bundle's LOCPATH."""
    child = dict(env)
    locpath = child.get("LOCPATH", "")
    if locpath and os.path.dirname(locpath) == bundle_root():
        del child["LOCPATH"]
    return child


def unpack_for_node(single_file: str, cache_root: str) -> str:
    """Make the launcher of `single_file` unpack its payload into `cache_root` now (its
    CNIBOX_UNPACK_ONLY mode) and return the directory, so that the first pod start after an
    install or upgrade does not pay for it (docs/agent.md "First start"). OSError or
    RuntimeError when it cannot."""
    import subprocess

    env = {"CNIBOX_UNPACK_ONLY": "1", "CNIBOX_CACHE": cache_root, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([single_file], env=env, capture_output=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            proc.stderr.decode(errors="replace").strip() or f"exit {proc.returncode}"
        )
    return proc.stdout.decode(errors="replace").strip()
