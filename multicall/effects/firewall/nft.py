"""The nf_tables firewall backend: iptables-nft-compatible rules over a netfilter netlink socket.

Rules of this module:
1. Only the socket lives here; every byte is built and parsed by `multicall.core.firewall.nft`
   (netlink framing, dumps -> tables, batches).
2. Each call opens its own socket, so it talks to the network namespace the calling thread
   is in at that moment (the caller enters the pod's netns first). A backend given a
   `HandedSocket` (a node agent's worker: the socket its caller made inside the pod's netns)
   gets a new descriptor of that socket for each call instead, emptied of replies an earlier
   call left behind; the batch sizing, generation guard and read-back below apply to it
   unchanged.
3. `apply` is one NFNL batch guarded by the ruleset generation id of the snapshot the change
   was planned from, as iptables-nft does: the kernel commits all of it or none of it, and a
   change made meanwhile by anyone makes it refuse (ERESTART) -> FirewallConflict, and the
   engine plans again from a fresh snapshot.
4. A batch is one sendmsg (the kernel aborts a batch that does not end in the same datagram),
   so the socket's send buffer is raised to fit it and the receive buffer to hold one ack per
   message, as iptables-nft does (SO_SNDBUFFORCE / SO_RCVBUFFORCE, a page per message).
5. The kernel's verdict decides: acks arrive only after the commit (or the abort), so all acks
   and no error is success, any error is failure (nothing changed). When replies were lost
   (receive buffer overrun, ENOBUFS) the ruleset is read back: an unchanged generation means
   nothing was committed; the table holding exactly what the change makes means it was.
   A committed batch is never reported as a failure.
"""

from __future__ import annotations

import errno as errno_mod
import os
import select
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from multicall.core.firewall.model import Family, Snapshot, TableChange
from multicall.core.firewall.nft import dump, netlink
from multicall.core.firewall.nft.batch import Batch, build_batch
from multicall.core.firewall.nft.native import TABLE as NATIVE_TABLE
from multicall.core.firewall.nft.native import NativeTable, build_native_batch, from_dump, render
from multicall.core.firewall.proxy_init import apply_change, strip_counters
from multicall.core.firewall.ruleset import Table
from multicall.effects.ns import OWN_NETNS
from multicall.errors import FirewallConflict, FirewallError

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
NLM_F_DUMP_INTR = 0x10
RECV_SIZE = 1 << 18
ATTEMPTS = 5
TIMEOUT = 10.0
PAGE = os.sysconf("SC_PAGE_SIZE")
SO_NETNS_COOKIE = 71  # Linux 5.14; not in Python 3.11's socket module


@dataclass(frozen=True, slots=True)
class HandedSocket:
    """A NETLINK_NETFILTER socket a caller made inside the pod's netns and handed over
    (borrowed: never closed here), and that netns (a descriptor, when known)."""

    fd: int
    netns_fd: int | None = None


