"""Reading what cnibox is given to read (files named by paths, standard input) within bounds.

Rules of this module:
1. A path is opened non-blocking (a FIFO must not hang the open) and the opened fd, not the
   path, is checked to be a regular file before anything is read: FIFOs, devices,
   directories and sockets fail at once, with what they are in the message. There is no
   window between the check and the read (no stat-then-open). Symlinks are followed unless
   a caller says otherwise (the installer, in net.d): kubelet's projected volumes, where
   the service account token lives, are made of them. This is the one opener of files to
   read: the installer's reader (effects/fs.py `read_file`) words the same failures its way.
   Paths are opened as the process being served sees them: through the `Files` its
   caller passes (effects/caller.py; default `OWN_FILES`, a plain open(2)). A node agent's
   worker passes its caller, which opens them (agent/caller_files.py), so it reads the
   caller's kubeconfig, token and CA with exactly these bounds and checks.
2. Nothing is read beyond `limit + 1` bytes; an input over its limit (core/limits.py) is
   refused with `UnreadableInput` naming the input and the limit.
3. Lines are streamed (`lines`) where an input may legitimately be large: one line in memory
   at a time, each and all of them bounded.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import os
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO

from multicall.core.limits import describe_size
from multicall.effects.caller import OWN_FILES, Files
from multicall.errors import UnreadableInput

_CHUNK = 64 * 1024
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symlink"),
)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for messages (`a FIFO`, `a directory`)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class NotRegularFile(OSError):
    """The path exists but is not a regular file, or is a symlink where none is allowed;
    `kind` says what it is (`file_kind`). Callers word it (UnreadableInput, the installer's
    NotAFile)."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(errno_mod.EINVAL, kind, path)
        self.kind = kind


def open_regular_fd(path: str, *, follow: bool = True, files: Files = OWN_FILES) -> int:
    """An fd on the regular file at `path`, opened O_RDONLY|O_NONBLOCK|O_NOCTTY|O_CLOEXEC
    (and O_NOFOLLOW unless `follow`), checked on the fd (rule 1). OSError as open(2) fails;
    NotRegularFile for a FIFO, device, directory, socket or (not following) a symlink."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = files.open_fd(path, flags if follow else flags | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno_mod.ELOOP and not follow:
            raise NotRegularFile(path, "a symlink") from None
        if exc.errno == errno_mod.ENXIO:  # a socket
            raise NotRegularFile(path, "a socket") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:  # pragma: no cover - fstat of an open fd does not fail
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(path, file_kind(mode))
    return fd


@contextlib.contextmanager
def opened_regular(path: str, *, follow: bool = True) -> Iterator[int]:
    """`open_regular_fd` for the body of a with statement."""
    fd = open_regular_fd(path, follow=follow)
    try:
        yield fd
    finally:
        os.close(fd)


def read_upto(fd: int, limit: int) -> bytes:
    """At most `limit + 1` bytes of `fd`: more than `limit` means the file is over it."""
    return _read_upto(lambda n: os.read(fd, n), limit + 1)


def open_regular(path: str, what: str, files: Files = OWN_FILES) -> int:
    """`open_regular_fd` with every failure an UnreadableInput naming `what` and the path."""
    try:
        return open_regular_fd(path, files=files)
    except NotRegularFile as exc:
        raise UnreadableInput(
            f"{what} {path} is {exc.kind}, not a regular file", path=path
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UnreadableInput(f"{what} {path}: {reason}", path=path, errno=exc.errno) from None


def read_file(path: str, *, limit: int, what: str, files: Files = OWN_FILES) -> bytes:
    """The whole regular file at `path`, at most `limit` bytes (rules 1 and 2)."""
    fd = open_regular(path, what, files)
    try:
        return _read_fd(fd, limit, f"{what} {path}", path)
    finally:
        os.close(fd)


def read_stream(stream: BinaryIO, *, limit: int, what: str) -> bytes:
    """All of `stream` (standard input), at most `limit` bytes."""
    try:
        data = _read_upto(stream.read, limit + 1)
    except OSError as exc:
        raise UnreadableInput(f"{what}: {exc.strerror or exc}", errno=exc.errno) from None
    if len(data) > limit:
        raise UnreadableInput(_too_large(what, limit))
    return data


def _read_fd(fd: int, limit: int, what: str, path: str) -> bytes:
    try:
        data = read_upto(fd, limit)
    except OSError as exc:
        raise UnreadableInput(f"{what}: {exc.strerror or exc}", errno=exc.errno) from None
    if len(data) > limit:
        raise UnreadableInput(_too_large(what, limit), path=path)
    return data


def _read_upto(read: Callable[[int], bytes | None], size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = read(min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _too_large(what: str, limit: int) -> str:
    return f"{what} is larger than {describe_size(limit)}, the limit for it (docs/hardening.md)"


def open_input(path: str, what: str) -> BinaryIO:
    """A buffered binary reader on the regular file at `path` (for `lines`)."""
    return os.fdopen(open_regular(path, what), "rb")


def lines(
    stream: BinaryIO, *, max_line: int, max_total: int, what: str
) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its newline) of `stream`, one at a time (rule 3)."""
    total = 0
    number = 0
    while True:
        try:
            line = stream.readline(max_line + 2)
        except OSError as exc:
            raise UnreadableInput(f"{what}: {exc.strerror or exc}", errno=exc.errno) from None
        if not line:
            return
        number += 1
        total += len(line)
        if total > max_total:
            raise UnreadableInput(_too_large(what, max_total))
        body = line[:-1] if line.endswith(b"\n") else line
        if len(body) > max_line:
            raise UnreadableInput(
                f"{what}: line {number} is longer than {describe_size(max_line)}, "
                "the limit for a line (docs/hardening.md)"
            )
        yield number, body
