"""setns(2)/unshare(2) through ctypes (Python 3.11 has no os.setns), and a netns switch that
always returns.

Rules of this module:
1. libc is opened with CDLL(None): the already-loaded libc, no ctypes.util.find_library
   (which spawns ldconfig/gcc and fails in an empty root).
2. `entered_netns` switches the calling thread only (setns is per thread): the body must not
   hand work to other threads. It refuses the caller's own netns unless told.
3. A namespace is named by a `NetnsRef`: a path, or an fd the caller already opened (the node
   agent receives them from its clients); borrowed fds are never closed here.
4. A namespace path is opened non-blocking (a FIFO must not hang the open) and the opened fd
   is checked before use: an nsfs file (statfs magic NSFS_MAGIC) of a network namespace
   (NS_GET_NSTYPE). The own-namespace refusal compares that same fd with the caller's
   namespace (no stat of the path that a rename could swap). O_NOFOLLOW is not used: the
   usual names, /proc/PID/ns/net, are symbolic links of procfs.
"""

from __future__ import annotations

import ctypes
import errno as errno_mod
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

from multicall.errors import NetnsError, NetnsNotFound, ServeElsewhere

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


OWN_NETNS = "/proc/thread-self/ns/net"
# The hand-back reason when a node agent's worker would enter a netns for a caller it did
# not see holding what that needs (NetnsRef.caller_may_enter).
CALLER_NOT_VERIFIED = "caller not verified: the agent would enter a netns for it"


@dataclass(frozen=True, slots=True)
class NetnsRef:
    """A network namespace to enter or inspect.

    `path` names it in messages (CNI_NETNS); `fd`, when given, is an fd already open on it and
    is used instead of opening `path`. `own_fd` is the namespace counted as the caller's own
    (None: this thread's), refused unless `allow_own` (libcni's CNI_NETNS_OVERRIDE).
    `netlink_fd`: a NETLINK_NETFILTER socket the caller made inside that namespace (a node
    agent's client hands one over), which nf_tables code uses instead of entering it.
    `for_caller`: the descriptors come from a process this one serves (a node agent's
    worker): what this process lacks the privilege for is handed back to the caller
    (`errors.ServeElsewhere`) instead of failing. `caller_may_enter`: that caller was seen
    to hold what entering the netns needs (agent/authority.py); without it a `for_caller`
    ref is never entered, the request is handed back instead (the worker must not enter
    with its own CAP_SYS_ADMIN what the caller could not). Fds are borrowed: never closed
    here.
    """

    path: str
    fd: int | None = None
    own_fd: int | None = None
    allow_own: bool = False
    netlink_fd: int | None = None
    for_caller: bool = False
    caller_may_enter: bool = False


def ns_identity(target: str | int) -> tuple[int, int]:
    """(device, inode) of a namespace file, by path or open fd."""
    st = os.fstat(target) if isinstance(target, int) else os.stat(target)
    return (st.st_dev, st.st_ino)


def is_own_netns(netns: NetnsRef | str) -> bool:
    """True when `netns` is the caller's own network namespace (OSError if it cannot be read)."""
    ref = NetnsRef(netns) if isinstance(netns, str) else netns
    target = ns_identity(ref.fd if ref.fd is not None else ref.path)
    return target == ns_identity(ref.own_fd if ref.own_fd is not None else OWN_NETNS)


NSFS_MAGIC = 0x6E736673  # linux/magic.h
NS_GET_NSTYPE = 0xB703  # linux/nsfs.h: _IO(0xb7, 0x3)
_NS_NAMES = {
    CLONE_NEWNS: "mount",
    CLONE_NEWCGROUP: "cgroup",
    CLONE_NEWUTS: "uts",
    CLONE_NEWIPC: "ipc",
    CLONE_NEWUSER: "user",
    CLONE_NEWPID: "pid",
    CLONE_NEWTIME: "time",
}


