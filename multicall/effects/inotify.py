"""inotify(7) through ctypes: watch directories, read events, block without polling.

Rules of this module:
1. libc is the already-loaded one (`CDLL(None)`), as in effects.ns.
2. The descriptor is non-blocking and close-on-exec; callers wait for it with select/poll
   next to their other descriptors (the signal wake-up pipe) and then drain `read_events`.
3. Watches are on directories, never on the files in them: files get replaced by rename
   (the installer's own writes, kubelet's `..data` swap), which would orphan a file watch.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import struct
from dataclasses import dataclass
from functools import cache

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_HEADER = struct.Struct("iIII")
_BUFFER = 64 * 1024


@cache
def _libc() -> ctypes.CDLL:
    lib = ctypes.CDLL(None, use_errno=True)
    lib.inotify_init1.argtypes = [ctypes.c_int]
    lib.inotify_init1.restype = ctypes.c_int
    lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    lib.inotify_add_watch.restype = ctypes.c_int
    lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.inotify_rm_watch.restype = ctypes.c_int
    return lib


def _raise_errno(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


@dataclass(frozen=True, slots=True)
class Event:
    """One inotify event."""

    wd: int
    mask: int
    cookie: int
    name: str

    @property
    def overflowed(self) -> bool:
        return bool(self.mask & IN_Q_OVERFLOW)


def parse_events(buffer: bytes) -> list[Event]:
    """Split what read(2) returned on an inotify descriptor into events."""
    events = []
    offset = 0
    while offset + _HEADER.size <= len(buffer):
        wd, mask, cookie, length = _HEADER.unpack_from(buffer, offset)
        start = offset + _HEADER.size
        raw = buffer[start : start + length].split(b"\0", 1)[0]
        events.append(Event(wd, mask, cookie, os.fsdecode(raw)))
        offset = start + length
    return events


class Inotify:
    """One inotify instance; `watches` maps watch descriptors to the watched directory."""

    def __init__(self) -> None:
        fd = _libc().inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            _raise_errno("inotify_init1")
        self.fd: int = fd
        self.watches: dict[int, str] = {}

    def fileno(self) -> int:
        return self.fd

    def add_watch(self, directory: str, mask: int) -> int:
        wd = _libc().inotify_add_watch(self.fd, os.fsencode(directory), mask | IN_ONLYDIR)
        if wd < 0:
            _raise_errno(f"inotify_add_watch {directory}")
        self.watches[wd] = directory
        return int(wd)

    def read_events(self) -> list[Event]:
        """Every queued event; [] when none are queued."""
        try:
            return parse_events(os.read(self.fd, _BUFFER))
        except BlockingIOError:
            return []
        except OSError as exc:
            if exc.errno == errno_mod.EINTR:
                return []
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
