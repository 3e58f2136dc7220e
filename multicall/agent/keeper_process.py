"""The keeper's processes (agent/keeper.py runs in them), started by the agent's applet
before the server binds and forks its pool, so the server's parent stays one thread.

Rules of this module:
1. Two processes: a supervisor forked from the agent, and the keeper forked from the
   supervisor. The supervisor restarts a keeper that exits or dies, after a back-off
   (`RESTART_FIRST` doubling up to `RESTART_MAX`, back to the first after a keeper that ran
   `RESTART_MAX`), and logs every restart. A keeper crash (a failed libiptc call, an
   exception) never reaches the agent's parent or its workers.
2. Stopping: the agent closes the write end of a pipe (`KeeperProcess.stop`, after
   `Server.run` returned: the workers, which inherit that end, are gone by then); both
   processes see its EOF. A dead agent (SIGKILL) stops them too: each sets
   PR_SET_PDEATHSIG (SIGTERM, default disposition) for its parent.
3. The API: `--kubeconfig PATH`, else the pod's service account when its files exist,
   else none. Without one the keeper posts no Event, does not ask for the pod before a
   repair (the netns identity and IP checks still guard it), and the repair's ADD reads
   the API through the kubeconfig its linkerd-cni entry names, as the one-shot plugin
   does. That is logged once; it never fails the agent's start. `--kubeconfig PATH` is
   loaded here, in the keeper, not at the agent's start (agent/identity.py): while the
   file does not exist or cannot be used yet (on Talos, until install-cni wrote it) the
   keeper waits for it (logged once, retried on the back-off) and starts when it loads;
   a rewritten file (a new token) is loaded again at the next Event, pod GET or repair.
4. Metrics: a datagram socketpair made before the fork; the keeper sends a snapshot of its
   counters whenever they change (agent/keeper.py `publish`), the agent's poll loop reads
   each one as it arrives (`receive`) and its /metrics renders the latest (`render`) with
   the keeper process's CPU and memory read from /proc at the scrape. Only the parent reads
   the socket (its workers close their copy at fork); what arrives is decoded with fixed
   fields and label sets (core/keeper.py `decode_metrics`), anything else is dropped.
5. The pod cache: each keeper process, at its start, makes a SOCK_SEQPACKET socketpair and
   sends one end to the parent over its metrics socket (SCM_RIGHTS, the datagram
   `CHANNEL`); the parent keeps the latest one it received (closing the one before: a
   restarted keeper gets a fresh channel, and an answer meant for its predecessor is never
   read by it) and answers the keeper's "Q" questions on it as it answers a worker's
   (agent/pod_cache.py rules 1 and 4: the same questions and answers, no other). Workers
   close the parent's end at fork. A keeper whose channel could not be sent asks the API.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from multicall.core.keeper import MAX_SNAPSHOT, KeeperMetrics, KeeperMode

if TYPE_CHECKING:
    from multicall.agent.keeper import Keeper
    from multicall.agent.pod_cache import Ask
    from multicall.core.keeper import Refusal, SandboxRecord
    from multicall.core.kube.kubeconfig import KubeConfig
    from multicall.effects.caller import Files

Log = Callable[[str, str], None]  # (level, message)
RESTART_FIRST = 1.0
RESTART_MAX = 60.0
STOP_WAIT = 10.0  # a keeper in the middle of a repair finishes it; then SIGKILL
PR_SET_PDEATHSIG = 1
CHANNEL = b"channel"  # the datagram carrying a keeper's end of its pod cache channel (rule 5)


@dataclass(frozen=True, slots=True)
class KeeperSettings:
    """The keeper's flags, as the agent passes them to its child process."""

    mode: KeeperMode
    records: str  # the record directory (effects/sandbox_records.py)
    cni_net_dir: str  # where the node's conflist is (the repair's linkerd-cni entry)
    cni_cache_dir: str  # libcni's cache dir; "": unrecorded sandboxes are not looked for
    host_root: str  # where the node's / is mounted ("" when it is ours)
    kubeconfig: str  # the keeper's API identity; "": in-cluster when present, else none
    instance: str  # the Events' reportingInstance


