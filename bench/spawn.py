"""Starting and reaping the processes the bench times."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# ----------------------------------------------------------------------------- processes


@dataclass
class Exit:
    ms: float
    status: int
    cpu_ms: float
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True)
class Reaped:
    pid: int
    end: float
    status: int
    cpu_ms: float


class Spawner:
    """posix_spawn + wait4: one child's wall time and peak RSS, stdio through files."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.live: set[int] = set()
        self._seq = 0

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], stdin: Path | None = None
    ) -> tuple[int, float, Path]:
        self._seq += 1
        out = self.workdir / f"out{self._seq}"
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, str(stdin or os.devnull), os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, f"{out}.1", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, f"{out}.2", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
        ]
        start = time.perf_counter()
        # posix_spawnp would search the bench's own PATH (pyenv shims first), not the child's.
        path = shutil.which(argv[0], path=env.get("PATH")) if "/" not in argv[0] else argv[0]
        pid = os.posix_spawn(path or argv[0], list(argv), dict(env), file_actions=actions)
        self.live.add(pid)
        return pid, start, out

    def reap(self, pid: int) -> Reaped:
        """Wait for `pid` (-1: any child)."""
        got, status, usage = os.wait4(pid, 0)
        end = time.perf_counter()
        self.live.discard(got)
        cpu_ms = 1000 * (usage.ru_utime + usage.ru_stime)
        return Reaped(got, end, os.waitstatus_to_exitcode(status), cpu_ms)

    def run(self, argv: Sequence[str], env: Mapping[str, str], stdin: Path | None = None) -> Exit:
        pid, start, out = self.start(argv, env, stdin)
        return self.collect(start, self.reap(pid), out)

    @staticmethod
    def collect(start: float, reaped: Reaped, out: Path) -> Exit:
        stdout, stderr = Path(f"{out}.1"), Path(f"{out}.2")
        result = Exit(
            (reaped.end - start) * 1000,
            reaped.status,
            reaped.cpu_ms,
            stdout.read_bytes(),
            stderr.read_bytes(),
        )
        stdout.unlink()
        stderr.unlink()
        return result

    def kill_all(self) -> None:
        for pid in list(self.live):
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.live.discard(pid)
