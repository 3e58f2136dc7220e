"""Reading what cnibox is given to read (files named by paths, standard input) within bounds.

Rules of this module:
1. A path is opened non-blocking (a FIFO must not hang the open) and the opened fd, not the
   path, is checked to be a regular file before anything is read: FIFOs, devices,
   directories and sockets fail at once, with what they are in the message. There is no
   window between the check and the read (no stat-then-open). Symlinks are followed, as
   every reader of these files does: kubelet's projected volumes are made of them.
2. Nothing is read beyond `limit + 1` bytes; an input over its limit (core/limits.py) is
   refused with `UnreadableInput` naming the input and the limit.
3. Lines are streamed (`lines`) where an input may legitimately be large: one line in memory
   at a time, each and all of them bounded.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO

from multicall.core.limits import describe_size
from multicall.errors import UnreadableInput

_CHUNK = 64 * 1024
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str, what: str) -> int:
    """An fd on the regular file at `path` (O_RDONLY|O_NONBLOCK|O_CLOEXEC), or UnreadableInput."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UnreadableInput(f"{what} {path}: {reason}", path=path, errno=exc.errno) from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:  # pragma: no cover - fstat of an open fd does not fail
        os.close(fd)
        raise UnreadableInput(f"{what} {path}: {exc.strerror}", path=path) from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnreadableInput(f"{what} {path} is {file_kind(mode)}, not a regular file", path=path)
    return fd


def read_file(path: str, *, limit: int, what: str) -> bytes:
    """The whole regular file at `path`, at most `limit` bytes (rules 1 and 2)."""
    fd = open_regular(path, what)
    try:
        return _read_fd(fd, limit, f"{what} {path}", path)
    finally:
        os.close(fd)


def read_stream(stream: BinaryIO, *, limit: int, what: str) -> bytes:
    """All of `stream` (standard input), at most `limit` bytes."""
    data = _read_upto(stream.read, limit + 1, what)
    if len(data) > limit:
        raise UnreadableInput(_too_large(what, limit))
    return data


def _read_fd(fd: int, limit: int, what: str, path: str) -> bytes:
    data = _read_upto(lambda n: os.read(fd, n), limit + 1, what)
    if len(data) > limit:
        raise UnreadableInput(_too_large(what, limit), path=path)
    return data


def _read_upto(read: Callable[[int], bytes], size: int, what: str) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left > 0:
        try:
            chunk = read(min(left, _CHUNK))
        except OSError as exc:
            raise UnreadableInput(f"{what}: {exc.strerror or exc}", errno=exc.errno) from None
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
