"""usage: linkerd-cni-repair-controller --node-name NODE --controller-pod-name POD [OPTIONS]

Linkerd's CNI repair controller, a drop-in for upstream's Rust binary of the same name: it
watches the pods on this node that Linkerd injected (label linkerd.io/control-plane-ns) and
deletes each one whose linkerd-network-validator init container last exited with 95 (the
redirect was missing: the pod started before the CNI chain was complete), so that its
controller recreates it with the chain in place. Each deletion is announced with an
events.k8s.io Event (reason LinkerdCNINotConfigured, action Deleting).

Options (upstream's; each also read from its environment variable):
  --node-name NAME              this node        [env: LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME]
  --controller-pod-name NAME    this pod, the Events' reportingInstance
                                                 [env: LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME]
  --log-level FILTER            [env: LINKERD_CNI_REPAIR_CONTROLLER_LOG_LEVEL]
                                [default: linkerd_cni_repair_controller=info,warn]
  --log-format plain|json       [env: LINKERD_CNI_REPAIR_CONTROLLER_LOG_FORMAT] [default: plain]
  --admin-addr HOST:PORT        /live, /ready and /metrics  [default: 0.0.0.0:9990]
  --kubeconfig PATH, --context NAME, --cluster NAME, --user NAME, --as USER, --as-group GROUP
                                the API client (default: $KUBECONFIG or ~/.kube/config when
                                present, else the pod's service account, in-cluster)
  --kube-api-response-headers-timeout DURATION   [default: 9s]
  -h, --help, -V, --version

cnibox's additions:
  --watch-timeout DURATION      the watch's server-side timeoutSeconds [default: 290s]; the
                                client drops a watch silent for 30 s longer
  --error-delay DURATION        wait after consecutive API errors, doubling up to 30 s
                                (jittered) [default: 5s]
  --repair-in-place             before deleting, program the pod's redirect in its sandbox
                                network namespace found through the CNI result cache
                                (docs/repair-controller.md); fall back to deleting
  --cni-net-dir DIR             the node's CNI config dir    [default: /host/etc/cni/net.d]
  --cni-cache-dir DIR           libcni's cache dir           [default: /host/var/lib/cni]
  --host-root DIR               where the node's / is mounted, for netns paths and the node's
                                xtables lock (run/xtables.lock under it) [default: /host]

SIGTERM or SIGINT stops it (exit 0). Logs go to stdout, as upstream's do.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from multicall.core.openmetrics import CONTENT_TYPE, Counter, Histogram, exposition
from multicall.core.repair import policy
from multicall.core.repair.cli import Options, parse_args
from multicall.core.tracing_log import LEVELS, LogFilter, format_line, parse_filter
from multicall.core.usage import Show
from multicall.effects.streams import write_text
from multicall.errors import EXIT_OK, KubeError

if TYPE_CHECKING:
    from multicall.core.kube.kubeconfig import KubeConfig
    from multicall.core.kube.watch import Event, WatchCursor
    from multicall.effects.kube.stream import ClientOptions, Session, Token
    from multicall.plugin.repair_in_place import Repairer

MAX_ERROR_DELAY = 30.0
RECENT_UIDS = 4096  # pods deleted lately: never deleted twice, whatever the event order
TRACE, DEBUG, INFO, WARN = LEVELS["trace"], LEVELS["debug"], LEVELS["info"], LEVELS["warn"]
CONTROLLER = policy.LOG_TARGET
STREAM = "kubert::errors"  # where kubert logs a failed watch ("stream failed")
WATCHER = "kube_runtime::watcher"


class Log:
    """tracing-subscriber's output on stdout, one line per write, from any thread."""

    def __init__(self, stream: BinaryIO, filt: LogFilter, fmt: str) -> None:
        self.stream = stream
        self.filter = filt
        self.fmt = fmt
        self._lock = threading.Lock()

    def __call__(self, level: int, target: str, message: str, **fields: object) -> None:
        if not self.filter.enabled(target, level):
            return
        line = format_line(
            self.fmt,
            time.time_ns(),
            level,
            target,
            message,
            fields=[(k, str(v)) for k, v in fields.items()],
        )
        # a closed stdout must not stop the controller
        with self._lock, contextlib.suppress(OSError, ValueError):
            write_text(self.stream, line)