class _Socket:
    """A NETLINK_NETFILTER socket with sequence numbers and reply collection."""

    def __init__(self, handed_over: HandedSocket | None = None) -> None:
        self.handed_over = handed_over
        handed = os.dup(handed_over.fd) if handed_over is not None else None
        try:
            if handed is not None:
                self.sock = socket.socket(fileno=handed)
            else:
                self.sock = socket.socket(
                    socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER
                )
        except OSError as exc:
            raise FirewallError(
                f"nf_tables is not available: {exc.strerror}", errno=exc.errno
            ) from exc
        for option in (NETLINK_CAP_ACK, NETLINK_EXT_ACK):
            self.sock.setsockopt(SOL_NETLINK, option, 1)
        try:
            self.sock.bind((0, 0))
        except OSError as exc:
            if handed is None or exc.errno != errno_mod.EINVAL:
                raise
            # A handed socket is bound (port id assigned) by its first use already.
        if handed is not None:
            # One socket serves every operation of the request, so replies an earlier one
            # left queued (the rest of an aborted batch's errors) must not answer this one.
            self.drain()
        self.seq = int(time.time()) & 0x3FFFFFFF

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def send(self, data: bytes) -> None:
        try:
            self.sock.send(data)
        except OSError as exc:
            raise FirewallError(f"nf_tables: send failed: {exc.strerror}", errno=exc.errno) from exc

    def receive(self, *, block: bool = True) -> list[netlink.Message | netlink.NetlinkError]:
        # The kernel answers within the send; a silent socket means something is badly wrong.
        if block and not select.select([self.sock], [], [], TIMEOUT)[0]:
            raise FirewallError(f"nf_tables did not answer within {TIMEOUT:g}s")
        try:
            data = self.sock.recv(RECV_SIZE, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return []
        except OSError as exc:
            raise FirewallError(
                f"nf_tables: receive failed: {exc.strerror}", errno=exc.errno
            ) from exc
        return list(netlink.parse_messages(data))

    def size_buffers(self, batch_bytes: int, ack_room: int | None) -> None:
        """Room for the batch in one datagram and for one ack per message (rule 4).

        The FORCE options need CAP_NET_ADMIN; without it the plain ones (capped by the
        net.core.[rw]mem_max sysctls) are the best there is. A batch that still does not fit
        is refused here, before anything is sent.
        """
        _grow(self.sock, socket.SO_SNDBUF, SO_SNDBUFFORCE, batch_bytes + PAGE)
        if ack_room is not None:
            _grow(self.sock, socket.SO_RCVBUF, SO_RCVBUFFORCE, ack_room)
        room = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - 32
        if batch_bytes > room:
            raise FirewallError(
                f"nf_tables: the batch is {batch_bytes} bytes, more than this netlink socket "
                f"may send ({room} bytes); nothing was changed",
                hint="cnibox needs CAP_NET_ADMIN to raise its socket buffers",
            )

    def drain(self) -> tuple[list[netlink.NetlinkError], bool]:
        """Every reply already queued (errors and acks), and whether some were lost (ENOBUFS)."""
        replies: list[netlink.NetlinkError] = []
        overrun = False
        while True:
            try:
                data = self.sock.recv(RECV_SIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return replies, overrun
            except OSError as exc:
                if exc.errno != errno_mod.ENOBUFS:
                    raise FirewallError(
                        f"nf_tables: receive failed: {exc.strerror}", errno=exc.errno
                    ) from exc
                overrun = True  # the kernel dropped replies; the rest are still queued
                continue
            replies += [
                m for m in netlink.parse_messages(data) if isinstance(m, netlink.NetlinkError)
            ]

    def close(self) -> None:
        self.sock.close()


def _grow(sock: socket.socket, option: int, force: int, size: int) -> None:
    if sock.getsockopt(socket.SOL_SOCKET, option) >= size:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, option, size)


@contextmanager
def _netlink(handed: HandedSocket | None = None) -> Iterator[_Socket]:
    """A fresh socket (a new descriptor of `handed`'s); an OSError anywhere in the body
    becomes a plain FirewallError."""
    try:
        sock = _Socket(handed)
        try:
            yield sock
        finally:
            sock.close()
    except OSError as exc:
        raise FirewallError(
            f"nf_tables: {exc.strerror or os.strerror(exc.errno or 0)}", errno=exc.errno
        ) from exc


def _error(what: str, err: netlink.NetlinkError) -> FirewallError:
    detail = f" ({err.message})" if err.message else ""
    return FirewallError(
        f"nf_tables refused {what}: {os.strerror(err.errno)}{detail}", errno=err.errno
    )


def _genid(sock: _Socket) -> int:
    seq = sock.next_seq()
    sock.send(netlink.getgen_request(seq))
    genid: int | None = None
    while True:
        for reply in sock.receive():
            if isinstance(reply, netlink.NetlinkError):
                if reply.errno:
                    raise _error("the generation id request", reply)
                if reply.seq == seq:
                    if genid is None:
                        raise FirewallError("nf_tables acknowledged no generation id")
                    return genid
            elif (found := netlink.parse_genid(reply)) is not None:
                genid = found


def _dump(
    sock: _Socket, msg: int, family: Family, table: str | None, set_name: str | None = None
) -> list[netlink.Message]:
    """All messages of one dump; FirewallError on error, _Interrupted if it raced a change."""
    seq = sock.next_seq()
    sock.send(netlink.dump_request(msg, family, seq, table, set_name))
    out: list[netlink.Message] = []
    interrupted = False
    while True:
        for reply in sock.receive():
            if isinstance(reply, netlink.NetlinkError):
                if reply.errno == errno_mod.ENOENT:  # no such table: an empty dump
                    return []
                raise _error("a dump request", reply)
            interrupted |= bool(reply.flags & NLM_F_DUMP_INTR)
            if reply.msg_type == netlink.NLMSG_DONE:
                if interrupted:
                    raise _Interrupted
                return out
            out.append(reply)


class _Interrupted(Exception):
    """The ruleset changed while it was being read or written; try again."""


def _read_snapshot(sock: _Socket, family: Family, table: str) -> Snapshot:
    before = _genid(sock)
    chains = [dump.parse_chain(m) for m in _dump(sock, netlink.NFT_MSG_GETCHAIN, family, None)]
    rules = [dump.parse_rule(m) for m in _dump(sock, netlink.NFT_MSG_GETRULE, family, table)]
    if _genid(sock) != before:
        raise _Interrupted
    present = frozenset(c.name for c in chains if c.table == table)
    return Snapshot(dump.build_table(table, chains, rules, family), before, present)


@dataclass(frozen=True, slots=True)
class _Reply:
    """What the kernel answered to one batch, as far as the socket could tell."""

    errors: tuple[netlink.NetlinkError, ...]
    acked: int
    expected: int
    complete: bool  # every ack arrived and none was lost


def _send_batch(sock: _Socket, batch: Batch, *, grow_receive: bool = True) -> _Reply:
    """Send one batch and collect its replies (queued before send() returns: the kernel
    handles a netfilter batch in the sender's context; a short wait covers the rest)."""
    expected = len(batch.requests) - 1  # BEGIN and END are not acknowledged
    sock.size_buffers(len(batch.data), PAGE * (expected + 1) if grow_receive else None)
    sock.send(batch.data)
    errors: list[netlink.NetlinkError] = []
    acked, overrun = 0, False
    deadline = time.monotonic() + TIMEOUT
    while True:
        replies, lost = sock.drain()
        overrun |= lost
        errors += [r for r in replies if r.errno]
        acked += sum(1 for r in replies if not r.errno)
        if errors or overrun or acked >= expected:
            break
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock.sock], [], [], left)[0]:
            break
    return _Reply(tuple(errors), acked, expected, not overrun and acked == expected)


