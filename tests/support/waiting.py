"""Waiting for something another process or thread does, with a bound."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll `condition` (a read that fails with OSError, ValueError or KeyError counts as not
    yet) until it holds, or fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")
