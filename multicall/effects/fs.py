"""Crash-safe file writes for the installer.

Rules of this module:
1. Every write goes to a temp file in the target's directory, is fsynced, renamed over the
   target, and the directory is fsynced: a reader (or a process killed half-way) sees the
   old file or the new one, never a mix. Symlinks are replaced the same way.
2. Temp names start with '.' and end in `.cnibox-tmp`: no CNI runtime loads them (libcni
   reads .conf/.conflist/.json) and the installer's watcher ignores them.
   `remove_stale_temps` clears the ones a killed run left behind.
3. The mode is set with fchmod on the open temp file, so the umask cannot widen or narrow it
   and the file never exists with a looser mode than asked for.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable

TEMP_SUFFIX = ".cnibox-tmp"
_CHUNK = 1 << 20


def temp_path(path: str) -> str:
    directory, base = os.path.split(path)
    return os.path.join(directory, f".{base}.{os.urandom(4).hex()}{TEMP_SUFFIX}")


def fsync_dir(directory: str) -> None:
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_temp(path: str, mode: int) -> tuple[str, int]:
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, mode)
    return tmp, fd


def _commit(tmp: str, fd: int, path: str) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path))


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` (mode `mode`) atomically and durably."""
    _write_chunks_atomic(path, (data,), mode)


def copy_atomic(source: str, path: str, mode: int = 0o755) -> None:
    """Copy the file `source` over `path` atomically (no 'text file busy', no half binary)."""
    with open(source, "rb") as src:
        _write_chunks_atomic(path, iter(lambda: src.read(_CHUNK), b""), mode)


def _write_chunks_atomic(path: str, chunks: Iterable[bytes], mode: int) -> None:
    tmp, fd = _open_temp(path, mode)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        _commit(tmp, fd, path)
    except BaseException:
        _discard(tmp)
        raise


def symlink_atomic(target: str, path: str) -> None:
    """Make `path` a symlink to `target`, replacing whatever `path` was, atomically."""
    tmp = temp_path(path)
    os.symlink(target, tmp)
    try:
        os.rename(tmp, path)
    except BaseException:
        _discard(tmp)
        raise
    fsync_dir(os.path.dirname(path))


def remove_durably(path: str) -> bool:
    """Remove a file or symlink; False when it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(os.path.dirname(path))
    return True


def _discard(tmp: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def read_bytes(path: str) -> bytes | None:
    """A file's content, or None when it does not exist (or is not a readable file)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def file_mode(path: str, default: int = 0o644) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return default


def sha256_file(path: str) -> str | None:
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    except (FileNotFoundError, IsADirectoryError):
        return None
    return digest.hexdigest()


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def remove_stale_temps(directory: str) -> list[str]:
    """Delete temp files a killed writer left in `directory`; returns their paths."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if is_temp_name(name):
            path = os.path.join(directory, name)
            if os.path.lexists(path) and not os.path.isdir(path):
                _discard(path)
                removed.append(path)
    return removed
