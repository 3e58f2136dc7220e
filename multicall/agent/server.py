"""The node agent's parent process: the listening socket and who may use it (admission), a
pool of pre-forked workers and the queue in front of it, cancellation, deadlines, the admin
HTTP endpoints, SIGTERM and the drain (docs/agent.md). A worker's own life after the fork is
agent/worker_process.py's; what it does with a request, agent/worker.py's.

It is one file (~950 lines) because it is one single-threaded poll loop whose state (the
workers, their client connections, the queue, the draining flag) every part reads and
changes on each turn; split, each part would reach into the others' state.

One single-threaded parent runs a poll loop; it never runs a request itself. Each request
goes to a worker forked earlier from the warm parent (every module already imported), which
serves it in its own process: a crash or a hang in one request cannot reach the parent or
any other request, and the fork is off the request's critical path. A worker serves up to
--worker-requests requests one after the other when its last one left it as it was forked
(rule 4); otherwise it exits after one.

Rules of this module:
1. The parent owns: the listening socket (bound under a temporary name, then renamed over
   the socket path, so an upgrade takes over without a window), one control socketpair per
   worker, the connections whose request it is reading (rule 6), and its own copy of each
   served client connection (only to notice a caller that went away: once the request is
   handed on it never reads or writes it). The admin endpoints are the project's admin server
   (effects/admin_server.py, on its own threads); what they show is read on the loop.
2. A client that hangs up before its worker reported a result gets that worker SIGKILLed;
   so does a worker past the request deadline. Either way the client sees EOF and (if it is
   still there) runs the one-shot path; a worker that dies leaves nothing half-applied,
   because each firewall change is one kernel transaction.
3. Workers report to the parent over their control socket: "S" + JSON when a request was
   accepted, "D" + JSON when its reply was sent, "I" when it waits for another request.
   Metrics come from those reports. "Q" + JSON is a question to the node's pod cache, which
   the parent holds and answers at once with "A" + JSON (agent/pod_cache.py).
4. A worker takes another request only when its `serve` said it may (the applet knows what
   a request leaves behind: x_tables extensions, another netns) and the request left no new
   descriptor and no other thread; between requests it collects its own garbage (never the
   objects inherited from the parent: frozen at fork) and prepares for the next one.
5. At most --max-workers (default: twice the CPUs, at least 4) serve at once; callers beyond
   wait in the parent's queue, oldest first (their time there counts against
   --request-timeout): a burst costs a few forks, not one per pod, and does not split the
   CPUs between more processes than they can run. When every serving worker has been on its
   request for STUCK seconds (waiting on a slow API server, not using a CPU), one more may
   start, so a slow server does not hold the queue.
6. Admission before work (agent/admission.py): the parent reads each request whole, without
   blocking, within ADMISSION_DEADLINE of its accept, and only then answers ACCEPT and gives
   it a queue place or a worker; the worker gets the request's bytes (a memfd) and the
   caller's descriptors with the connection. A caller that is idle, drips its bytes or sends
   a malformed request is handed back before it costs a worker or a fork. Out of
   descriptors (EMFILE), the oldest incomplete connection is dropped, or accepting pauses
   for ACCEPT_BACKOFF; the log says so at most once per LOG_INTERVAL.
7. The socket path is checked every SOCKET_CHECK: removed, the agent listens again (nobody
   else serves it); taken over by another agent, /readyz turns not ready (the other one
   serves the node) until the path is free again. A failure to remove the socket at
   SIGTERM (a read-only directory) is logged; the drain goes on.
8. Every request read whole ends in one line on the agent's stderr (`kubectl logs`), with
   the pod's fields, the command, the outcome (ok, the CNI error code, or handed back and
   why) and the time since its accept (core/agent_log.py): from the worker's report, its
   death, or the parent's own hand-back. A flood of requests is cut to core/agent_log.py's
   rate; the next line written says how many were not.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import secrets
import select
import signal
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from multicall.agent import admission
from multicall.agent.admission import Admitted, Pending, Refused
from multicall.agent.worker_process import Prepare, Serve, WorkerJob, become_worker
from multicall.core.agent_log import LineBudget, Outcome, request_line
from multicall.core.agent_metrics import Metrics, render
from multicall.core.agent_protocol import accept_frame, fallback_frame
from multicall.core.kube.pod_cache import CacheMetrics

if TYPE_CHECKING:
    from multicall.agent.pod_cache import CacheFeed
    from multicall.effects.admin_server import AdminServer


T = TypeVar("T")


class FieldLog(Protocol):
    """The agent's logger (effects/log.py `Logger.log`): a line at a level, with fields."""

    def __call__(self, level: str, message: str, **fields: str) -> None: ...


