"""nf_tables change notifications of one pod's network namespace, for the node agent's
keeper (agent/keeper.py): a NETLINK_NETFILTER socket made inside the netns and subscribed to
the NFNLGRP_NFTABLES multicast group, on which the kernel announces every committed change
to that netns's nf_tables ruleset (iptables-nft's tables included). Nothing is polled: the
keeper waits on the socket and dumps the tables only after the kernel said they changed.

Rules of this module:
1. The socket belongs to the netns it was made in, for its whole life (netlink sockets are
   bound to their creator's netns), so the thread enters the netns only to create it.
2. What the messages say is not parsed: any message, or an overrun (ENOBUFS: more changes
   than the buffer held), means "dump and compare"; `drain` reads them all without blocking.
3. The socket is the caller's to close (`close`); nothing is kept at module level.
"""

from __future__ import annotations

import errno
import socket

NETLINK_NETFILTER = 12
NFNLGRP_NFTABLES = 7
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
RECEIVE_BUFFER = 256 * 1024  # a burst of changes beyond this only sets the overrun flag
READ_SIZE = 64 * 1024
MAX_READS = 64  # per drain: a ruleset changing without pause cannot hold the keeper here


class NftEvents:
    """The nf_tables notifications of the netns this object was made in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def subscribe(cls, netns_fd: int, netns_path: str) -> NftEvents:
        """A subscribed socket made inside the netns open as `netns_fd` (never this thread's
        own: NetnsError). OSError when the kernel refuses it."""
        from multicall.effects.ns import NetnsRef, entered_netns

        with entered_netns(NetnsRef(netns_path, fd=netns_fd)):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            sock.bind((0, 0))
            sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, NFNLGRP_NFTABLES)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return cls(sock)

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> bool:
        """Read every pending notification; True when there was one (or an overrun)."""
        changed = False
        for _ in range(MAX_READS):
            try:
                data = self.sock.recv(READ_SIZE)
            except BlockingIOError:
                return changed
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    changed = True
                    continue
                raise
            changed = changed or bool(data)
        return changed

    def close(self) -> None:
        self.sock.close()
