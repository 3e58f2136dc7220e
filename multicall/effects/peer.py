"""What the kernel says about a node agent's caller and the descriptors it handed over: the
peer process of a unix socket (its pidfd, its /proc/PID/status and user namespace) and the
family, protocol and network namespace of a socket descriptor.

Rules of this module:
1. The peer is pinned by a pidfd before /proc is read: SO_PEERPIDFD (Linux 6.5+) names the
   process that connected, whatever happened since. Older kernels: pidfd_open(2) of the
   SO_PEERCRED pid, which is only as good as that pid still being the connecting process
   (docs/agent.md "Who may use the agent": the residual race).
2. /proc/PID is opened first and the pidfd asked afterwards whether the process still lives:
   a pid is not reused while its process exists (even as a zombie), so a live pidfd after the
   open means the directory is that process's, and everything is read relative to it.
3. `Peer.status`/`Peer.userns` are None when the agent cannot see the process (it has no pid
   in the agent's pid namespace, or /proc refuses it: ns/ needs ptrace read access); the
   caller's policy (agent/authority.py) decides what an unseen caller may have.
Nothing here is kept between calls: each function owns and closes what it opens.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
import struct
from dataclasses import dataclass

from multicall.core.proc_status import MAX_STATUS

SO_PEERPIDFD = 77  # asm-generic/socket.h, Linux 6.5
SO_PROTOCOL = 38
SO_DOMAIN = 39
SIOCGSKNS = 0x894C  # linux/sockios.h: an fd of the socket's network namespace


class PeerGone(Exception):
    """The process that connected exited before it could be looked at."""


@dataclass(frozen=True, slots=True)
class Peer:
    """The connecting process as the agent sees it."""

    pid: int  # in the agent's pid namespace; 0 when it has none there
    uid: int  # SO_PEERCRED's (effective, at connect time)
    pinned: bool  # True: SO_PEERPIDFD named the process (no pid-reuse window)
    status: str | None  # /proc/PID/status text, None when not visible
    userns: tuple[int, int] | None  # (st_dev, st_ino) of /proc/PID/ns/user, None when not visible


def peer(conn: socket.socket) -> Peer:
    """The process at the other end of the unix socket `conn` (rules 1-3). PeerGone when it
    exited before its /proc entry was read."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    pidfd, pinned = _pidfd(conn, pid)
    if pidfd is not None and pid <= 0:
        # A pidfd (SO_PEERPIDFD) of a process with no pid in this pid namespace (an agent
        # in a pid namespace of its own): it has no /proc entry here, so it is not seen.
        os.close(pidfd)
        pidfd = None
    if pidfd is None:
        return Peer(pid, uid, pinned, None, None)
    try:
        try:
            proc = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise PeerGone from None
        try:
            if not _alive(pidfd):
                raise PeerGone
            status = _read_status(proc)
            try:
                st = os.stat("ns/user", dir_fd=proc)
                userns: tuple[int, int] | None = (st.st_dev, st.st_ino)
            except PermissionError:  # no ptrace read access to it: not visible (rule 3)
                userns = None
            return Peer(pid, uid, pinned, status, userns)
        finally:
            os.close(proc)
    finally:
        os.close(pidfd)


def _pidfd(conn: socket.socket, pid: int) -> tuple[int | None, bool]:
    try:
        return conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD), True
    except OSError as exc:
        if exc.errno != errno.ENOPROTOOPT:
            raise
    if pid <= 0:
        return None, False
    try:
        return os.pidfd_open(pid), False
    except ProcessLookupError:
        raise PeerGone from None


def _alive(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; the agent may not signal it
    return True


def _read_status(proc: int) -> str:
    try:
        fd = os.open("status", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    except (FileNotFoundError, ProcessLookupError):
        raise PeerGone from None
    try:
        data = os.read(fd, MAX_STATUS)
    except ProcessLookupError:
        raise PeerGone from None
    finally:
        os.close(fd)
    return data.decode("ascii", "replace")


def ns_of(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


@dataclass(frozen=True, slots=True)
class SocketKind:
    """What a handed socket is: its family, protocol and network namespace."""

    domain: int
    protocol: int
    netns: tuple[int, int] | None  # (st_dev, st_ino) of its netns; None when SIOCGSKNS refused


def socket_kind(fd: int) -> SocketKind:
    """Family, protocol and network namespace of the socket `fd` (borrowed, left open).
    OSError ENOTSOCK when it is not a socket."""
    domain = _sockopt(fd, SO_DOMAIN)
    protocol = _sockopt(fd, SO_PROTOCOL)
    try:
        nsfd = fcntl.ioctl(fd, SIOCGSKNS)
    except PermissionError:  # needs CAP_NET_ADMIN over that netns
        return SocketKind(domain, protocol, None)
    try:
        st = os.fstat(nsfd)
        return SocketKind(domain, protocol, (st.st_dev, st.st_ino))
    finally:
        os.close(nsfd)


def _sockopt(fd: int, option: int) -> int:
    # socket.socket(fileno=...) would probe the descriptor itself; a dup keeps `fd` open.
    dup = os.dup(fd)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, dup)
    except OSError:
        os.close(dup)
        raise
    try:
        return sock.getsockopt(socket.SOL_SOCKET, option)
    finally:
        sock.close()
