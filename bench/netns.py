"""The throwaway network namespaces every case runs in."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.paths import NETNS_DIR, PREFIX

# ----------------------------------------------------------------------------- netns


class Namespaces:
    """Every netns the bench makes, removed by `remove_all` whatever happens."""

    def __init__(self) -> None:
        self.made: set[str] = set()
        self._seq = 0

    def make(self, count: int = 1) -> list[str]:
        names = []
        for _ in range(count):
            self._seq += 1
            names.append(f"{PREFIX}{os.getpid()}x{self._seq}")
        self.made.update(names)
        _ip_batch([f"netns add {name}" for name in names])
        return names

    def remove(self, names: Sequence[str]) -> None:
        _ip_batch([f"netns del {name}" for name in names], check=False)
        self.made.difference_update(names)

    def remove_all(self) -> None:
        if self.made:
            self.remove(sorted(self.made))

    @contextmanager
    def fresh(self) -> Iterator[str]:
        (name,) = self.make()
        try:
            yield f"{NETNS_DIR}/{name}"
        finally:
            self.remove([name])


def _ip_batch(commands: Sequence[str], *, check: bool = True) -> None:
    proc = subprocess.run(
        ["ip", "-force", "-batch", "-"],
        input="".join(f"{c}\n" for c in commands).encode(),
        capture_output=True,
        check=False,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip -batch failed: {proc.stderr.decode().strip()}")


def remove_stale() -> None:
    """Namespaces left by a bench run that was SIGKILLed (its pid is gone)."""
    stale = []
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []:
        pid = name.removeprefix(PREFIX).split("x")[0]
        if name.startswith(PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.append(name)
    if stale:
        _ip_batch([f"netns del {name}" for name in stale], check=False)