# What the kernel answers for a `match`/`target` expression it cannot load: ENOENT when
# nft_compat or the xt_* module is missing (after its request_module), EOPNOTSUPP when the
# compat layer refuses the extension.
COMPAT_MISSING = frozenset({errno_mod.ENOENT, errno_mod.EOPNOTSUPP})
COMPAT_HINT = (
    "this kernel may lack the x_tables compat support (nft_compat and the xt_* match and "
    'target modules) that iptables-nft rules need; iptables-mode "nftables" programs the '
    "same redirect with native nf_tables expressions only"
)


def _refusal(batch: Batch, errors: tuple[netlink.NetlinkError, ...]) -> FirewallError:
    """The first error the kernel gave (the batch was aborted as a whole). An iptables rule
    (`-A ...`) refused as missing points at the native mode (a kernel without x_tables), in
    the hint an applet prints and in the details of the plugin's CNI error."""
    if any(e.errno == errno_mod.ERESTART for e in errors):
        return FirewallConflict(
            "nf_tables: the ruleset changed since it was read; nothing was changed"
        )
    first = min(errors, key=lambda e: e.seq)
    what = batch.requests.get(first.seq, f"message {first.seq}")
    error = _error(what, first)
    if first.errno in COMPAT_MISSING and what.startswith("-A "):
        # details too: the CNI error JSON (what a runtime shows) carries details, not hints
        return FirewallError(
            error.message, errno=first.errno, hint=COMPAT_HINT, details=COMPAT_HINT
        )
    return error


T = TypeVar("T")


