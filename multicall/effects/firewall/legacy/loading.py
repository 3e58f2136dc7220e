"""The legacy backend's python-iptables: imported once with its import-time side effects
defused (rule 1 of effects/firewall/legacy), and private libiptc handles opened in the
current netns (rule 2)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import sysconfig
import types
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from types import ModuleType
from typing import Any

from multicall.core.firewall.model import Family
from multicall.effects import bundle
from multicall.errors import FirewallError

LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib",
)


# ----------------------------------------------------------------------------- importing iptc


class _NoChild:
    """Stands in for subprocess.Popen while python-iptables imports (it runs modprobe)."""

    returncode = 0

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        self.stderr = io.BytesIO()

    def wait(self) -> int:
        return 0


@cache
def iptc() -> ModuleType:
    """python-iptables, imported once without spawning anything."""
    bundle.prepare_iptc()
    _search_libraries_without_children()
    original = subprocess.Popen
    subprocess.Popen = _NoChild  # type: ignore[assignment,misc]  # see _NoChild
    stubbed = _stub_distutils()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # escape-sequence warnings of its sources
            import iptc as module
    except (OSError, ImportError, AttributeError) as exc:
        raise FirewallError(f"cannot load libiptc: {exc}", hint="is the bundle complete?") from exc
    finally:
        subprocess.Popen = original  # type: ignore[misc]  # restoring the real class
        for name in stubbed:
            sys.modules.pop(name, None)
    loaded: ModuleType = module
    return loaded


def _stub_distutils() -> tuple[str, ...]:
    """Give python-iptables the one distutils function it imports, for the import only.

    The real import goes through setuptools' distutils shim (half a second) or the
    deprecated stdlib package (absent from the bundle).
    """
    if "distutils" in sys.modules:
        return ()
    package = types.ModuleType("distutils")
    module = types.ModuleType("distutils.sysconfig")
    module.get_python_lib = lambda: sysconfig.get_path("purelib")  # type: ignore[attr-defined]
    package.sysconfig = module  # type: ignore[attr-defined]
    sys.modules["distutils"], sys.modules["distutils.sysconfig"] = package, module
    return ("distutils", "distutils.sysconfig")


def _search_libraries_without_children() -> None:
    """Replace ctypes.util.find_library (ldconfig, gcc, ld) by a directory search."""
    import ctypes.util

    previous: Callable[[str], str | None] = ctypes.util.find_library
    if getattr(previous, "cnibox_no_children", False):
        return

    def find_library(name: str) -> str | None:
        return "libc.so.6" if name == "c" else _find_in_dirs(name)

    find_library.cnibox_no_children = True  # type: ignore[attr-defined]  # marker attribute
    ctypes.util.find_library = find_library


def _find_in_dirs(name: str) -> str | None:
    dirs = [d for d in os.environ.get("IPTABLES_LIBDIR", "").split(":") if d] + list(LIB_DIRS)
    stem = name if name.startswith("lib") else f"lib{name}"
    for directory in dirs:
        found = [f for f in _listing(directory) if f.startswith(f"{stem}.so")]
        if found:
            # The soname (lib.so.N) first: python-iptables reads the ABI from the name.
            found.sort(key=lambda f: (f.count(".") != 2, f))
            return os.path.join(directory, found[0])
    return None


@cache
def _listing(directory: str) -> tuple[str, ...]:
    try:
        return tuple(os.listdir(directory))
    except OSError:
        return ()


# ----------------------------------------------------------------------------- handles


@contextlib.contextmanager
def opened(family: Family, table: str) -> Iterator[Any]:
    """A private libiptc handle on `table` in the current netns, freed on exit."""
    module = iptc()
    cls = module.Table if family is Family.IPV4 else module.Table6
    handle = object.__new__(cls)  # not Table(...): its cache outlives netns switches
    try:
        handle._init(table, False)
    except module.IPTCError as exc:
        raise FirewallError(f"{tool_name(family)}: {exc}", table=table) from exc
    try:
        yield handle
    finally:
        handle.close()


def tool_name(family: Family) -> str:
    return "iptables-legacy" if family is Family.IPV4 else "ip6tables-legacy"
