"""Files as the process being served sees them: `Files`, passed explicitly to whatever opens
a path another process named (the kubeconfig, its token and CA files, the xtables lock file,
the config's log_file and its rotation).

Three kinds:
- `OWN_FILES`: this process's own view, the plain operations (the one-shot plugin, the
  installer, the repair controller, tests);
- `RootedFiles(root_fd, cwd)`: a filesystem mounted elsewhere, through a directory this
  process opened itself (the keeper's `--host-root`): every path is opened through it with
  openat2(RESOLVE_IN_ROOT), so it resolves as on the node;
- a node agent's worker asks its caller, the launcher, for each file it needs
  (agent/caller_files.py `AskedFiles`): the caller opens it with its own authority, and
  only a path the request named (issue 24: no root descriptor crosses the socket).

Nothing here is process-wide: whoever serves a caller builds its `Files` and passes it
down (plugin/ports.py `PluginDeps.files`); reading stays effects/inputs.py's (bounded,
non-blocking, regular files only), which opens with it. Anything that needs more privilege
than the worker has raises `errors.ServeElsewhere` before anything changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from multicall.errors import ServeElsewhere

SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10


class Files(Protocol):
    """How paths named by the process being served are opened."""

    def open_fd(self, path: str, flags: int, mode: int = 0o666) -> int:
        """os.open(path, flags | O_CLOEXEC, mode) as that process would do it; OSError as
        os.open raises it."""
        ...

    def lstat(self, path: str) -> FileStat:
        """os.lstat(path) as that process sees it (OSError as os.lstat raises it)."""
        ...

    def rotate(self, path: str) -> None:
        """os.replace(path, path + ".1"): a log file's one rotation."""
        ...


@dataclass(frozen=True, slots=True)
class FileStat:
    """What callers of `Files.lstat` look at: the file's type and identity."""

    mode: int
    dev: int
    ino: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStat:
        return cls(st.st_mode, st.st_dev, st.st_ino)


def exists(files: Files, path: str) -> bool:
    """os.path.lexists through `files`: there unless lstat says it is missing (a path that is
    there but not ours to look at is there, as lstat's EACCES is not "missing")."""
    try:
        files.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


@dataclass(frozen=True, slots=True)
class OwnFiles:
    """This process's own filesystem: the plain operations."""

    def open_fd(self, path: str, flags: int, mode: int = 0o666) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def lstat(self, path: str) -> FileStat:
        return FileStat.of(os.lstat(path))

    def rotate(self, path: str) -> None:
        os.replace(path, path + ".1")


# Immutable and stateless: one value is as good as another.
OWN_FILES = OwnFiles()


@dataclass(frozen=True, slots=True)
class RootedFiles:
    """Another process's filesystem: its root (a descriptor it handed over) stands for "/",
    its cwd for "." (the descriptor is borrowed: never closed here)."""

    root_fd: int
    cwd: str = "/"

    def open_fd(self, path: str, flags: int, mode: int = 0o666) -> int:
        return _openat2_in_root(self.root_fd, os.path.join(self.cwd, path), flags, mode)

    def lstat(self, path: str) -> FileStat:
        fd = self.open_fd(path, os.O_PATH | os.O_NOFOLLOW)
        try:
            return FileStat.of(os.fstat(fd))
        finally:
            os.close(fd)

    def rotate(self, path: str) -> None:
        # Both names in one directory, resolved once through the root.
        directory, name = os.path.split(os.path.join(self.cwd, path))
        fd = _openat2_in_root(self.root_fd, directory or "/", os.O_PATH | os.O_DIRECTORY, 0)
        try:
            os.replace(name, name + ".1", src_dir_fd=fd, dst_dir_fd=fd)
        finally:
            os.close(fd)


@cache
def _open_how() -> Any:
    """struct open_how (linux/openat2.h), made once (a class: immutable once made). ctypes
    is loaded only here, when a mounted root is used: most processes never need it."""
    import ctypes

    class OpenHow(ctypes.Structure):
        _fields_ = (
            ("flags", ctypes.c_uint64),
            ("mode", ctypes.c_uint64),
            ("resolve", ctypes.c_uint64),
        )

    return OpenHow


def _openat2_in_root(root_fd: int, path: str, flags: int, mode: int) -> int:
    """open(path, flags, mode) with `root_fd` as "/" for every component, `..` and symlink
    included."""
    import ctypes

    mode = mode if flags & os.O_CREAT else 0  # openat2 refuses a mode without O_CREAT
    how = _open_how()(flags | os.O_CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    # The already-loaded libc, as effects.ns opens it.
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    fd = syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(root_fd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        if err in (38, 1):  # ENOSYS (kernel < 5.6), EPERM (seccomp): cannot do it safely
            raise ServeElsewhere("openat2 unavailable")
        raise OSError(err, os.strerror(err))
    return int(fd)