def _read_consistent(
    read: Callable[[_Socket], T],
    what: str,
    table: str | None = None,
    handed: HandedSocket | None = None,
) -> T:
    """`read` on a fresh socket, again when a dump was interrupted by a concurrent change."""
    with _netlink(handed) as sock:
        return _retry_interrupted(sock, read, what, table)


def _retry_interrupted(
    sock: _Socket, read: Callable[[_Socket], T], what: str, table: str | None
) -> T:
    for _ in range(ATTEMPTS):
        try:
            return read(sock)
        except _Interrupted:
            continue
    raise FirewallError(f"{what} kept changing while being read", table=table)


def read_rules(
    family: Family, table: str | None = None, handed: HandedSocket | None = None
) -> list[dump.RuleInfo]:
    """The raw rules (expressions as the kernel holds them) of one family, or one table."""
    return _read_consistent(
        lambda sock: [
            dump.parse_rule(m) for m in _dump(sock, netlink.NFT_MSG_GETRULE, family, table)
        ],
        "the ruleset",
        handed=handed,
    )


def read_native(family: Family, handed: HandedSocket | None = None) -> NativeTable | None:
    """The family's native `linkerd-proxy-init` table (`iptables-mode: nftables`), or None."""

    def read(sock: _Socket) -> NativeTable | None:
        before = _genid(sock)
        chains = _dump(sock, netlink.NFT_MSG_GETCHAIN, family, NATIVE_TABLE)
        rules = _dump(sock, netlink.NFT_MSG_GETRULE, family, NATIVE_TABLE)
        sets = [
            dump.parse_set(m) for m in _dump(sock, netlink.NFT_MSG_GETSET, family, NATIVE_TABLE)
        ]
        elements = [
            dump.parse_set_elements(m)
            for info in sets
            if info.table == NATIVE_TABLE
            for m in _dump(sock, netlink.NFT_MSG_GETSETELEM, family, NATIVE_TABLE, info.name)
        ]
        if _genid(sock) != before:
            raise _Interrupted
        return from_dump(
            family,
            [dump.parse_chain(m) for m in chains],
            [dump.parse_rule(m) for m in rules],
            sets,
            elements,
        )

    return _read_consistent(read, f"the {NATIVE_TABLE} table", NATIVE_TABLE, handed)


def apply_native(tables: tuple[NativeTable, ...], handed: HandedSocket | None = None) -> None:
    """Program every family's native table in one batch (native.py rule 4). Its result does
    not depend on what was there, so it needs no generation guard and no retry; when acks
    were lost (rule 5) the tables read back say whether it was committed."""
    with _netlink(handed) as sock:
        batch = build_native_batch(tables, sock.next_seq())
        sock.seq = batch.last_seq
        reply = _send_batch(sock, batch)
        if reply.errors:
            raise _refusal(batch, reply.errors)
        if reply.complete:
            return
    for table in tables:
        now = read_native(table.family, handed)
        if render(now, table.family) != render(table, table.family):
            raise FirewallError(
                f"nf_tables replies were lost ({reply.acked} of {reply.expected} acks) and "
                f"the {table.family.value} {NATIVE_TABLE} table is not what was sent",
                table=NATIVE_TABLE,
            )


def _netns_id(sock: _Socket) -> tuple[int, int]:
    """The netns `sock` talks to, as an identity never given to another netns.

    Its cookie (SO_NETNS_COOKIE): unlike the nsfs inode number, which the kernel hands to the
    next netns once one is freed, so that a long-lived backend (a node agent's, a repair
    controller's, a test's) took a new pod's netns for the previous one and planned against a
    generation it never read (a false FirewallConflict). A socket the caller handed over (an
    agent worker) has the pod netns's cookie, where it was made. Kernels before 5.14: the
    inode of that netns (the handed one's, else this thread's)."""
    try:
        return (0, int.from_bytes(sock.sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8),
                                  sys.byteorder))  # fmt: skip
    except OSError:
        handed = sock.handed_over.netns_fd if sock.handed_over is not None else None
        st = os.fstat(handed) if handed is not None else os.stat(OWN_NETNS)
        return (st.st_dev, st.st_ino)


