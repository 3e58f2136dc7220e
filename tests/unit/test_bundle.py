"""multicall.effects.bundle: pyroute2 without its package __init__, and child environments."""

from __future__ import annotations

import os
import subprocess
import sys

from multicall.effects.bundle import bundle_root, child_environ

PROBE = """
import sys
from multicall.effects.bundle import import_pyroute2
netns = import_pyroute2("netns")
iproute = import_pyroute2("iproute")
print(callable(netns.setns), hasattr(iproute, "IPRoute"))
print(sorted(m for m in ("pyroute2.ndb", "pyroute2.ipdb", "sqlite3") if m in sys.modules))
"""


def test_import_pyroute2_skips_the_package_init() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.splitlines() == ["True True", "[]"]


def test_child_environ_drops_only_the_bundled_locpath() -> None:
    bundled = {"LOCPATH": os.path.join(bundle_root(), "locale"), "PATH": "/bin"}
    assert child_environ(bundled) == {"PATH": "/bin"}
    host = {"LOCPATH": "/usr/share/my-locales", "PATH": "/bin"}
    assert child_environ(host) == host