POLLRDHUP = getattr(select, "POLLRDHUP", 0x2000)
LOOP_ANSWER = 2.0  # seconds an admin request waits for the loop to render or answer
TEXT = "text/plain; charset=utf-8"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_REPORT = 256 * 1024
# After a caller hung up, how long its worker may still report a result it already sent.
CALLER_GRACE = 0.05
# A request still running after this is taken to be waiting, not computing (rule 5).
STUCK = 0.2
# Out of descriptors with nothing to drop: how long the listener rests (rule 6).
ACCEPT_BACKOFF = 0.1
# A repeated trouble (EMFILE, a fork that fails, callers handed back at admission) is logged
# at most once per this many seconds, with the count of the ones not logged.
LOG_INTERVAL = 10.0
SOCKET_CHECK = 1.0  # seconds between checks that the socket path is still this agent's
# accept() errors that mean "out of a resource now", not "this caller": wait, do not spin.
OUT_OF = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Descriptors the parent keeps for itself beyond its connections: its own (stdio, poll,
# wake pipe, admin server threads and their sockets) and a worker's socketpair and memfd.
RESERVED_FDS = 32


class MetricsFeed(Protocol):
    """Another process's metrics the loop reads as they arrive and /metrics includes, and
    its questions to the pod cache (the keeper's: agent/keeper_process.py rules 4-5)."""

    def fileno(self) -> int: ...
    def receive(self) -> None: ...
    def render(self) -> str: ...
    def channel_fd(self) -> int: ...
    def detach_channel(self) -> int: ...
    def answer(self, answerer: Callable[[bytes], bytes]) -> None: ...


def default_max_workers() -> int:
    return max(4, 2 * (os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class ServerOptions:
    socket_path: str
    admin_addr: str  # "HOST:PORT" or "" (no admin server)
    workers: int = 4  # idle, pre-forked
    max_requests: int = 256  # in flight and queued at once; beyond, callers fall back
    max_workers: int = 4  # serving at once; beyond, callers wait in the queue (rule 5)
    worker_requests: int = 64  # requests one worker may serve (rule 4)
    request_timeout: float = 60.0
    shutdown_grace: float = 25.0
    build: str = ""


@dataclass
class Worker:
    pid: int
    ctl: socket.socket
    state: str = "idle"  # idle -> busy -> done (reported, or killed) [-> idle: rule 4]
    conn: socket.socket | None = None
    watching: bool = False  # the parent polls conn for the caller hanging up
    accepted_at: float = 0.0
    dispatched_at: float = 0.0
    caller_gone_at: float = 0.0
    command: str = ""
    killed: str = ""
    pod: dict[str, str] | None = None  # the request's log fields (rule 8)


class Server:
    def __init__(
        self,
        options: ServerOptions,
        log: FieldLog,
        serve: Serve,
        prepare: Prepare | None = None,
        feed: MetricsFeed | None = None,
    ) -> None:
        self.options = options
        self.feed = feed
        self.log = log
        self.serve = serve
        self.prepare = prepare
        self.warm: object = None
        self.metrics = Metrics()
        # The node's pod cache (agent/pod_cache.py): set before bind(); workers ask it.
        self.pod_cache: CacheFeed | None = None
        self.cache_metrics = CacheMetrics()
        self.workers: dict[int, Worker] = {}  # by control socket fd
        self.by_conn: dict[int, Worker] = {}  # by the parent's client-connection fd
        self.poll = select.poll()
        self.listener: socket.socket | None = None
        self.admin: AdminServer | None = None
        self.jobs: deque[Callable[[], None]] = deque()  # from admin threads (on_loop)
        self.reading: dict[int, Pending] = {}  # by connection fd, oldest first (rule 6)
        self.queue: deque[Admitted] = deque()
        self.socket_id: tuple[int, int] | None = None
        self.socket_lost = False  # the path is another agent's (rule 7)
        self.next_socket_check = 0.0
        self.accepting = False  # the listener is in the poll set
        self.accept_paused_until = 0.0
        self.noted: dict[str, tuple[float, int]] = {}  # key -> (last logged, not logged since)
        self.request_lines = LineBudget()  # rule 8
        self.stop_reason = ""  # set by the signal handler, acted on by the loop
        self.draining = False
        self.terminate_at = 0.0
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        budget = soft - RESERVED_FDS - 3 * (options.workers + options.max_workers)
        # Connections being read at once: what the descriptors allow, each with the
        # caller's (a queued or served request holds its own too: EMFILE handles the rest).
        self.max_reading = max(1, min(admission.MAX_READING, budget // admission.FDS_PER_REQUEST))
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.keeper_channel = -1  # the keeper's questions, in the poll set (`follow_keeper`)

    # ------------------------------------------------------------------ setup

    def bind(self) -> None:
        """The admin server first (a bad --admin-addr changes nothing), then the socket."""
        if self.options.admin_addr:
            self.start_admin()
        self.listen()
        self.poll.register(self.wake_r, select.POLLIN)
        if self.pod_cache is not None:
            self.poll.register(self.pod_cache.fd, select.POLLIN)
        if self.feed is not None:
            self.poll.register(self.feed.fileno(), select.POLLIN)

    def listen(self) -> None:
        """Bind a new listening socket under a temporary name and rename it over the socket
        path (rule 1). The temporary name is this process's alone: two agents starting at
        once may have the same pid (each pid 1 of its container), so it is a random token,
        and bind() fails rather than reuse an existing name (O_EXCL-like). It sits in the
        socket's directory under a name as long as the socket's (a sun_path has 108 bytes:
        a temporary name longer than the socket's made a path that fits fail)."""
        path = self.options.socket_path
        directory = os.path.dirname(path) or "."
        # The keeper, forked before this, creates the same directory for its records
        # (`sandboxes` beside the socket): whichever comes first, the other goes on.
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # As long as the socket's own name (at least 9 bytes): whatever path fits, fits.
        token = secrets.token_hex(16)[: max(8, len(os.path.basename(path)) - 1)]
        tmp = os.path.join(directory, f".{token}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(tmp)
            try:
                os.chmod(tmp, 0o600)
                sock.listen(1024)
                os.rename(tmp, path)  # atomic takeover from a previous agent (rule 1)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            st = os.stat(path)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        if self.listener is not None:
            self.stop_accepting()
            self.listener.close()
        self.socket_id = (st.st_dev, st.st_ino)
        self.socket_lost = False
        self.listener = sock
        self.start_accepting()

    def start_accepting(self) -> None:
        if self.listener is not None and not self.accepting:
            self.poll.register(self.listener, select.POLLIN)
            self.accepting = True

    def stop_accepting(self) -> None:
        if self.listener is not None and self.accepting:
            self.poll.unregister(self.listener)
            self.accepting = False

    @property
    def admin_port(self) -> int | None:
        return self.admin.port if self.admin is not None else None

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        signal.set_wakeup_fd(self.wake_w)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        self.fill_pool()
        self.log("info", f"agent ready on {self.options.socket_path} (build {self.options.build})")
        while True:
            try:
                events = self.poll.poll(self.poll_timeout())
            except InterruptedError:
                continue
            # Workers' reports first: an admin request in the same round sees them counted.
            # Each event is bound to the object that owned its descriptor when poll returned:
            # handling one event can close a descriptor whose number a new socket of the same
            # round then reuses, and a stale event must not reach the new owner.
            bound = [(fd, mask, self.owner(fd)) for fd, mask in events]
            for fd, mask, owner in sorted(bound, key=lambda e: not isinstance(e[2], Worker)):
                if self.owner(fd) is owner:
                    self.handle(fd, mask)
            if self.stop_reason and not self.draining:
                self.start_draining(self.stop_reason)
            self.check_deadlines()
            self.check_socket()
            if self.draining and self.finished_draining():
                break
        self.stop_workers()
        self.log("info", "agent stopped")
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Only noted: the handler runs between any two bytecodes of the loop, which must not
        # find its listener closed under it; the wake-up fd makes the loop act at once.
        self.stop_reason = self.stop_reason or signal.Signals(signum).name

    def owner(self, fd: int) -> object:
        """What a descriptor belongs to now (a Worker by its control socket or by its client
        connection), or the descriptor itself for the fixed ones."""
        return self.workers.get(fd) or self.by_conn.get(fd) or self.reading.get(fd) or fd

    def handle(self, fd: int, mask: int) -> None:
        if fd == self.wake_r:
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake_r, 512)
            self.run_jobs()
        elif self.feed is not None and fd == self.feed.fileno():
            self.feed.receive()
            self.follow_keeper()
        elif self.feed is not None and self.keeper_channel >= 0 and fd == self.keeper_channel:
            self.feed.answer(self.cache_answer)
            self.follow_keeper()
        elif self.listener is not None and fd == self.listener.fileno():
            self.accept_clients()
        elif fd in self.workers:
            self.worker_event(self.workers[fd], mask)
        elif self.pod_cache is not None and fd == self.pod_cache.fd:
            self.read_pod_cache()
        elif fd in self.by_conn:
            self.client_gone(self.by_conn[fd])
        elif fd in self.reading and (admitted := self.read_request(self.reading[fd])):
            self.dispatch(admitted)

    # ------------------------------------------------------------------ clients

    def accept_clients(self) -> None:
        """Accept every waiting caller and read the requests already there first, then hand
        them to workers, accepting again after each fork: a burst's late callers must not
        wait for the forks of the ones before them to hear that the agent is alive (the
        launcher's short deadline)."""
        admitted = self.accept_waiting()
        while admitted:
            if self.dispatch(admitted.pop(0)):
                admitted += self.accept_waiting()

    def accept_waiting(self) -> list[Admitted]:
        """Every connection in the backlog now: its request read whole (ACCEPT sent), still
        being read (rule 6), or handed back."""
        admitted: list[Admitted] = []
        while self.listener is not None and self.accepting:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno in OUT_OF and self.drop_oldest_reading():
                    continue  # a descriptor is free again: the next caller may be a real one
                if exc.errno in OUT_OF:
                    self.stop_accepting()
                    self.accept_paused_until = time.monotonic() + ACCEPT_BACKOFF
                self.note("accept", "error", f"accept: {exc.strerror}; callers fall back")
                break
            pid = self.admit(conn)
            if pid is not None and (got := self.read_request(Pending(conn, pid))) is not None:
                admitted.append(got)
        return admitted

    def admit(self, conn: socket.socket) -> int | None:
        """Root only: the caller's pid, or None (closed)."""
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        if uid != 0:
            self.metrics.refused["not root"] += 1
            self.note(
                "not root",
                "warning",
                f"refused a client with uid {uid}: only root may call the agent",
            )
            conn.close()
            return None
        conn.setblocking(False)
        return int(pid)

    def read_request(self, pending: Pending) -> Admitted | None:
        """Read what `pending` sent so far (rule 6): the request once it is whole (ACCEPT
        sent), else None (kept to read on, or handed back)."""
        fd = pending.conn.fileno()
        budget = admission.MAX_BUFFERED - self.buffered() + pending.reserved
        try:
            got = pending.read(budget)
        except Refused as exc:
            self.forget_reading(fd)
            self.hand_back(pending.conn, exc.reason, str(exc))
            return None
        if got is None:
            if fd not in self.reading:
                self.start_reading(pending)
            return None
        self.forget_reading(fd)
        try:
            got.conn.send(accept_frame(self.options.request_timeout), socket.MSG_DONTWAIT)
        except OSError:
            got.close()
            return None
        return got

    def start_reading(self, pending: Pending) -> None:
        """Keep reading `pending` as its bytes arrive, within the per-caller and total
        bounds (the oldest goes when they are reached: it had the longest to send)."""
        same_peer = [p for p in self.reading.values() if p.peer == pending.peer]
        if pending.peer and len(same_peer) >= admission.MAX_READING_PER_PEER:
            self.drop_reading(same_peer[0], "slow client")
        if len(self.reading) >= self.max_reading:
            self.drop_oldest_reading()
        self.reading[pending.conn.fileno()] = pending
        self.poll.register(pending.conn, select.POLLIN | POLLRDHUP)

    def forget_reading(self, fd: int) -> None:
        if self.reading.pop(fd, None) is not None:
            self.poll.unregister(fd)

    def drop_reading(self, pending: Pending, reason: str) -> None:
        self.forget_reading(pending.conn.fileno())
        admission.close_fds(pending.fds)
        self.hand_back(pending.conn, reason, "")

    def drop_oldest_reading(self) -> bool:
        oldest = next(iter(self.reading.values()), None)
        if oldest is None:
            return False
        self.drop_reading(oldest, "slow client")
        return True

    def hand_back(self, conn: socket.socket, reason: str, detail: str) -> None:
        """A caller admission refused: FALLBACK (if it still reads), closed, counted, and
        logged once per LOG_INTERVAL per reason (a flood of them must not flood the log)."""
        with contextlib.suppress(OSError):
            conn.send(fallback_frame(reason), socket.MSG_DONTWAIT)
        conn.close()
        self.metrics.fell_back(reason)
        why = f"{reason}: {detail}" if detail and detail != reason else reason
        self.note(f"admission {reason}", "info", f"handed a caller back before reading: {why}")

    def buffered(self) -> int:
        """Bytes of requests the parent holds (admission.MAX_BUFFERED)."""
        return sum(p.reserved for p in self.reading.values()) + sum(len(a.data) for a in self.queue)

    def note(self, key: str, level: str, message: str) -> None:
        """Log `message` unless a message of `key` was logged within LOG_INTERVAL; count it
        then, and say how many were not logged with the next one."""
        now = time.monotonic()
        last, quiet = self.noted.get(key, (-LOG_INTERVAL, 0))
        if now - last < LOG_INTERVAL:
            self.noted[key] = (last, quiet + 1)
            return
        self.noted[key] = (now, 0)
        more = f" ({quiet} more like it in the last {LOG_INTERVAL:.0f} s)" if quiet else ""
        self.log(level, message + more)

    def log_request(
        self, command: str, pod: dict[str, str] | None, outcome: Outcome, accepted_at: float
    ) -> None:
        """Rule 8: the line for one request that ended, unless a flood spent the budget."""
        now = time.monotonic()
        if not self.request_lines.take(now):
            return
        level, message, fields = request_line(command, pod or {}, outcome, now - accepted_at)
        if skipped := self.request_lines.said():
            fields["not_logged_before"] = str(skipped)
        self.log(level, message, **fields)

    def dispatch(self, request: Admitted, queued: bool = False) -> bool:
        """Hand a request read whole to an idle worker, or a new one, or queue it when
        --max-workers are serving (rule 5); True when that took a fork."""
        if not queued and self.in_flight() + len(self.queue) >= self.options.max_requests:
            self.metrics.fell_back("overloaded")
            self.log_request(
                request.command,
                request.pod,
                Outcome("fallback", reason="overloaded"),
                request.accepted_at,
            )
            request.close()
            return False
        if not self.may_serve_another():
            self.queue.append(request)
            return False
        worker = self.idle_worker()
        forked = worker is None
        worker = worker or self.spawn()
        if worker is None or not self.hand_over(worker, request):
            self.metrics.fell_back("no worker")
            self.log_request(
                request.command,
                request.pod,
                Outcome("fallback", reason="no worker"),
                request.accepted_at,
            )
            request.close()
            return forked
        conn = request.conn
        worker.state = "busy"
        worker.conn = conn
        worker.accepted_at = request.accepted_at
        worker.dispatched_at = time.monotonic()
        worker.caller_gone_at = 0.0
        worker.command = request.command
        worker.pod = request.pod
        self.by_conn[conn.fileno()] = worker
        self.poll.register(conn, POLLRDHUP)
        worker.watching = True
        return forked

    def hand_over(self, worker: Worker, request: Admitted) -> bool:
        """Send `worker` the caller's connection, the request's bytes (in a memfd: a request
        may be larger than one control message) and the caller's descriptors; the parent's
        copies of those descriptors are closed either way."""
        try:
            memfd = os.memfd_create("cnibox-request", os.MFD_CLOEXEC)
        except OSError as exc:
            self.note("memfd", "error", f"cannot pass a request to a worker: {exc.strerror}")
            return False
        try:
            view = memoryview(request.data)
            while view:
                view = view[os.write(memfd, view) :]
            os.lseek(memfd, 0, os.SEEK_SET)
            socket.send_fds(worker.ctl, [b"R"], [request.conn.fileno(), memfd, *request.fds])
        except OSError as exc:
            self.note("memfd", "error", f"cannot pass a request to a worker: {exc.strerror}")
            return False
        finally:
            os.close(memfd)
            admission.close_fds(request.fds)
        return True

    def in_flight(self) -> int:
        return sum(1 for w in self.workers.values() if w.state == "busy")

    def may_serve_another(self) -> bool:
        """Below --max-workers serving, or every serving worker is waiting (rule 5)."""
        running = [w for w in self.workers.values() if w.state != "idle"]
        if len(running) < self.options.max_workers:
            return True
        now = time.monotonic()
        return all(w.state == "busy" and now - w.dispatched_at >= STUCK for w in running)

    def dispatch_queued(self) -> None:
        """Callers waiting in the queue, to the workers free now (oldest first)."""
        while self.queue and self.may_serve_another():
            self.dispatch(self.queue.popleft(), queued=True)

    def client_gone(self, worker: Worker) -> None:
        """The caller closed its end. If the result was sent it is just done; if not (killed,
        or it gave up and fell back), the worker is killed after CALLER_GRACE: its report
        may be on the way (rule 3)."""
        self.unwatch(worker)
        if worker.state == "busy" and not worker.caller_gone_at:
            worker.caller_gone_at = time.monotonic()

    def unwatch(self, worker: Worker) -> None:
        if worker.conn is not None and worker.watching:
            self.poll.unregister(worker.conn.fileno())
            worker.watching = False

    def release_conn(self, worker: Worker) -> None:
        if worker.conn is None:
            return
        self.unwatch(worker)
        del self.by_conn[worker.conn.fileno()]
        worker.conn.close()
        worker.conn = None

    # ------------------------------------------------------------------ workers

    def idle_worker(self) -> Worker | None:
        return next((w for w in self.workers.values() if w.state == "idle"), None)

    def idle_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.state == "idle")

    def fill_pool(self) -> None:
        """Fork idle workers up to --workers. Called when a worker exits, not when one
        takes a request: on a small node the fork would compete with that request for CPU
        (a burst beyond the pool forks on demand instead)."""
        if self.draining:
            return
        while self.idle_count() < self.options.workers:
            if self.spawn() is None:
                return

    def spawn(self) -> Worker | None:
        try:
            parent_end, child_end = socket.socketpair(
                socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC
            )
        except OSError as exc:  # EMFILE: the request falls back, the loop goes on
            self.note("spawn", "error", f"cannot start a worker: {exc.strerror}")
            return None
        try:
            pid = os.fork()
        except OSError as exc:
            self.note("spawn", "error", f"cannot start a worker: {exc.strerror}")
            parent_end.close()
            child_end.close()
            return None
        if pid == 0:  # pragma: no cover - the child's coverage is not collected
            os.close(parent_end.detach())
            become_worker(
                child_end,
                self._parent_fds(),
                WorkerJob(self.serve, self.prepare, self.warm, self.options.worker_requests),
                self.log,
            )
        child_end.close()
        self.metrics.workers_started += 1
        worker = Worker(pid, parent_end)
        parent_end.setblocking(False)
        self.workers[parent_end.fileno()] = worker
        self.poll.register(parent_end, select.POLLIN)
        return worker

    def _parent_fds(self) -> list[int]:
        """Every descriptor the parent owns, detached from its Python object (a later
        collection of that object must not close a reused number)."""
        fds = [self.wake_r, self.wake_w]  # (the admin server's sockets: closed at fork)
        if self.pod_cache is not None and self.pod_cache.open:
            fds.append(self.pod_cache.fd)
        if self.feed is not None:
            fds.append(self.feed.fileno())  # the parent's alone to read
            if (channel := self.feed.detach_channel()) >= 0:
                fds.append(channel)  # the keeper's alone to ask on
        socks = [self.listener]
        socks += [w.ctl for w in self.workers.values()]
        socks += [w.conn for w in self.workers.values()]
        holding: list[Pending | Admitted] = [*self.reading.values(), *self.queue]
        for held in holding:  # callers' requests (rule 6)
            socks.append(held.conn)
            fds += held.fds
        for sock in socks:
            if sock is not None and sock.fileno() >= 0:
                fds.append(sock.detach())
        return fds

    def worker_event(self, worker: Worker, mask: int) -> None:
        while (msg := _recv_ready(worker.ctl, MAX_REPORT)) is not None:
            if not msg:
                self.worker_exited(worker)
                return
            self.worker_report(worker, msg)
        if mask & (select.POLLHUP | select.POLLERR):
            self.worker_exited(worker)

    def worker_report(self, worker: Worker, msg: bytes) -> None:
        try:
            data = json.loads(msg[1:])
        except ValueError:
            data = {}
        if msg[:1] == b"S":
            worker.command = str(data.get("command", ""))
            return
        if msg[:1] == b"I":
            self.worker_idle(worker)
            return
        if msg[:1] == b"Q":  # a question to the pod cache (agent/pod_cache.py rule 1)
            self.answer_pod_cache(worker, msg[1:])
            return
        if msg[:1] != b"D" or worker.state != "busy":
            return
        worker.state = "done"
        seconds = time.monotonic() - worker.accepted_at
        fallback = str(data.get("fallback", ""))
        command = str(data.get("command", worker.command)) or "unknown"
        if isinstance(warm := data.get("warm"), dict):
            # Each key is what the latest request that knew it needed (the API server it
            # used, the x_tables family it loaded): keys a request did not report stay.
            merged = {**(self.warm if isinstance(self.warm, dict) else {}), **warm}
            if merged != self.warm:
                self.warm = merged
                self.recycle_idle()
        from multicall.agent.pod_cache import count_add

        count_add(self.cache_metrics, data)
        if isinstance(loads := data.get("xt_loads"), int) and loads > 0:
            self.metrics.extension_loads += loads
        if fallback:
            self.metrics.fell_back(fallback)
            outcome = Outcome("fallback", reason=fallback)
        else:
            result = "ok" if data.get("exit") == 0 else "error"
            code = str(data.get("cni_code", ""))
            self.metrics.served(command, result, code, seconds)
            outcome = Outcome(result, cni_code=code)
        self.log_request(worker.command or command, worker.pod, outcome, worker.accepted_at)
        self.release_conn(worker)

    def worker_idle(self, worker: Worker) -> None:
        """A worker waits for another request (rule 4). Kept while the queue needs it or the
        pool is short; not when draining, nor when the workers should preload x_tables
        extensions this one does not hold (a fresh fork does)."""
        if worker.state != "done" or worker.killed:
            return
        wants_preload = isinstance(self.warm, dict) and self.warm.get("xtables") in (
            "ipv4",
            "ipv6",
        )
        if not self.queue and (
            self.draining or wants_preload or self.idle_count() >= self.options.workers
        ):
            worker.ctl.shutdown(socket.SHUT_RDWR)  # it exits on EOF
            return
        worker.state = "idle"
        self.metrics.worker_reuses += 1
        self.dispatch_queued()

    def worker_exited(self, worker: Worker) -> None:
        fd = worker.ctl.fileno()
        self.poll.unregister(fd)
        del self.workers[fd]
        worker.ctl.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(worker.pid, 0)
        if worker.state == "busy":  # died without a report, and nobody killed it
            self.metrics.worker_crashes += 1
            self.metrics.fell_back("worker died")
            self.log("error", f"worker {worker.pid} died serving a request")
            self.log_request(
                worker.command,
                worker.pod,
                Outcome("fallback", reason="worker died"),
                worker.accepted_at,
            )
        worker.state = "done"
        self.release_conn(worker)
        self.fill_pool()
        self.dispatch_queued()

    def recycle_idle(self) -> None:
        """Idle workers forked before the latest warm value exit (EOF on their control
        socket) and are forked again with it."""
        for worker in list(self.workers.values()):
            if worker.state == "idle":
                worker.state = "done"
                worker.ctl.shutdown(socket.SHUT_RDWR)

    def kill(self, worker: Worker, why: str) -> None:
        """SIGKILL a busy worker; counted as a fallback for `why` (its caller, if alive,
        runs the one-shot path)."""
        worker.state = "done"
        worker.killed = why
        self.metrics.fell_back(why)
        self.log_request(
            worker.command, worker.pod, Outcome("fallback", reason=why), worker.accepted_at
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)

    def check_deadlines(self) -> None:
        self.dispatch_queued()  # workers that became stuck let one more start (rule 5)
        now = time.monotonic()
        while self.queue and (
            now - self.queue[0].accepted_at > self.options.request_timeout
            or (self.draining and now > self.terminate_at)
        ):
            late = self.queue.popleft()
            late.close()  # the caller, if still there, runs one-shot
            why = "shutdown" if self.draining else "deadline"
            self.metrics.fell_back(why)
            self.log_request(
                late.command, late.pod, Outcome("fallback", reason=why), late.accepted_at
            )
        for pending in list(self.reading.values()):  # oldest first
            if now - pending.accepted_at <= admission.ADMISSION_DEADLINE:
                break
            self.drop_reading(pending, "slow client")
        if not self.accepting and now >= self.accept_paused_until and not self.draining:
            self.start_accepting()
        for worker in list(self.workers.values()):
            if worker.state != "busy":
                continue
            if worker.caller_gone_at and now - worker.caller_gone_at > CALLER_GRACE:
                self.kill(worker, "caller gone")
            elif now - worker.accepted_at > self.options.request_timeout:
                self.log("error", f"worker {worker.pid} passed the request deadline; killed")
                self.kill(worker, "deadline")
            elif self.draining and now > self.terminate_at:
                self.kill(worker, "shutdown")

    def poll_timeout(self) -> int:
        """Milliseconds until the next deadline check is due (short while a caller is gone)."""
        pending = any(w.state == "busy" and w.caller_gone_at for w in self.workers.values())
        if pending or self.queue or not self.accepting:
            return int(CALLER_GRACE * 1000)
        return 250

    def check_socket(self) -> None:
        """Rule 7: the socket path, still this agent's? Listen again when it was removed;
        not ready while another agent's socket is there."""
        now = time.monotonic()
        if self.draining or now < self.next_socket_check:
            return
        self.next_socket_check = now + SOCKET_CHECK
        path = self.options.socket_path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            try:
                self.accept_clients()  # callers that connected before it was removed
                self.listen()
            except OSError as exc:
                self.note(
                    "rebind", "error", f"cannot listen on {path} again: {exc.strerror or exc}"
                )
                return
            self.log("warning", f"{path} was removed: listening on it again")
            return
        except OSError:
            return  # cannot tell (a directory it may not search): as it was
        lost = (st.st_dev, st.st_ino) != self.socket_id
        if lost and not self.socket_lost:
            self.log("warning", f"{path} is another agent's socket now: not ready")
        self.socket_lost = lost

    # ------------------------------------------------------------------ shutdown

    def start_draining(self, why: str) -> None:
        """Stop taking requests (the socket goes first: new callers fall back at once), let
        the ones in flight finish until the grace period ends."""
        self.draining = True
        self.terminate_at = time.monotonic() + self.options.shutdown_grace
        self.log("info", f"{why}: stopping; {self.in_flight()} request(s) in flight")
        self.remove_socket()
        if self.listener is not None:
            self.stop_accepting()
            self.listener.close()
            self.listener = None
        for pending in list(self.reading.values()):  # not read yet: the caller runs one-shot
            self.drop_reading(pending, "shutdown")

    def remove_socket(self) -> None:
        """Unlink the socket path only while it is still ours (not a successor's)."""
        path = self.options.socket_path
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) == self.socket_id:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a read-only directory: callers find nobody listening
            self.log("warning", f"cannot remove {path}: {exc.strerror}; draining anyway")

    def finished_draining(self) -> bool:
        return self.in_flight() == 0 and not self.queue and not self.reading

    def stop_workers(self) -> None:
        for worker in list(self.workers.values()):
            if worker.state == "idle":
                worker.ctl.shutdown(socket.SHUT_RDWR)  # an idle worker exits on EOF
        deadline = time.monotonic() + 5
        while self.workers and time.monotonic() < deadline:
            for fd, mask in self.poll.poll(100):
                if fd in self.workers:
                    self.worker_event(self.workers[fd], mask)
        for worker in list(self.workers.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
            self.worker_exited(worker)
        if self.admin is not None:
            self.admin.stop()

    # ------------------------------------------------------------------ admin HTTP

    def start_admin(self) -> None:
        """/healthz, /readyz, /metrics on the project's admin server (its own threads). State
        lives in the loop: a scrape is rendered by the loop (`on_loop`), so it sees every
        report handled before it, and /healthz answers only while the loop turns."""
        from multicall.effects.admin_server import AdminServer, Reply, Route, probe

        def metrics(_headers: object) -> Reply:
            body = self.on_loop(self.render_metrics)
            if body is None:
                return Reply(500, b"the agent's event loop did not answer\n", TEXT)
            return Reply(200, body, METRICS_TYPE)

        routes = {
            "/healthz": probe(lambda: self.on_loop(lambda: True) is True, b"ok\n", b"stuck\n"),
            "/readyz": probe(
                lambda: not self.draining and not self.socket_lost, b"ready\n", b"stopping\n"
            ),
            "/metrics": Route(metrics, announce_allow=True),
        }
        self.admin = AdminServer(self.options.admin_addr, routes)
        self.admin.start()

    def render_metrics(self) -> bytes:
        self.metrics.idle_workers = self.idle_count()
        self.metrics.queued = len(self.queue)
        self.metrics.in_flight = self.in_flight()
        from multicall.core.kube.pod_cache import render_cache

        cache = self.pod_cache.cache if self.pod_cache is not None else None
        text = render(self.metrics, self.options.build) + render_cache(self.cache_metrics, cache)
        if self.feed is not None:
            self.feed.receive()  # a snapshot sent in this same round is counted
            self.follow_keeper()
            text += self.feed.render()
        return text.encode()

    # ------------------------------------------------------------------ the pod cache

    def read_pod_cache(self) -> None:
        """The cache process's messages (agent/pod_cache.py rule 2); at its end the feed
        leaves the poll set and the cache, hearing no beat, answers nothing more."""
        assert self.pod_cache is not None
        if not self.pod_cache.read(time.monotonic()):
            self.poll.unregister(self.pod_cache.fd)
            self.log("error", "pod cache: its process is gone; ADDs read the API")

    def answer_pod_cache(self, worker: Worker, question: bytes) -> None:
        with contextlib.suppress(OSError):  # a worker that went away: its EOF comes next
            worker.ctl.send(self.cache_answer(question))

    def cache_answer(self, question: bytes) -> bytes:
        """The "A" message for a "Q" question, a worker's or the keeper's alike."""
        from multicall.agent.pod_cache import no_cache_answer

        if self.pod_cache is None:
            return no_cache_answer(question)
        return self.pod_cache.answer(question, time.monotonic())

    def follow_keeper(self) -> None:
        """The keeper's current channel in the poll set (keeper_process.py rule 5): a new
        one when a restarted keeper sent it, none after its end."""
        assert self.feed is not None
        fd = self.feed.channel_fd()
        if fd == self.keeper_channel:
            return
        if self.keeper_channel >= 0:
            with contextlib.suppress(KeyError):
                self.poll.unregister(self.keeper_channel)
        if fd >= 0:
            self.poll.register(fd, select.POLLIN)
        self.keeper_channel = fd

    def on_loop(self, job: Callable[[], T], timeout: float = LOOP_ANSWER) -> T | None:
        """Run `job` on the event loop's thread (from an admin thread); None when the loop
        did not get to it within `timeout`."""
        done = threading.Event()
        box: list[T] = []

        def run() -> None:
            box.append(job())
            done.set()

        self.jobs.append(run)  # deque.append: atomic, no lock needed
        with contextlib.suppress(BlockingIOError):
            os.write(self.wake_w, b"\0")  # a full pipe means the loop has a wake-up pending
        return box[0] if done.wait(timeout) and box else None

    def run_jobs(self) -> None:
        while self.jobs:
            self.jobs.popleft()()


def _recv_ready(sock: socket.socket, size: int) -> bytes | None:
    """What a non-blocking socket has: None when nothing yet, b"" at EOF or on an error."""
    try:
        return sock.recv(size)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""