class Metrics:
    """Upstream's metric families, in its registration order (prefix
    linkerd_cni_repair_controller_), then kubert's process_* families."""

    def __init__(self, *, repair_in_place: bool = False) -> None:
        self.queue_overflow = Counter(
            "queue_overflow", "Incremented whenever the event processing queue overflows"
        )
        self.pods_deleted = Counter("pods_deleted", "Number of pods deleted by the controller")
        self.pods_delete_latency = Histogram(
            "pods_delete_latency_seconds", "Pod deletion latency distribution"
        )
        self.pods_delete_errors = Counter(
            "pods_delete_errors", "Incremented whenever the pod deletion call errors out"
        )
        self.pods_delete_timeouts = Counter(
            "pods_delete_timeout", "Incremented whenever the pod deletion call times out"
        )
        self.events_publish_latency = Histogram(
            "events_publish_latency_seconds", "Events publish latency distribution"
        )
        self.events_publish_errors = Counter(
            "events_publish_errors", "Incremented whenever the event publishing call errors out"
        )
        self.events_publish_timeouts = Counter(
            "events_publish_timeouts", "Incremented whenever the event publishing call times out"
        )
        # cnibox's own, only with --repair-in-place (the default exposition is upstream's)
        self.pods_repaired = Counter(
            "pods_repaired", "Number of pods whose redirect was programmed in place (cnibox)"
        )
        self.pods_repair_skipped = Counter(
            "pods_repair_skipped",
            "Incremented whenever a pod could not be repaired in place and was deleted (cnibox)",
        )
        self.repair_in_place = repair_in_place

    def render(self) -> bytes:
        from multicall.effects.process_metrics import process_samples

        own: list[Counter | Histogram] = [
            self.queue_overflow,
            self.pods_deleted,
            self.pods_delete_latency,
            self.pods_delete_errors,
            self.pods_delete_timeouts,
            self.events_publish_latency,
            self.events_publish_errors,
            self.events_publish_timeouts,
        ]
        if self.repair_in_place:
            own += [self.pods_repaired, self.pods_repair_skipped]
        return exposition([(policy.LOG_TARGET, own), ("process", process_samples())]).encode()


@dataclass(frozen=True, slots=True)
class Work:
    """One pod the controller is to look at (a failed validator run)."""

    ref: policy.PodRef
    pod: Mapping[str, object]
    failure: str  # "<uid>@<validator finishedAt>": one failed validator run
    may_repair: bool  # False once an in-place repair of this pod did not help


