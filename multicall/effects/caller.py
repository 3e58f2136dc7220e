"""The caller's context, for code that runs on behalf of another process (the node agent's
workers): its files, its pod netns, a netlink socket it made there.

In a one-shot process there is no context and every function here is the plain operation.
In a node agent's worker (`multicall.applets.linkerd_cni_agent`) the launcher's descriptors
stand in for paths:
- files named by the caller (the kubeconfig, its token and CA files, the xtables lock file,
  the config's log_file and its rotation) are opened through the caller's root with
  openat2(RESOLVE_IN_ROOT), so they resolve as in the caller's mount namespace even though
  the agent's pod has another filesystem. `open_fd` is only the opener: reading is
  effects/inputs.py's (bounded, non-blocking, regular files only), which opens with it;
- `CNI_NETNS` resolves to the descriptor the caller opened (`/proc/self/fd/N` reopens an
  nsfs file), so nothing looks the path up in the agent's mount namespace;
- the nf_tables backend uses the netlink socket the caller created inside the pod's netns
  instead of entering it (no CAP_SYS_ADMIN needed for nft).

Rules of this module:
1. The context is process-wide: a worker sets it before it runs the plugin and clears it
   when the request is done (a worker may serve several requests one after the other, never
   two at once).
2. Anything the worker cannot do without more privilege than it has raises `ServeElsewhere`
   before the request changed anything: the launcher then runs the one-shot path itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10


class ServeElsewhere(BaseException):
    """The request must be served by the caller's one-shot path (nothing was changed).

    A BaseException so that the plugin's own catch-all (its CNI error boundary) lets it
    through to the agent worker.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CallerContext:
    """The caller's root, cwd and namespaces, as descriptors handed over."""

    root_fd: int
    cwd: str
    netns_path: str  # CNI_NETNS as the caller wrote it
    netns_fd: int | None
    netlink_fd: int | None


_context: CallerContext | None = None


def install(context: CallerContext) -> None:
    global _context  # noqa: PLW0603 - rule 1: one context per request, per process
    _context = context


def clear() -> None:
    """The request is done: nothing may use its descriptors any more (rule 1)."""
    global _context  # noqa: PLW0603 - rule 1
    _context = None


def active() -> bool:
    return _context is not None


def resolve_netns(path: str) -> str:
    """Where this process reaches the netns the caller named `path`."""
    ctx = _context
    if ctx is not None and ctx.netns_fd is not None and path == ctx.netns_path:
        return f"/proc/self/fd/{ctx.netns_fd}"
    return path


def netlink_fd() -> int | None:
    """A new descriptor of the caller's netlink socket in the pod netns, if it sent one."""
    ctx = _context
    if ctx is None or ctx.netlink_fd is None:
        return None
    return os.dup(ctx.netlink_fd)


def netlink_netns_fd() -> int | None:
    """The pod netns (a descriptor) the caller's netlink socket lives in, if it sent one."""
    ctx = _context
    return ctx.netns_fd if ctx is not None and ctx.netlink_fd is not None else None


def has_netlink(path: str) -> bool:
    ctx = _context
    return ctx is not None and ctx.netlink_fd is not None and path == ctx.netns_path


def open_fd(path: str, flags: int, mode: int = 0o666) -> int:
    """os.open(path, flags | O_CLOEXEC, mode) as the caller would do it; OSError as os.open
    raises it."""
    ctx = _context
    if ctx is None:
        return os.open(path, flags | os.O_CLOEXEC, mode)
    return _openat2_in_root(ctx.root_fd, os.path.join(ctx.cwd, path), flags, mode)


def directory_of(path: str) -> tuple[int | None, str]:
    """(a descriptor of `path`'s directory as the caller sees it, the last component): for
    the *at calls (`dir_fd=`) of code that opens, stats and renames in one directory.
    (None, path) outside a worker; the descriptor is the caller's to close. OSError as
    open() raises it."""
    ctx = _context
    if ctx is None:
        return None, path
    full = os.path.join(ctx.cwd, path)
    directory, name = os.path.split(full)
    fd = _openat2_in_root(ctx.root_fd, directory or "/", os.O_PATH | os.O_DIRECTORY, 0)
    return fd, name


def lexists(path: str) -> bool:
    """os.path.lexists(path) as the caller sees it."""
    try:
        os.close(open_fd(path, os.O_PATH | os.O_NOFOLLOW))
    except FileNotFoundError:
        return False
    except OSError:
        return True  # there, but not ours to look at (as lstat's EACCES is not "missing")
    return True


@cache
def _open_how() -> Any:
    """struct open_how (linux/openat2.h). ctypes is loaded only here, in a worker: every
    process's file reads go through `open_fd` (effects/inputs.py), most never need it."""
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
    # The already-loaded libc, as effects.ns opens it (which imports this module).
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