def open_netns(path: str) -> int:
    """An fd on the network namespace file `path` (rule 4): NetnsNotFound when the path does
    not exist, NetnsError when it cannot be opened or is not a network namespace."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError as exc:
        raise NetnsNotFound(f"{path}: no such network namespace", netns=path) from exc
    except OSError as exc:
        raise NetnsError(f"{path}: {exc.strerror}", netns=path, errno=exc.errno) from exc
    try:
        check_netns_fd(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_netns_fd(fd: int, path: str) -> None:
    """NetnsError unless `fd` is open on a network namespace (an nsfs file of type net)."""
    try:
        magic = fs_magic(fd)
    except OSError as exc:  # pragma: no cover - fstatfs of an open fd does not fail
        raise NetnsError(f"{path}: {exc.strerror}", netns=path, errno=exc.errno) from None
    if magic != NSFS_MAGIC:
        from multicall.effects.inputs import file_kind

        mode = os.fstat(fd).st_mode
        kind = "a regular file" if stat.S_ISREG(mode) else file_kind(mode)
        raise NetnsError(
            f"{path} is {kind}, not a network namespace",
            netns=path,
            hint="give a namespace file such as /var/run/netns/NAME or /proc/PID/ns/net",
        )
    nstype = ns_type(fd)
    if nstype is not None and nstype != CLONE_NEWNET:
        name = _NS_NAMES.get(nstype, f"type {nstype:#x}")
        raise NetnsError(f"{path} is a {name} namespace, not a network namespace", netns=path)


def fs_magic(fd: int) -> int:
    """fstatfs(2)'s f_type of an open fd (Python has no os.fstatfs)."""
    # struct statfs is 120 bytes on 64-bit Linux (glibc and musl) and starts with f_type.
    buf = ctypes.create_string_buffer(256)
    if libc().fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF


def ns_type(fd: int) -> int | None:
    """The CLONE_NEW* type of an nsfs fd (NS_GET_NSTYPE, Linux 4.11); None if unknown."""
    import fcntl

    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError:
        return None


@contextmanager
def opened_netns(path: str) -> Iterator[int | None]:
    """An fd on the network namespace `path` for the body (closed after it), or None when it
    cannot be opened as one: skel's CheckNetNS ignores such a path, and the code that needs
    the namespace opens it again to report why."""
    try:
        fd = open_netns(path)
    except NetnsError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def checked_netns(fd: int, path: str) -> Iterator[int | None]:
    """`opened_netns` for a descriptor the caller opened (a node agent's client, the repair
    controller): the same check as `open_netns` applies to it (rule 4), and None when it is
    not a network namespace. Borrowed: never closed here."""
    try:
        check_netns_fd(fd, path)
    except NetnsError:
        yield None
        return
    yield fd


@contextmanager
def entered_netns(
    netns: NetnsRef | str, *, allow_own: bool = False, netlink_only: bool = False
) -> Iterator[None]:
    """Run the body inside `netns` (a `NetnsRef`, or a path), then return to the original one.

    Refuses the caller's own netns (the host's, for a CNI plugin) unless allowed, like
    libcni's CNI_NETNS_OVERRIDE. If the way back fails the process cannot be trusted any
    more, so it exits at once rather than run anything in the wrong namespace.
    `netlink_only`: the body only talks netlink, so when the caller handed over a netlink
    socket made inside that netns (`NetnsRef.netlink_fd`) nothing is entered.
    """
    ref = NetnsRef(netns, allow_own=allow_own) if isinstance(netns, str) else netns
    target = ref.fd if ref.fd is not None else open_netns(ref.path)
    try:
        if not ref.allow_own and is_own_netns(NetnsRef(ref.path, target, ref.own_fd)):
            raise NetnsError(
                f"{ref.path} is the caller's own network namespace; refusing to program it",
                netns=ref.path,
                hint="set CNI_NETNS_OVERRIDE=1 to allow it",
            )
        if netlink_only and ref.netlink_fd is not None:
            yield  # the body talks netlink only, on the socket the caller made in the netns
            return
        if ref.for_caller and not ref.caller_may_enter:
            raise ServeElsewhere(CALLER_NOT_VERIFIED)
        original = os.open(OWN_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _switch(target, ref.path, for_caller=ref.for_caller)
            try:
                yield
            finally:
                _return(original)
        finally:
            os.close(original)
    finally:
        if ref.fd is None:
            os.close(target)


def scratch_netns() -> int | None:
    """An fd on a new, empty network namespace; the calling thread stays where it was (and
    exits the process if it cannot get back, as `entered_netns` does). None when this
    process may not make one (no CAP_SYS_ADMIN)."""
    original = os.open(OWN_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            unshare(CLONE_NEWNET)
        except OSError:
            return None
        try:
            return os.open(OWN_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        finally:
            _return(original)
    finally:
        os.close(original)


def _switch(fd: int, path: str, *, for_caller: bool = False) -> None:
    try:
        setns(fd, CLONE_NEWNET)
    except OSError as exc:
        if exc.errno == errno_mod.EPERM and for_caller:
            raise ServeElsewhere("no CAP_SYS_ADMIN to enter the pod netns") from None
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