class Controller:
    """The watcher (one thread) feeds a 32-slot queue; the worker (another) deletes."""

    def __init__(
        self,
        options: Options,
        config: KubeConfig,
        client: ClientOptions,
        log: Log,
        metrics: Metrics,
        *,
        repairer: Repairer | None = None,
    ) -> None:
        from multicall.effects.kube.stream import Session, Token

        self.options = options
        self.log = log
        self.metrics = metrics
        self.repairer = repairer
        token = Token(config)
        self.watch_session: Session = Session(config, token, client)
        self.work_session: Session = Session(config, token, client)
        self.token: Token = token
        self.queue: queue.Queue[Work] = queue.Queue(maxsize=policy.QUEUE_CAPACITY)
        self.stopping = threading.Event()
        self.ready = False
        self.delivered = 0  # list pages and watch lines handled (the watcher thread's count)
        self._lock = threading.Lock()  # guards the sets below (watcher and worker)
        self._queued = policy.Recent(policy.QUEUE_CAPACITY * 4)  # pod UIDs in the queue
        self._deleted = policy.Recent(RECENT_UIDS)  # pod UIDs deleted
        self._repaired = policy.Recent(RECENT_UIDS)  # failures ("uid@finishedAt") repaired
        self._repaired_pods = policy.Recent(RECENT_UIDS)  # pod UIDs repaired at least once
        self._threads: list[threading.Thread] = []

    # -- lifecycle

    def start(self) -> None:
        for name, target in (("watch", self.run_watch), ("worker", self.run_worker)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self.ready = False
        self.stopping.set()
        self.watch_session.abort()
        self.work_session.abort()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))

    # -- the watcher: kube-rs's watcher, kubert's error handling

    def run_watch(self) -> None:
        from multicall.core.kube.watch import Phase, WatchCursor

        cursor = WatchCursor(
            "/api/v1/pods",
            policy.pod_selector(self.options.node_name),
            timeout_seconds=int(self.options.watch_timeout),
        )
        failures = 0  # consecutive failed steps with nothing delivered in between
        while not self.stopping.is_set():
            before = self.delivered
            try:
                progressed = self.step(cursor)
            except KubeError as exc:
                if self.stopping.is_set():
                    return
                status = getattr(exc, "status", 0)
                if status == 403:  # missing RBAC: kube-rs warns, so it shows by default
                    stage = "list" if cursor.phase is Phase.LIST else "initlist"
                    self.log(WARN, WATCHER, f"watch {stage} error with 403", error=exc.message)
                if status:
                    cursor.request_failed(status)
                elif cursor.phase is Phase.LIST:
                    cursor.relist()
                self.log(INFO, STREAM, "stream failed", error=exc.message)
                # kubert: an item resets the failure streak; a failure right after a
                # failure waits before the next attempt
                failures = 1 if self.delivered > before else failures + 1
                if failures > 1:
                    self.stopping.wait(self.error_delay(failures - 1))
                continue
            if progressed:
                failures = 0
            else:  # a watch that ended at once with nothing in it: do not spin
                failures += 1
                self.stopping.wait(self.error_delay(failures))

    def error_delay(self, consecutive: int) -> float:
        base = min(self.options.error_delay * 2.0 ** (consecutive - 1), MAX_ERROR_DELAY)
        return base * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not security

    def step(self, cursor: WatchCursor) -> bool:
        """One LIST page, or one WATCH until it ends; True when anything arrived."""
        from multicall.core.kube.watch import Phase, parse_watch_event
        from multicall.effects.kube.stream import list_page

        if cursor.phase is Phase.LIST:
            for event in cursor.list_page(list_page(self.watch_session, cursor.request())):
                self.handle(event)
            self.delivered += 1
            return True
        started, progressed = time.monotonic(), False
        for line in self.watch_session.watch_lines(cursor.request(), cursor.timeout_seconds):
            if self.stopping.is_set():
                return True
            if line is None:
                self.log(WARN, CONTROLLER, "Dropped a watch event larger than 4 MiB")
                continue
            for event in cursor.watch_event(parse_watch_event(line)):
                self.handle(event)
            self.delivered += 1
            progressed = True
        return progressed or time.monotonic() - started > 1.0

    def handle(self, event: Event) -> None:
        from multicall.core.kube.watch import Kind

        self.log(TRACE, CONTROLLER, "event", evt=event.kind.value)
        if event.kind is Kind.INIT_DONE:
            self.ready = True
        if event.kind in (Kind.APPLY, Kind.INIT_APPLY) and event.object is not None:
            self.consider(event.object)

    def consider(self, pod: Mapping[str, object]) -> None:
        """upstream's process_events for one applied pod."""
        verdict = policy.verdict(pod)
        if verdict is policy.Verdict.NO_STATUS:
            self.log(INFO, CONTROLLER, "Skipped, no status")
            return
        if verdict is not policy.Verdict.REPAIR:
            return
        ref = policy.pod_ref(pod)
        key = ref.uid or str(ref)
        failure = f"{key}@{policy.validator_finished_at(pod)}"
        with self._lock:
            if key in self._deleted or key in self._queued or failure in self._repaired:
                return  # deleted, waiting in the queue, or this very failure was repaired
            work = Work(ref, pod, failure, may_repair=key not in self._repaired_pods)
            try:
                self.queue.put_nowait(work)
            except queue.Full:
                self.log(
                    DEBUG,
                    CONTROLLER,
                    "Dropped event (channel full)",
                    namespace=ref.namespace,
                    name=ref.name,
                )
                self.metrics.queue_overflow.inc()
                return
            self._queued.add(key)

    # -- the worker: upstream's process_pods

    def run_worker(self) -> None:
        while not self.stopping.is_set():
            try:
                work = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            key = work.ref.uid or str(work.ref)
            outcome = "failed"
            try:
                outcome = self.process(work)
            finally:
                with self._lock:
                    self._queued.discard(key)
                    if outcome == "deleted":
                        self._deleted.add(key)
                    elif outcome == "repaired":
                        self._repaired.add(work.failure)
                        self._repaired_pods.add(key)

    def process(self, work: Work) -> str:
        """Repair in place if asked and possible, else delete: "repaired", "deleted" or
        "failed" (a later event for the pod tries again)."""
        from multicall.effects.kube.stream import delete_pod

        ref = work.ref
        if self.repairer is not None and work.may_repair and self.try_repair(work):
            return "repaired"
        deleted = self.bounded(
            lambda: delete_pod(self.work_session, ref.namespace, ref.name, policy.DELETE_TIMEOUT),
            ref,
            timed_out="Pod deletion timed out",
            failed="Error deleting pod",
            counters=(self.metrics.pods_delete_timeouts, self.metrics.pods_delete_errors),
            latency=self.metrics.pods_delete_latency,
            done="Deleted pod",
        )
        if not deleted:
            return "failed"
        self.metrics.pods_deleted.inc()
        event = policy.event_document(ref, self.options.controller_pod_name, time.time_ns())
        self.publish(ref, event)
        return "deleted"

    def publish(self, ref: policy.PodRef, event: Mapping[str, object]) -> None:
        from multicall.effects.kube.stream import create_event

        self.bounded(
            lambda: create_event(self.work_session, ref.namespace, event, policy.DELETE_TIMEOUT),
            ref,
            timed_out="Event publishing timed out",
            failed="Error publishing event",
            counters=(self.metrics.events_publish_timeouts, self.metrics.events_publish_errors),
            latency=self.metrics.events_publish_latency,
        )

    def bounded(
        self,
        call: Callable[[], None],
        ref: policy.PodRef,
        *,
        timed_out: str,
        failed: str,
        counters: tuple[Counter, Counter],
        latency: Histogram,
        done: str = "",
    ) -> bool:
        """One API call under upstream's 1 s bound, logged and counted as upstream does it
        (a timeout, an error, or a latency observation)."""
        started = time.monotonic()
        try:
            call()
        except KubeError as exc:
            where = {"namespace": ref.namespace, "name": ref.name}
            if time.monotonic() - started >= policy.DELETE_TIMEOUT:
                self.log(WARN, CONTROLLER, timed_out, **where)
                counters[0].inc()
            else:
                self.log(WARN, CONTROLLER, failed, err=exc.message, **where)
                counters[1].inc()
            return False
        if done:
            self.log(INFO, CONTROLLER, done, namespace=ref.namespace, name=ref.name)
        latency.observe(time.monotonic() - started)
        return True

    def try_repair(self, work: Work) -> bool:
        assert self.repairer is not None
        ref = work.ref
        outcome = self.repairer.repair(work.pod)
        if not outcome.repaired:
            self.log(
                INFO,
                CONTROLLER,
                "Cannot repair in place, deleting",
                namespace=ref.namespace,
                name=ref.name,
                reason=outcome.reason,
            )
            self.metrics.pods_repair_skipped.inc()
            return False
        self.log(
            INFO,
            CONTROLLER,
            "Repaired pod in place",
            namespace=ref.namespace,
            name=ref.name,
            netns=outcome.netns,
        )
        self.metrics.pods_repaired.inc()
        event = policy.event_document(
            ref,
            self.options.controller_pod_name,
            time.time_ns(),
            action=policy.REPAIR_ACTION,
            note=policy.REPAIR_NOTE,
        )
        self.publish(ref, event)
        return True


