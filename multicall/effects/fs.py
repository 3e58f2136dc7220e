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
4. Reads never block and never run away: every file is opened O_NONBLOCK (a FIFO does not
   wait for a writer), its type is checked with fstat on the opened fd (no check-then-open
   race), only a regular file is read, and at most `limit` bytes (ConfigError naming the
   limit beyond that). `follow=False` refuses a symlink (O_NOFOLLOW) instead of reading
   whatever it points at (/dev/zero, a file outside the CNI dir).
5. Many files at once (the installer's batches, issue 30 item 6) keep rule 1's guarantee
   with one flush per step instead of two fsyncs per file: `write_unsynced` and `stage`
   write without fsync, and `sync_filesystem` (syncfs(2): every file's data and every
   rename of the filesystem, with its errors) makes them durable together. The caller
   orders its steps so nothing is renamed over a file before its data is durable.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import os
import stat
from collections.abc import Iterable

from multicall.core.limits import describe_size
from multicall.effects.inputs import NotRegularFile, file_kind, opened_regular, read_upto
from multicall.errors import ConfigError

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


def write_unsynced(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` atomically (rename), durable only after the next
    `sync_filesystem` of its filesystem (rule 5)."""
    os.rename(stage(path, data, mode), path)


def stage(path: str, data: bytes, mode: int = 0o644) -> str:
    """A temp file beside `path` holding `data` (not synced); `path` itself is untouched
    until the caller renames the temp over it (after a `sync_filesystem`, rule 5)."""
    tmp, fd = _open_temp(path, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except BaseException:
        _discard(tmp)
        raise
    return tmp


def commit_staged(tmp: str, path: str) -> None:
    """Rename a staged temp over `path` (durable after the next `sync_filesystem`)."""
    os.rename(tmp, path)


def discard(path: str) -> None:
    """Remove a staged temp that will not be committed."""
    _discard(path)


def unlink_unsynced(path: str) -> None:
    """Remove `path` (durable after the next `sync_filesystem`); gone already is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sync_filesystem(directory: str) -> None:
    """syncfs(2) of the filesystem holding `directory`: every write and rename made on it so
    far is durable when this returns (OSError when the kernel reports a writeback error)."""
    import ctypes

    syncfs = ctypes.CDLL(None, use_errno=True).syncfs
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), directory)
    finally:
        os.close(fd)


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
    """Remove a file or symlink; False when it was already gone (also on a read-only file
    system, where unlink(2) says EROFS even for a name that does not exist)."""
    if not os.path.lexists(path):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(os.path.dirname(path))
    return True


def _discard(tmp: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


_MISSING = (errno_mod.ENOENT, errno_mod.ENOTDIR)


class NotAFile(ConfigError):
    """The path exists but is not a regular file (or is a symlink where none is allowed)."""


def read_file(path: str, limit: int, *, what: str = "file", follow: bool = True) -> bytes | None:
    """At most `limit` bytes of the regular file at `path`; None when it does not exist.

    NotAFile for a FIFO, device, directory, socket (or a symlink with follow=False);
    ConfigError when it holds more than `limit` bytes (`what` names it in the message).
    Opened and read by effects/inputs.py (rule 4), worded here for the installer.
    """
    try:
        with opened_regular(path, follow=follow) as fd:
            data = read_upto(fd, limit)
    except NotRegularFile as exc:
        raise _not_a_file(path, exc.kind) from None
    except OSError as exc:
        if exc.errno in _MISSING:
            return None
        raise
    if len(data) > limit:
        raise ConfigError(
            f"{path}: the {what} is larger than the {describe_size(limit)} limit", path=path
        )
    return data


def _not_a_file(path: str, kind: str) -> NotAFile:
    if kind == "a symlink":
        return NotAFile(f"{path}: a symlink", path=path)
    return NotAFile(f"{path}: {kind}, not a regular file", path=path)


def private_dir(path: str, *, create: bool) -> bool:
    """Make sure `path` is a directory only this user can change: not a symlink, owned by the
    effective uid, writable by nobody else (created with mode 0700 when `create`).
    False when it does not exist (and was not to be created); ConfigError when it is not private.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.makedirs(path, 0o700)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        raise NotAFile(f"{path}: {file_kind(st.st_mode)}, not a directory", path=path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ConfigError(
            f"{path}: others may write to it (owner uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}); the installer keeps its state only where "
            "nobody else can change it",
            path=path,
        )
    return True


def os_error_text(exc: OSError) -> str:
    """`path: reason` for an OSError, as Unix tools print it (never the exception's repr)."""
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    reason = exc.strerror or os.strerror(exc.errno or 0)
    return f"{' -> '.join(names)}: {reason}" if names else reason


def file_mode(path: str, default: int = 0o644) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return default


def sha256_file(path: str) -> str | None:
    """The SHA-256 of a regular file, streamed; None when it is missing or not a regular file."""
    import hashlib

    digest = hashlib.sha256()
    try:
        with opened_regular(path) as fd:
            while chunk := os.read(fd, _CHUNK):
                digest.update(chunk)
    except NotRegularFile:
        return None
    except OSError as exc:
        if exc.errno in _MISSING:
            return None
        raise
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