@dataclass(slots=True)
class _OwnCommits:
    """This backend's own commits in one netns since generation `since`: each moved the
    generation by one and touched only its (family, table), so a snapshot of another table
    taken at `since` is still exact at `now` (dual-stack ADDs need no second read)."""

    netns: tuple[int, int]
    since: int
    now: int
    touched: set[tuple[Family, str]] = field(default_factory=set)


class NftBackend:
    """iptables-nft-compatible rules in the `ip`/`ip6` nf_tables families (FirewallBackend).

    `receive_buffer` (bytes) overrides the ack buffer sizing of rule 4; tests use a tiny
    one to make the kernel drop replies and prove the read-back verdict of rule 5.
    """

    name = "nft"

    def __init__(
        self, *, receive_buffer: int | None = None, handed: HandedSocket | None = None
    ) -> None:
        self.receive_buffer = receive_buffer
        self.handed = handed  # the caller's socket in the pod netns (rule 2)
        self._own: _OwnCommits | None = None

    def dump(self, family: Family, table: str = "nat") -> Table:
        return self.snapshot(family, table).table

    def snapshot(self, family: Family, table: str = "nat") -> Snapshot:
        return _read_consistent(
            lambda sock: _read_snapshot(sock, family, table), f"the {table} table", table,
            self.handed,
        )  # fmt: skip

    def apply(self, family: Family, change: TableChange, base: Snapshot | None = None) -> None:
        table = change.table
        with _netlink(self.handed) as sock:
            if base is None:
                base = _retry_interrupted(
                    sock, lambda s: _read_snapshot(s, family, table), f"the {table} table", table
                )
            netns = _netns_id(sock)
            version = self._current_version(family, table, base, netns)
            batch = build_batch(change, base.present, family, version, sock.next_seq())
            sock.seq = batch.last_seq
            if self.receive_buffer is not None:
                sock.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
            reply = _send_batch(sock, batch, grow_receive=self.receive_buffer is None)
            if reply.errors:
                raise _refusal(batch, reply.errors)
            if not reply.complete:
                self._read_back_verdict(
                    sock, family, change, base=base, version=version, reply=reply
                )
                return
        self._committed(family, table, base, version, netns)

    def _current_version(
        self, family: Family, table: str, base: Snapshot, netns: tuple[int, int]
    ) -> int:
        if base.version is None:
            raise FirewallError("an nf_tables change needs a snapshot read by the nft backend")
        own = self._own
        if (
            own is not None
            and base.version == own.since
            and (family, table) not in own.touched
            and own.netns == netns
        ):
            return own.now
        return base.version

    def _committed(
        self, family: Family, table: str, base: Snapshot, version: int, netns: tuple[int, int]
    ) -> None:
        own = self._own
        if own is not None and version == own.now and base.version == own.since:
            own.now += 1
            own.touched.add((family, table))
        else:
            assert base.version is not None
            self._own = _OwnCommits(netns, base.version, version + 1, {(family, table)})

    def _read_back_verdict(
        self,
        sock: _Socket,
        family: Family,
        change: TableChange,
        *,
        base: Snapshot,
        version: int,
        reply: _Reply,
    ) -> None:
        """Replies were lost: the kernel's state says whether the batch was committed."""
        self._own = None  # the generation after this batch is not known for sure
        now = _retry_interrupted(
            sock, lambda s: _read_snapshot(s, family, change.table), "the ruleset", change.table
        )
        lost = f"{reply.acked} of {reply.expected} acks arrived"
        if now.version == version:
            raise FirewallError(
                f"nf_tables did not commit the batch and its error reply was lost ({lost}); "
                "nothing was changed",
                table=change.table,
            )
        if strip_counters(now.table) == strip_counters(apply_change(base.table, change)):
            return  # committed: the table is exactly what the change makes
        raise FirewallConflict(
            f"nf_tables: the ruleset changed while the batch was applied ({lost})",
            table=change.table,
        )

    def has_rules(self, family: Family) -> bool:
        return bool(read_rules(family, handed=self.handed))

    def available(self) -> bool:
        """Whether this kernel speaks nf_tables here (for `plain` mode detection)."""
        try:
            with _netlink(self.handed) as sock:
                _genid(sock)
        except FirewallError:
            return False
        return True
