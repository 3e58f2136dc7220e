"""Helpers for the suites that test the built single file (`CNIBOX=dist/cnibox`).

These suites exist only for the artifact: without CNIBOX they skip, even under CI, because
`make test` runs them in its `test-binary` step, which always sets CNIBOX.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

TRAILER_SIZE = 64
TRAILER_MAGIC = b"CNIBOX\x01\n"


def artifact_path(variable: str = "CNIBOX", make_target: str = "test-binary") -> Path:
    """The built file named by $variable; skips when unset (`make <make_target>` sets it)."""
    binary = os.environ.get(variable)
    if not binary:
        pytest.skip(f"{variable} is not set: the artifact suites run in `make {make_target}`")
    path = Path(binary).resolve()
    if not path.is_file():
        pytest.fail(f"{variable}={binary}: no such file")
    return path


def read_trailer(path: Path) -> tuple[int, int, int, str]:
    """(payload offset, payload size, raw size, content hash) of a packed cnibox file."""
    data = path.read_bytes()[-TRAILER_SIZE:]
    if data[:8] != TRAILER_MAGIC:
        pytest.fail(f"{path} is not a launcher-packed cnibox (no trailer)")
    offset, size, raw = struct.unpack("<QQQ", data[8:32])
    return offset, size, raw, data[32:48].decode("ascii")


def env_with_cache(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CNIBOX_CACHE"}
    env["CNIBOX_CACHE"] = str(cache)
    env.update(extra)
    return env


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def started(argv: list[str], env: Mapping[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A running process with a stdout pipe; killed and reaped however the test ends."""
    # A shell's background jobs ignore SIGINT, and the ignore survives exec: restore it.
    with subprocess.Popen(
        argv,
        env=dict(env),
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,  # noqa: PLW1509 - started from the main thread only
    ) as proc:
        try:
            yield proc
        finally:
            proc.kill()
