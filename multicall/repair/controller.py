"""The repair controller's two threads: the watcher (kube-rs's list/watch of this node's
injected pods, kubert's error handling) feeds a bounded queue; the worker (upstream's
process_pods) repairs in place when asked and possible, else deletes, and announces each
with an Event. The applet wires it (applets/linkerd_cni_repair_controller.py)."""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.core.backoff import Backoff
from multicall.core.repair import policy
from multicall.core.tracing_log import LEVELS
from multicall.errors import KubeError

if TYPE_CHECKING:
    from multicall.core.kube.kubeconfig import KubeConfig
    from multicall.core.kube.watch import Event, WatchCursor
    from multicall.core.openmetrics import Counter, Histogram
    from multicall.core.repair.cli import Options
    from multicall.effects.kube.stream import ClientOptions, Session, Token
    from multicall.plugin.in_place import Repairer
    from multicall.repair.logger import TracingLogger
    from multicall.repair.metrics import Metrics

RECENT_UIDS = 4096  # pods deleted lately: never deleted twice, whatever the event order
TRACE, DEBUG, INFO, WARN = LEVELS["trace"], LEVELS["debug"], LEVELS["info"], LEVELS["warn"]
CONTROLLER = policy.LOG_TARGET
STREAM = "kubert::errors"  # where kubert logs a failed watch ("stream failed")
WATCHER = "kube_runtime::watcher"


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
        logger: TracingLogger,
        metrics: Metrics,
        *,
        repairer: Repairer | None = None,
    ) -> None:
        from multicall.effects.kube.stream import Session, Token

        self.options = options
        self.logger = logger
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
        self.pod_events = 0  # pod events of watches (the watcher's progress, run_watch)
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
        # core/backoff.py: `--error-delay` is the first delay, client-go's reflector the rest.
        # Progress is a watch that delivered a pod event (not only BOOKMARKs) or stayed open
        # a second or more; a LIST, a bookmark or a 410 is not, so neither a bookmark-only
        # watch that ends at once nor a 410 answered to every watch can loop unthrottled.
        backoff = Backoff(initial=self.options.error_delay)
        while not self.stopping.is_set():
            before = self.pod_events
            try:
                progressed = self.step(cursor)
            except KubeError as exc:
                if self.stopping.is_set():
                    return
                status = getattr(exc, "status", 0)
                if status == 403:  # missing RBAC: kube-rs warns, so it shows by default
                    stage = "list" if cursor.phase is Phase.LIST else "initlist"
                    self.logger(WARN, WATCHER, f"watch {stage} error with 403", error=exc.message)
                if status:
                    cursor.request_failed(status)
                elif cursor.phase is Phase.LIST:
                    cursor.relist()
                self.logger(INFO, STREAM, "stream failed", error=exc.message)
                progressed = self.pod_events > before  # a watch cut after its events
            if progressed is None:
                continue  # a LIST page: the WATCH after it decides
            if progressed:
                backoff.progressed()
                continue
            delay = backoff.failed(time.monotonic(), random.random())  # noqa: S311 - jitter
            if delay:
                self.stopping.wait(delay)

    def step(self, cursor: WatchCursor) -> bool | None:
        """One LIST page (None), or one WATCH until it ends: whether it made progress."""
        from multicall.core.kube.watch import Phase, parse_watch_event
        from multicall.effects.kube.stream import list_page

        if cursor.phase is Phase.LIST:
            for event in cursor.list_page(list_page(self.watch_session, cursor.request())):
                self.handle(event)
            self.delivered += 1
            return None
        started, progressed = time.monotonic(), False
        for line in self.watch_session.watch_lines(cursor.request(), cursor.timeout_seconds):
            if self.stopping.is_set():
                return True
            if line is None:
                self.logger(WARN, CONTROLLER, "Dropped a watch event larger than 4 MiB")
                continue
            for event in cursor.watch_event(parse_watch_event(line)):
                self.handle(event)
                progressed = True  # a pod event (a BOOKMARK yields none)
                self.pod_events += 1
            self.delivered += 1
        # client-go's "very short watch": under a second and nothing in it is a failure
        return progressed or time.monotonic() - started >= 1.0

    def handle(self, event: Event) -> None:
        from multicall.core.kube.watch import Kind

        self.logger(TRACE, CONTROLLER, "event", evt=event.kind.value)
        if event.kind is Kind.INIT_DONE:
            self.ready = True
        if event.kind in (Kind.APPLY, Kind.INIT_APPLY) and event.object is not None:
            self.consider(event.object)

    def consider(self, pod: Mapping[str, object]) -> None:
        """upstream's process_events for one applied pod."""
        verdict = policy.verdict(pod)
        if verdict is policy.Verdict.NO_STATUS:
            self.logger(INFO, CONTROLLER, "Skipped, no status")
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
                self.logger(
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
                self.logger(WARN, CONTROLLER, timed_out, **where)
                counters[0].inc()
            else:
                self.logger(WARN, CONTROLLER, failed, err=exc.message, **where)
                counters[1].inc()
            return False
        if done:
            self.logger(INFO, CONTROLLER, done, namespace=ref.namespace, name=ref.name)
        latency.observe(time.monotonic() - started)
        return True

    def try_repair(self, work: Work) -> bool:
        assert self.repairer is not None
        ref = work.ref
        outcome = self.repairer.repair(work.pod)
        where = {"namespace": ref.namespace, "name": ref.name}
        if not outcome.repaired:
            reason = outcome.reason
            self.logger(
                INFO, CONTROLLER, "Cannot repair in place, deleting", **where, reason=reason
            )
            self.metrics.pods_repair_skipped.inc()
            return False
        self.logger(INFO, CONTROLLER, "Repaired pod in place", **where, netns=outcome.netns)
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
