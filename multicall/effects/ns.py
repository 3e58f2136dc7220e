"""setns(2)/unshare(2) through ctypes (Python 3.11 has no os.setns), and a netns switch that
always returns.

Rules of this module:
1. libc is opened with CDLL(None): the already-loaded libc, no ctypes.util.find_library
   (which spawns ldconfig/gcc and fails in an empty root).
2. `entered_netns` is for single-threaded processes only: setns switches the calling thread,
   and any other thread would stay behind. It refuses the caller's own netns unless told.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

from multicall.effects import caller
from multicall.errors import NetnsError, NetnsNotFound

CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000


@cache
def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def setns(fd: int, nstype: int = 0) -> None:
    """Move the calling thread into the namespace `fd` refers to; OSError on failure."""
    if libc().setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def unshare(flags: int) -> None:
    if libc().unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def ns_identity(path: str) -> tuple[int, int]:
    st = os.stat(caller.resolve_netns(path))
    return (st.st_dev, st.st_ino)


def is_own_netns(path: str) -> bool:
    """True when `path` is the network namespace this thread is in."""
    return ns_identity(path) == ns_identity("/proc/thread-self/ns/net")


def open_netns(path: str) -> int:
    """An O_RDONLY fd on a netns path, with NetnsNotFound / NetnsError for the two failures."""
    try:
        return os.open(caller.resolve_netns(path), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NetnsNotFound(f"{path}: no such network namespace", netns=path) from exc
    except OSError as exc:
        raise NetnsError(f"{path}: {exc.strerror}", netns=path, errno=exc.errno) from exc


@contextmanager
def entered_netns(
    path: str, *, allow_own: bool = False, netlink_only: bool = False
) -> Iterator[None]:
    """Run the body inside the netns at `path`, then return to the original one.

    Refuses the current netns (the host's, for a CNI plugin) unless `allow_own`, like
    libcni's CNI_NETNS_OVERRIDE. If the way back fails the process cannot be trusted any
    more, so it exits at once rather than run anything in the wrong namespace.
    `netlink_only`: the body only talks netlink, so when the caller handed over a netlink
    socket made inside that netns (an agent worker, `effects.caller`) nothing is entered.
    """
    target = open_netns(path)
    try:
        if not allow_own and is_own_netns(path):
            raise NetnsError(
                f"{path} is the caller's own network namespace; refusing to program it",
                netns=path,
                hint="set CNI_NETNS_OVERRIDE=1 to allow it",
            )
        if netlink_only and caller.has_netlink(path):
            yield
            return
        original = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _switch(target, path)
            try:
                yield
            finally:
                _return(original)
        finally:
            os.close(original)
    finally:
        os.close(target)


def _switch(fd: int, path: str) -> None:
    try:
        setns(fd, CLONE_NEWNET)
    except OSError as exc:
        if exc.errno == errno_mod.EPERM and caller.active():
            raise caller.ServeElsewhere("no CAP_SYS_ADMIN to enter the pod netns") from None
        hint = "is it a network namespace (nsfs) file?" if exc.errno == errno_mod.EINVAL else None
        raise NetnsError(
            f"cannot enter {path}: {exc.strerror}", netns=path, errno=exc.errno, hint=hint
        ) from exc


def _return(fd: int) -> None:
    try:
        setns(fd, CLONE_NEWNET)
    except OSError as exc:  # pragma: no cover - kernel refused the way back
        os.write(2, f"cnibox: cannot return to the original netns: {exc}\n".encode())
        os._exit(70)
