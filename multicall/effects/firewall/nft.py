"""The nf_tables firewall backend: iptables-nft-compatible rules over a netfilter netlink socket.

Rules of this module:
1. Only the socket lives here; every byte is built and parsed by `multicall.core.firewall.nft`
   (netlink framing, dumps -> tables, batches).
2. Each call opens its own socket, so it talks to the network namespace the calling thread
   is in at that moment (the caller enters the pod's netns first).
3. `apply` is one NFNL batch guarded by the ruleset generation id, as iptables-nft does:
   the kernel commits all of it or none of it, and a concurrent change makes it retry
   against the new state instead of acting on a stale one.
"""

from __future__ import annotations

import errno as errno_mod
import os
import select
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from multicall.core.firewall.model import Family, TableChange
from multicall.core.firewall.nft import dump, netlink
from multicall.core.firewall.nft.batch import Batch, build_batch
from multicall.core.firewall.ruleset import Table
from multicall.errors import FirewallError

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
NLM_F_DUMP_INTR = 0x10
RECV_SIZE = 1 << 18
ATTEMPTS = 5
TIMEOUT = 10.0


class _Socket:
    """A NETLINK_NETFILTER socket with sequence numbers and reply collection."""

    def __init__(self) -> None:
        try:
            self.sock = socket.socket(
                socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER
            )
        except OSError as exc:
            raise FirewallError(
                f"nf_tables is not available: {exc.strerror}", errno=exc.errno
            ) from exc
        for option in (NETLINK_CAP_ACK, NETLINK_EXT_ACK):
            self.sock.setsockopt(SOL_NETLINK, option, 1)
        self.sock.bind((0, 0))
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

    def close(self) -> None:
        self.sock.close()


@contextmanager
def _netlink() -> Iterator[_Socket]:
    sock = _Socket()
    try:
        yield sock
    finally:
        sock.close()


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


def _dump(sock: _Socket, msg: int, family: Family, table: str | None) -> list[netlink.Message]:
    """All messages of one dump; FirewallError on error, _Interrupted if it raced a change."""
    seq = sock.next_seq()
    sock.send(netlink.dump_request(msg, family, seq, table))
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


def _read_table(sock: _Socket, family: Family, table: str) -> Table:
    before = _genid(sock)
    chains = [dump.parse_chain(m) for m in _dump(sock, netlink.NFT_MSG_GETCHAIN, family, None)]
    rules = [dump.parse_rule(m) for m in _dump(sock, netlink.NFT_MSG_GETRULE, family, table)]
    if _genid(sock) != before:
        raise _Interrupted
    return dump.build_table(table, chains, rules, family)


def _chain_names(sock: _Socket, family: Family, table: str) -> frozenset[str]:
    chains = (dump.parse_chain(m) for m in _dump(sock, netlink.NFT_MSG_GETCHAIN, family, None))
    return frozenset(c.name for c in chains if c.table == table)


def _commit(sock: _Socket, batch: Batch) -> None:
    """Send one batch; the kernel answers every message before send() returns."""
    sock.send(batch.data)
    acked = 0
    while replies := sock.receive(block=False):
        for reply in replies:
            if not isinstance(reply, netlink.NetlinkError):
                continue
            if reply.errno == errno_mod.ERESTART:  # the generation id moved under us
                raise _Interrupted
            if reply.errno:
                raise _error(batch.requests.get(reply.seq, f"message {reply.seq}"), reply)
            acked += 1
    if acked != len(batch.requests) - 1:
        raise FirewallError(
            f"nf_tables acknowledged {acked} of {len(batch.requests) - 1} batch messages"
        )


T = TypeVar("T")


def _read_consistent(read: Callable[[_Socket], T], what: str, table: str | None = None) -> T:
    """`read` on a fresh socket, again when a dump was interrupted by a concurrent change."""
    with _netlink() as sock:
        for _ in range(ATTEMPTS):
            try:
                return read(sock)
            except _Interrupted:
                continue
    raise FirewallError(f"{what} kept changing while being read", table=table)


def read_rules(family: Family, table: str | None = None) -> list[dump.RuleInfo]:
    """The raw rules (expressions as the kernel holds them) of one family, or one table."""
    return _read_consistent(
        lambda sock: [
            dump.parse_rule(m) for m in _dump(sock, netlink.NFT_MSG_GETRULE, family, table)
        ],
        "the ruleset",
    )


def read_chains(family: Family) -> list[dump.ChainInfo]:
    """The chains of every table of one family, as the kernel reports them."""
    return _read_consistent(
        lambda sock: [
            dump.parse_chain(m) for m in _dump(sock, netlink.NFT_MSG_GETCHAIN, family, None)
        ],
        "the ruleset",
    )


class NftBackend:
    """iptables-nft-compatible rules in the `ip`/`ip6` nf_tables families (FirewallBackend)."""

    name = "nft"

    def dump(self, family: Family, table: str = "nat") -> Table:
        return _read_consistent(
            lambda sock: _read_table(sock, family, table), f"the {table} table", table
        )

    def apply(self, family: Family, change: TableChange) -> None:
        with _netlink() as sock:
            for _ in range(ATTEMPTS):
                genid = _genid(sock)
                existing = _chain_names(sock, family, change.table)
                batch = build_batch(change, existing, family, genid, sock.next_seq())
                sock.seq = batch.last_seq
                try:
                    _commit(sock, batch)
                    return
                except _Interrupted:
                    continue
        raise FirewallError(
            f"the {change.table} table kept changing while being written", table=change.table
        )

    def has_rules(self, family: Family) -> bool:
        return bool(read_rules(family))

    def available(self) -> bool:
        """Whether this kernel speaks nf_tables here (for `plain` mode detection)."""
        try:
            with _netlink() as sock:
                _genid(sock)
        except FirewallError:
            return False
        return True
