"""A node agent's worker process, from its fork to its exit: it drops what the parent owns,
prepares for a request (agent/server.py rule 4), serves it, and serves another only when the
request left the process as it was forked (no new descriptor, no other thread, and the
applet's `serve` says so). The parent never returns into this code, nor this into the loop.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NoReturn

from multicall.core import agent_protocol as proto

Log = Callable[[str, str], None]  # (level, message)
Report = Callable[[str, dict[str, object]], None]  # (kind, data): "S", "D", "I" (rule 3)
# A question to the parent's pod cache and its answer, or None (agent/pod_cache.py rule 3).
Ask = Callable[[dict[str, object]], dict[str, object] | None]


@dataclass(frozen=True, slots=True)
class Again:
    """A served request left this worker fit for another (agent/server.py rule 4)."""

    warm: object  # what `Prepare` gets before the next request
    kept: frozenset[int] = frozenset()  # descriptors it leaves open on purpose (a warm one)


# A worker's job: serve one request the parent read whole (agent/server.py rule 6), answering
# on its connection and reporting through the callable; `Again` when this process may serve
# another request (rule 4), None when it must exit.
Serve = Callable[[socket.socket, proto.Request, Report, Ask], Again | None]
# What a new worker does before it waits for its request, with the "warm" values of the
# latest reports, merged by key (agent/warm.py: dial the API server the previous request
# used, load the x_tables extensions of its family).
Prepare = Callable[[object], None]


@dataclass(frozen=True, slots=True)
class WorkerJob:
    """What a worker is forked with: how it serves and prepares, the parent's warm value at
    the fork, and how many requests it may serve."""

    serve: Serve
    prepare: Prepare | None
    warm: object
    requests: int


def become_worker(
    ctl: socket.socket, parent_fds: list[int], job: WorkerJob, log: Log
) -> NoReturn:  # pragma: no cover - in the child
    """Drop everything of the parent's, wait for a connection, serve it, maybe another, exit."""
    code = 0
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)  # the parent decides when workers stop
        for fd in parent_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        # No collection during a request; between requests only what this process made:
        # walking the objects inherited from the parent would copy-on-write them all.
        gc.disable()
        gc.freeze()
        warm: object = job.warm
        ctl.setblocking(True)
        # Questions to the parent are numbered across this worker's requests: a late answer
        # to an earlier request's question is never taken for a later one's.
        asked = itertools.count(1)
        for served in range(job.requests):
            if job.prepare is not None and warm is not None:
                with contextlib.suppress(Exception):
                    job.prepare(warm)
            if served:
                _report(ctl, "I", {})  # prepared: ready for the next request
            again = _serve_one(ctl, job.serve, log, asked)
            if again is None:
                break
            gc.collect()
            gc.freeze()
            warm = again.warm
    except BaseException as exc:  # noqa: BLE001 - a worker never returns into the loop
        with contextlib.suppress(Exception):
            log("error", f"worker {os.getpid()} failed: {type(exc).__name__}: {exc}")
        code = 70
    os._exit(code)


def _serve_one(
    ctl: socket.socket, serve: Serve, log: Log, asked: Iterator[int]
) -> Again | None:  # pragma: no cover - in the child
    """Wait for a request and serve it; `Again` when this process may serve another (rule
    4), with what to prepare it with. The parent sends "R" with the caller's connection, a
    memfd holding the request's bytes and the caller's descriptors (agent/server.py rule 6)."""
    msg, fds, _flags, _addr = socket.recv_fds(ctl, 16, 2 + len(proto.FD_ORDER))
    if msg != b"R" or len(fds) < 2:
        for fd in fds:
            os.close(fd)
        return None
    before = _open_fds()
    conn = socket.socket(fileno=fds[0])
    try:
        with os.fdopen(fds[1], "rb") as memfd:  # bounded: the parent read it under the bounds
            data = memfd.read()
        try:
            request = proto.decode_request(data, fds[2:])
        except proto.ProtocolError:  # the parent checked it: only a bug gets here
            for fd in fds[2:]:
                os.close(fd)
            _report(ctl, "D", {"fallback": "bad request"})
            return None

        def ask(question: dict[str, object]) -> dict[str, object] | None:
            from multicall.agent.pod_cache import ask_parent

            return ask_parent(ctl, question, next(asked))

        again = serve(conn, request, lambda kind, data: _report(ctl, kind, data), ask)
    finally:
        conn.close()
    if again is None:
        return None
    if threading.active_count() != 1:
        log("debug", f"worker {os.getpid()} exits: its request left a thread")
        return None
    if left := _open_fds() - before - again.kept:
        log("debug", f"worker {os.getpid()} exits: its request left fds {sorted(left)}")
        return None
    return again


def _report(ctl: socket.socket, kind: str, data: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        ctl.send(kind.encode() + json.dumps(data).encode())


def _open_fds() -> set[int]:
    """This process's open descriptors (not the one the listing itself used: closed by the
    time it is checked)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
        except OSError:
            continue
        fds.add(int(name))
    return fds