@dataclass(slots=True)
class KeeperProcess:
    """The supervisor as the agent's parent sees it, and the keeper's metrics (rule 4)."""

    pid: int
    stop_w: int
    report_r: int = -1  # the parent's end of the metrics socketpair
    metrics: KeeperMetrics = field(default_factory=KeeperMetrics)  # the latest snapshot
    keeper_pid: int = 0  # the keeper that sent it
    channel: socket.socket | None = None  # the current keeper's questions (rule 5)

    @classmethod
    def start(cls, settings: KeeperSettings, env: Mapping[str, str], log: Log) -> KeeperProcess:
        stop_r, stop_w = os.pipe2(os.O_CLOEXEC)
        ends = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        report_r, report_w = (end.detach() for end in ends)
        os.set_blocking(report_r, False)
        os.set_blocking(report_w, False)  # a parent that does not read never stalls a repair
        agent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - in the child
            os.close(stop_w)
            os.close(report_r)
            _supervise(settings, dict(env), (stop_r, report_w), agent, log)
        os.close(stop_r)
        os.close(report_w)
        return cls(pid, stop_w, report_r)

    def fileno(self) -> int:
        return self.report_r

    def receive(self) -> None:
        """Every datagram waiting on the socket: the last valid snapshot is kept, and the
        last channel (rule 5)."""
        from multicall.core.keeper import decode_metrics

        if self.report_r < 0:
            return
        sock = socket.socket(fileno=self.report_r)
        try:
            while True:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(
                        sock, MAX_SNAPSHOT + 1, 1, socket.MSG_CMSG_CLOEXEC
                    )
                except OSError:  # BlockingIOError among them: nothing more waits
                    return
                if fds:
                    self._new_channel(data, fds)
                    continue
                decoded = decode_metrics(data) if data else None
                if decoded is not None:
                    self.metrics, self.keeper_pid = decoded
                if not data:
                    return
        finally:
            sock.detach()  # report_r stays this object's to close (stop)

    def _new_channel(self, data: bytes, fds: list[int]) -> None:
        if data != CHANNEL or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return
        if self.channel is not None:
            self.channel.close()  # the previous keeper's: it is gone
        self.channel = socket.socket(fileno=fds[0])
        self.channel.setblocking(False)

    def channel_fd(self) -> int:
        return self.channel.fileno() if self.channel is not None else -1

    def detach_channel(self) -> int:
        """In a forked worker: the channel's descriptor, for the worker to close, detached
        from its object (whose collection must not close a reused number); -1 for none."""
        if self.channel is None:
            return -1
        fd, self.channel = self.channel.detach(), None
        return fd

    def answer(self, answerer: Callable[[bytes], bytes]) -> None:
        """The keeper's questions waiting on its channel, each answered by `answerer` (the
        parent's, as for a worker's: agent/server.py); at its end the channel is closed."""
        from multicall.agent.pod_cache import MAX_ANSWER

        channel = self.channel
        while channel is not None:
            try:
                msg = channel.recv(MAX_ANSWER)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                msg = b""
            if not msg:
                channel.close()
                self.channel = None
                return
            if msg[:1] == b"Q":
                with contextlib.suppress(OSError):  # a keeper gone: its EOF comes next
                    channel.send(answerer(msg[1:]))

    def render(self) -> str:
        """The keeper's families for the agent's /metrics: its latest counters, and the
        keeper process's CPU and memory now (none while no keeper of this agent runs)."""
        from multicall.core.keeper import render_process
        from multicall.effects.process_metrics import proc_usage

        usage = proc_usage(self.keeper_pid) if self.keeper_pid else None
        process = ""
        if usage is not None and usage.ppid == self.pid:  # not a recycled pid
            process = render_process(usage.cpu_seconds, usage.resident_bytes)
        return self.metrics.render() + process

    def stop(self, log: Log) -> None:
        """Close the pipe, wait for the supervisor (which waits for the keeper)."""
        if self.stop_w >= 0:
            os.close(self.stop_w)
            self.stop_w = -1
        if self.report_r >= 0:
            os.close(self.report_r)
            self.report_r = -1
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if not _wait(self.pid, STOP_WAIT + 5):
            log("warning", "keeper: did not stop in time; killed")
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


