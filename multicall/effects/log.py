"""Where log lines go: a stream (stderr) and, for the plugin, an optional size-bounded file.

`Logger` is the one logger of cnibox's applets: the plugin (level from the config's
`log_level`), install-cni and the daemons (`--log-level`, `--log-format`). Lines are
formatted by core/logs.py.

Rules of this module:
1. Logging never fails the work it reports on: a write error on the stream is ignored, a
   log file that cannot be opened or written is reported once on the stream and dropped.
2. A log file (`LogFile`) is opened without following a symlink, must be a regular file,
   is created 0600, and is rotated to `PATH.1` when the next line would take it past its
   size bound, so it never holds more than about twice the bound on disk. Concurrent
   plugin processes append to it under flock(2) and reopen the path after another one
   rotated it.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from collections.abc import Callable
from typing import BinaryIO

from multicall.core import logs
from multicall.effects.caller import OWN_FILES, Files
from multicall.errors import ServeElsewhere

LOG_FILE_MAX_BYTES = 10 << 20  # then PATH.1: at most ~20 MiB on disk


class Logger:
    """logrus-style lines at `level` and above, with `fields` on every line."""

    def __init__(
        self,
        stream: BinaryIO | None,
        level: str = "info",
        fmt: str = "plain",
        *,
        fields: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.stream = stream
        self.level = logs.parse_level(level)
        self.fmt = fmt
        self.fields: dict[str, str] = dict(fields or {})
        self.clock = clock
        self.file: LogFile | None = None

    def set_level(self, level: str) -> None:
        self.level = logs.parse_level(level)

    def enabled(self, level: str) -> bool:
        return logs.enabled(level, self.level)

    def log(self, level: str, message: str, **extra: str) -> None:
        if not logs.enabled(level, self.level):
            return
        fields = {**self.fields, **extra} if extra else self.fields
        line = logs.format_line(self.fmt, logs.timestamp(self.clock()), level, message, fields)
        data = line.encode("utf-8", "surrogateescape")
        self._write_stream(data)
        if self.file is not None and not self.file.write(data):
            problem = self.file.problem
            self.close()
            self.warning(f"log file not written any more: {problem}")

    def debug(self, message: str, **extra: str) -> None:
        self.log("debug", message, **extra)

    def info(self, message: str, **extra: str) -> None:
        self.log("info", message, **extra)

    def warning(self, message: str, **extra: str) -> None:
        self.log("warning", message, **extra)

    def error(self, message: str, **extra: str) -> None:
        self.log("error", message, **extra)

    def open_file(
        self, path: str, max_bytes: int = LOG_FILE_MAX_BYTES, *, files: Files = OWN_FILES
    ) -> None:
        """Also append every later line to `path`, in `files`' filesystem (a warning on the
        stream if it cannot)."""
        log_file = LogFile(path, max_bytes, files)
        if log_file.open():
            self.file = log_file
        else:
            log_file.release()
            self.warning(f"log file not used: {log_file.problem}")

    def close(self) -> None:
        if self.file is not None:
            self.file.release()
            self.file = None

    def _write_stream(self, data: bytes) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(data)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stderr must not fail the command being logged


class LogFile:
    """An append-only log file with one rotated predecessor (`PATH.1`)."""

    def __init__(self, path: str, max_bytes: int, files: Files = OWN_FILES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.files = files
        self.fd = -1
        self.problem = ""
        # Every path below is the file as the process it logs for sees it (`files`): the
        # path itself, or (in a node agent's worker) the caller's file, opened by the
        # caller (agent/caller_files.py), so the lines land on the node.

    def open(self) -> bool:
        problem = logs.log_file_problem(self.path)
        if problem is not None:
            self.problem = f"{self.path}: {problem}"
            return False
        return self._guard(self._open)

    def write(self, data: bytes) -> bool:
        try:
            return self.fd >= 0 and self._guard(lambda: self._write(data))
        except ServeElsewhere as exc:
            # Opened, then the caller that opens its files for an agent's worker stopped
            # answering (agent/caller_files.py): the work goes on, the file is dropped
            # (rule 1). Only the first open hands the request back, before any change.
            self.problem = f"{self.path}: {exc.reason}"
            self.close()
            return False

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def release(self) -> None:
        self.close()

    def _guard(self, action: Callable[[], None]) -> bool:
        try:
            action()
        except OSError as exc:
            self.problem = f"{self.path}: {exc.strerror or exc}"
            self.close()
            return False
        return True

    def _open(self) -> None:
        try:
            existing = self.files.lstat(self.path)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(existing.mode):
                raise OSError(0, "not a regular file")
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        # O_NOFOLLOW, O_NONBLOCK and the check below hold even if the path changed since
        # lstat: a symlink is not followed, a FIFO does not hang the plugin.
        fd = self.files.open_fd(self.path, flags | os.O_NONBLOCK, 0o600)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(0, "not a regular file")
        self.close()
        self.fd = fd

    def _write(self, data: bytes) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            if self._replaced():
                self._open()  # another process rotated it: append to the new file
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            size = os.fstat(self.fd).st_size
            if size and size + len(data) > self.max_bytes:
                self.files.rotate(self.path)
                self._open()
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            os.write(self.fd, data)
        finally:
            if self.fd >= 0:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _replaced(self) -> bool:
        """Whether the path names another file than the one open (rotated or removed)."""
        try:
            st = self.files.lstat(self.path)
        except FileNotFoundError:
            return True
        mine = os.fstat(self.fd)
        return (st.dev, st.ino) != (mine.st_dev, mine.st_ino)
