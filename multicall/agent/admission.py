"""Admission: the node agent's parent reads a caller's whole request before the request gets
a place in the queue or a worker (agent/server.py rule 6).

The launcher sends its request at once, before it waits for ACCEPT (build/agent_client.c
`agent_try`), so a real caller's request is usually complete in the socket when the parent
accepts the connection. A connection that does not deliver a whole request within
ADMISSION_DEADLINE (idle, or dripping bytes) costs the parent one descriptor and a buffer
for that long, never a worker, a fork or a queue place: the audit's 1,266 idle connections
delayed a real ADD 49.8 s and forked 265 workers when each connection took a worker first.

Pure except for the reads: the parent's poll loop decides when to read and what to do with
the outcome.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field

from multicall.core import agent_protocol as proto
from multicall.core.cni.skel import log_fields

# The launcher's own deadline for sending its request (AGENT_ACCEPT_MS, counted from its
# connect, which precedes the accept): a caller that would still be sending after it has
# given up and runs the one-shot path.
ADMISSION_DEADLINE = 2.0
# Connections whose request is not complete yet, at once; beyond, the oldest is dropped (it
# had the longest to send). A real request is read whole at its accept, so it is never
# among the oldest for long.
MAX_READING = 128
# Of those, per calling process (SO_PEERCRED's pid): one launcher makes one connection.
MAX_READING_PER_PEER = 4
# Bytes of requests the parent holds at once, being read or queued; a request whose header
# announces more than what is left is handed back (`overloaded`) before its body is read.
MAX_BUFFERED = 64 << 20
# A connection being read holds its socket and up to this many descriptors of the caller's.
FDS_PER_REQUEST = 1 + len(proto.FD_ORDER)


class Refused(Exception):
    """The parent hands this connection back without serving it; `reason` is the fallback
    reason (metrics, the caller's log)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


@dataclass(slots=True)
class Admitted:
    """A complete, well-formed request: what a worker needs to serve it."""

    conn: socket.socket
    accepted_at: float
    data: bytes  # the request's bytes as sent (header, strings, stdin)
    fds: list[int]  # the caller's descriptors, in flag order; owned until handed on
    command: str
    # The pod's log fields (ContainerID, Namespace, Pod) for the agent's line about this
    # request (core/agent_log.py), read now: the parent never parses the request again.
    pod: dict[str, str] = field(default_factory=dict)

    def close(self) -> None:
        close_fds(self.fds)
        self.conn.close()


@dataclass(slots=True)
class Pending:
    """A connection whose request is being read (non-blocking, as bytes arrive)."""

    conn: socket.socket
    peer: int  # the caller's pid (0 when it is not visible in the agent's pid namespace)
    accepted_at: float = field(default_factory=time.monotonic)
    head: bytearray = field(default_factory=bytearray)
    body: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)
    header: proto.Header | None = None

    @property
    def reserved(self) -> int:
        """Bytes this request counts against MAX_BUFFERED (once its header announced them)."""
        return proto.HEADER.size + self.header.body_len if self.header is not None else 0

    def read(self, budget: int) -> Admitted | None:
        """Read what the socket has now; the request once it is whole, None while more is to
        come. `budget`: the bytes the body may take. Refused (with the caller's descriptors
        closed) for a request that cannot be served; the connection stays the caller's."""
        try:
            return self._read(budget)
        except proto.ProtocolError as exc:
            close_fds(self.fds)
            raise Refused("bad request", str(exc)) from None
        except Refused:
            close_fds(self.fds)
            raise
        except OSError as exc:
            close_fds(self.fds)
            raise Refused("caller gone", exc.strerror or "") from None

    def _read(self, budget: int) -> Admitted | None:
        while self.header is None:
            want = proto.HEADER.size - len(self.head)
            try:
                chunk, fds, flags, _ = socket.recv_fds(
                    self.conn, want, len(proto.FD_ORDER), socket.MSG_CMSG_CLOEXEC
                )
            except (BlockingIOError, InterruptedError):
                return None
            self.fds += fds
            if flags & socket.MSG_CTRUNC:  # descriptors beyond the protocol's, or EMFILE
                raise Refused("descriptors lost", "the caller's descriptors did not fit")
            if not chunk:
                raise proto.ProtocolError("connection closed in the header")
            self.head += chunk
            if len(self.head) == proto.HEADER.size:
                self.header = proto.parse_header(bytes(self.head))
                if self.reserved > budget:
                    raise Refused("overloaded", "requests being read or queued fill the buffer")
        while len(self.body) < self.header.body_len:
            try:
                chunk = self.conn.recv(min(self.header.body_len - len(self.body), 1 << 20))
            except (BlockingIOError, InterruptedError):
                return None
            if not chunk:
                raise proto.ProtocolError("connection closed in the body")
            self.body += chunk
        request = proto.parse_body(self.header, bytes(self.body), self.fds)
        return Admitted(
            self.conn,
            self.accepted_at,
            bytes(self.head + self.body),
            self.fds,
            request.command or "unknown",
            log_fields(request.env),
        )

    def close(self) -> None:
        close_fds(self.fds)
        self.conn.close()


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