def _wait(pid: int, timeout: float) -> bool:
    """Reap `pid` within `timeout` seconds; False when it still runs."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        select.select([fd], [], [], timeout)
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    finally:
        os.close(fd)
    return done == pid


def _orphan_guard(parent: int) -> None:  # pragma: no cover - in the child
    """SIGTERM (default disposition) when `parent` dies; exit now if it already did."""
    from multicall.effects.ns import libc

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C reaches the agent only
    libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def _supervise(
    settings: KeeperSettings, env: dict[str, str], fds: tuple[int, int], agent: int, log: Log
) -> NoReturn:  # pragma: no cover - in the child
    def body() -> None:
        _restarting(settings, env, fds, agent, log)

    _in_child("keeper supervisor", log, body)


def _restarting(
    settings: KeeperSettings, env: dict[str, str], fds: tuple[int, int], agent: int, log: Log
) -> None:  # pragma: no cover - in the child
    """`fds`: the stop pipe's read end, the metrics socket's keeper end."""
    _orphan_guard(agent)

    def started(pid: int) -> None:
        log("info", f"keeper started (pid {pid}, mode {settings.mode.value})")

    restart_loop(
        "keeper",
        fds[0],
        log,
        lambda me, restarts: _keep(settings, env, fds, (me, restarts), log),
        started,
    )


def restart_loop(
    what: str,
    stop_r: int,
    log: Log,
    child: Callable[[int, int], NoReturn],
    started: Callable[[int], None] | None = None,
) -> None:  # pragma: no cover - in the child
    """The supervisor's loop, for the keeper and the pod cache alike: fork `child(supervisor
    pid, restarts so far)`, wait for it or for the stop pipe; on stop end it (SIGKILL after
    STOP_WAIT), on its exit log and restart it after a delay that doubles up to RESTART_MAX
    and starts over once a child lived that long."""
    me = os.getpid()
    delay = RESTART_FIRST
    restarts = 0
    while True:
        began = time.monotonic()
        pid = os.fork()
        if pid == 0:
            child(me, restarts)
        if started is not None:
            started(pid)
        pidfd = os.pidfd_open(pid)
        ready, _, _ = select.select([stop_r, pidfd], [], [])
        os.close(pidfd)
        if stop_r in ready:
            if not _wait(pid, STOP_WAIT):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            return
        _pid, status = os.waitpid(pid, 0)
        if time.monotonic() - began >= RESTART_MAX:
            delay = RESTART_FIRST
        log("error", f"{what} exited ({_status(status)}); restarting in {delay:.0f}s")
        if select.select([stop_r], [], [], delay)[0]:
            return
        delay = min(delay * 2, RESTART_MAX)
        restarts += 1


def _in_child(what: str, log: Log, body: Callable[[], None]) -> NoReturn:  # pragma: no cover
    """Run `body` in a forked child and exit: never return into the agent's code."""
    code = 0
    try:
        body()
    except BaseException as exc:  # noqa: BLE001 - logged; the supervisor restarts a keeper
        with contextlib.suppress(Exception):
            log("error", f"{what} failed: {type(exc).__name__}: {exc}")
        code = 70
    os._exit(code)


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _keep(
    settings: KeeperSettings,
    env: dict[str, str],
    fds: tuple[int, int],
    generation: tuple[int, int],
    log: Log,
) -> NoReturn:  # pragma: no cover - in the child
    """`generation`: the supervisor's pid, and how many keepers it restarted before this."""

    def body() -> None:
        _orphan_guard(generation[0])
        channel = open_channel(fds[1])
        if channel is None:
            log("warning", "keeper: no channel to the agent's pod cache; it asks the API")
        keeper = build_keeper(settings, env, log, fds[0], _asker(channel))
        if keeper is None:  # stopped while waiting for its kubeconfig
            return
        keeper.report_fd = fds[1]
        keeper.metrics.restarts = generation[1]
        keeper.run(fds[0])

    _in_child("keeper", log, body)


def open_channel(report_w: int) -> socket.socket | None:
    """This keeper's end of a new channel to the parent, the other end sent to it over the
    metrics socket (rule 5); None when it could not be sent."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    report = socket.socket(fileno=report_w)
    try:
        socket.send_fds(report, [CHANNEL], [theirs.fileno()])
    except OSError:  # BlockingIOError: the parent's queue is full
        mine.close()
        return None
    finally:
        report.detach()
        theirs.close()
    return mine


def _asker(channel: socket.socket | None) -> Ask | None:
    if channel is None:
        return None
    numbers = itertools.count(1)

    def ask(question: dict[str, object]) -> dict[str, object] | None:
        from multicall.agent.pod_cache import ask_parent

        return ask_parent(channel, question, next(numbers))

    return ask


def build_keeper(
    settings: KeeperSettings,
    env: Mapping[str, str],
    log: Log,
    stop_fd: int,
    ask: Ask | None = None,
) -> Keeper | None:
    """The keeper of `settings`, with its API session when there is an API configuration;
    None when `stop_fd` turned readable while it waited for --kubeconfig (rule 3). `ask`:
    the parent's pod cache (rule 5), asked before the API when there is an API
    configuration (the cache has the same one)."""
    from multicall.agent.identity import (
        Current,
        FollowedKube,
        KubeconfigSource,
        Sessions,
        stop_sleep,
    )
    from multicall.agent.keeper import ApiEvents, ApiPods, CachedPods, Keeper
    from multicall.agent.pod_cache import CachedControllerKube, ClusterOf
    from multicall.effects.pod_sandbox import SandboxFinder
    from multicall.effects.sandbox_records import RecordStore
    from multicall.plugin.in_place import Repairer, node_xtables_lock
    from multicall.plugin.ports import Kube, RealFirewall, RealKube

    finder = SandboxFinder(settings.cni_net_dir, settings.cni_cache_dir, settings.host_root)
    firewall = RealFirewall(lock=node_xtables_lock(settings.host_root))
    current: Current | None = None
    if settings.kubeconfig:
        source = KubeconfigSource(settings.kubeconfig, "keeper", log)
        if source.wait(stop_sleep(stop_fd)) is None:
            return None
        current = source.current
    else:
        fixed = in_cluster_config(env)
        if fixed is not None:
            current = lambda: (fixed, 0)  # noqa: E731 - the service account's, fixed
    events: ApiEvents | NoEvents
    pods: ApiPods | CachedPods | NoPods
    kube: Kube
    if current is not None:
        sessions = Sessions(current)
        events, pods = ApiEvents(sessions, settings.instance), ApiPods(sessions)
        kube = FollowedKube(current)
        if ask is not None:
            cluster = ClusterOf(current)
            pods = CachedPods(pods, ask, cluster)
            kube = CachedControllerKube(kube, ask, cluster)
    else:
        log("info", "keeper: no API configuration (no --kubeconfig, no service account): "
            "no Events, pods not asked before a repair; a repair reads the API through "
            "the kubeconfig of the linkerd-cni entry")  # fmt: skip
        events, pods, kube = NoEvents(), NoPods(), RealKube(_host_files(settings.host_root))
    return Keeper(
        store=RecordStore(settings.records),
        finder=finder,
        repairer=Repairer(finder, kube, lambda line: log("debug", line), firewall),
        firewall=firewall,
        events=events,
        pods=pods,
        log=log,
        mode=settings.mode,
    )


def in_cluster_config(env: Mapping[str, str]) -> KubeConfig | None:
    """The service account's configuration when its files exist, else None. (--kubeconfig
    is loaded lazily by the processes that need it: agent/identity.py.)"""
    from multicall.effects.kube.stream import SERVICE_ACCOUNT_DIR
    from multicall.effects.kube.stream import in_cluster_config as load_in_cluster

    directory = env.get("SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR
    if not os.path.isfile(os.path.join(directory, "token")):
        return None
    try:
        return load_in_cluster(env)
    except Exception:  # noqa: BLE001 - KubeError: no API, as without the files
        return None


def _host_files(host_root: str) -> Files:
    """The node's filesystem (the linkerd-cni entry's kubeconfig is a node path)."""
    from multicall.effects.caller import OWN_FILES, RootedFiles

    if not host_root.rstrip("/"):
        return OWN_FILES
    return RootedFiles(os.open(host_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))


class NoEvents:
    """Without an API: Events are not posted (the keeper's log says what they would)."""

    def post(self, record: SandboxRecord, action: str, note: str) -> bool:
        return False


class NoPods:
    """Without an API: the pod is not asked for; the sandbox's netns checks remain."""

    def gone(self, record: SandboxRecord) -> Refusal | None:
        return None