# ----------------------------------------------------------------------------- main


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int | Show:
    options = parse_args(argv[1:], env)
    if isinstance(options, Show):
        return options  # printed by dispatch.run_applet
    return run(options, env, stdout)


def run(options: Options, env: Mapping[str, str], stdout: BinaryIO) -> int:
    import signal

    from multicall.effects import admin_server
    from multicall.effects.admin_server import AdminServer
    from multicall.effects.kube.stream import ClientOptions, load_config

    log = Log(stdout, parse_filter(options.log_level), options.log_format)
    client = ClientOptions(
        kubeconfig=options.kubeconfig,
        context=options.context,
        cluster=options.cluster,
        user=options.user,
        impersonate_user=options.impersonate_user,
        impersonate_groups=(options.impersonate_group,) if options.impersonate_group else (),
        headers_timeout=options.headers_timeout,
    )
    config = load_config(client, env)
    metrics = Metrics(repair_in_place=options.repair_in_place)
    repairer = None
    if options.repair_in_place:
        from multicall.effects.pod_sandbox import SandboxFinder
        from multicall.plugin.ports import RealFirewall
        from multicall.plugin.repair_in_place import ControllerKube, Repairer, node_xtables_lock

        repairer = Repairer(
            SandboxFinder(options.cni_net_dir, options.cni_cache_dir, options.host_root),
            ControllerKube(config),
            log=lambda message: log(DEBUG, CONTROLLER, message),
            firewall=RealFirewall(lock=node_xtables_lock(options.host_root)),
        )
    controller = Controller(options, config, client, log, metrics, repairer=repairer)
    # Signals are taken synchronously by the main thread (sigwait): no handler has to run
    # between two bytecodes, which compiled code (Nuitka) does not guarantee.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # inherited by every thread below
    admin = AdminServer(
        options.admin_addr,
        {  # kubert's admin endpoints and answers
            "/live": admin_server.probe(lambda: True, b"alive\n"),
            "/ready": admin_server.probe(lambda: controller.ready, b"ready\n", b"not ready\n"),
            "/metrics": admin_server.metrics(metrics.render, CONTENT_TYPE),
        },
    )
    admin.start()
    log(DEBUG, "kubert::admin", "Serving", port=admin.port)
    controller.start()
    signum = signal.sigwait(stop_signals)
    log(
        INFO,
        "kubert::shutdown",
        "Received signal, shutting down",
        signal=signal.Signals(signum).name,
    )
    controller.stop()
    admin.stop()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    return EXIT_OK
