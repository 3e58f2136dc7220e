"""What a test needs from the machine, and what happens when the machine lacks it.

Tests that need root, `ip` or host tools (oracles, compilers) are skipped on a developer's
machine that lacks them; under CI (CI=true) a skip would hide untested code, so they fail.
"""

from __future__ import annotations

import os
import shutil

import pytest


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
