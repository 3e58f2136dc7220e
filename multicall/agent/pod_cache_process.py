"""The pod cache's process: lists and watches this node's pods, the namespaces and the
`default/kubernetes` service with the agent's own API identity, and feeds what it sees to
the agent's parent through a pipe, one JSON line per message (core/kube/pod_cache.py
`PodCache.feed`). docs/pod-cache.md.

Rules of this module:
1. It is a child of the agent forked before the server binds (as the keeper is,
   agent/keeper_process.py), so the parent stays one thread and no decode of a LIST ever
   holds its loop: the parent reads short lines of records already reduced here. A
   supervisor restarts a watcher that dies (the keeper's back-off); while none runs, the
   parent hears no beat and the cache answers nothing (core/kube/pod_cache.BEAT_MAX).
2. Three watches, one thread each (a watch blocks in its read): pods with `spec.nodeName` of
   this node, the namespaces, and the `kubernetes` service of `default` (field selector
   `metadata.name=kubernetes`: one object). kube-rs's watcher (core/kube/watch.py
   `WatchCursor`) on the repair controller's client (effects/kube/stream.py): paginated
   LIST, WATCH from its resourceVersion with bookmarks, 410 Gone -> LIST again. A failed
   or oversized step is reported as "down" and is followed by a fresh LIST (not a resumed
   watch): a LIST that completes is what proves the cache whole again; a watch that ends
   cleanly (its timeoutSeconds) resumes from its resourceVersion and the cache stays live.
3. The main thread writes a beat every BEAT seconds while every watch thread runs (a thread
   that died ends the process: no beat covers a dead watch); all writes go through one lock
   (a line may exceed PIPE_BUF). A parent that stops reading blocks the watches, never grows
   memory.
4. The process ends with the agent: EOF on its stop pipe, or PR_SET_PDEATHSIG.
5. Its identity (docs/pod-cache.md): the service account's configuration, loaded by the
   agent's start, or `--kubeconfig PATH`, loaded here (agent/identity.py): a file that does
   not exist or cannot be used yet is waited for (logged once, retried on the back-off,
   the parent told so: its `identity_waiting` gauge) and never fails the agent. A rewritten
   file is loaded again at the next connect of each watch (a LIST page or a WATCH, and
   every reconnect after a failure); one naming another API server or trust ends this
   process, so the supervisor's next one lists from nothing under the new identity (the
   parent drops what it held when the cluster changes: core/kube/pod_cache.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from multicall.agent.keeper_process import (
    STOP_WAIT,
    _in_child,
    _orphan_guard,
    _wait,
    restart_loop,
)
from multicall.agent.pod_cache import config_identity
from multicall.core.kube.pod_cache import (
    BEAT,
    MAX_RECORD,
    NAMESPACES,
    PODS,
    REDUCE,
    WATCHES,
    record_size,
)

if TYPE_CHECKING:
    from multicall.core.kube.kubeconfig import KubeConfig
    from multicall.core.kube.watch import WatchCursor
    from multicall.effects.kube.stream import Session

Log = Callable[[str, str], None]  # (level, message)
Send = Callable[[Mapping[str, object]], None]
Identity = Callable[[], "tuple[KubeConfig, int]"]  # the configuration and its generation
ERROR_DELAY = 0.5  # the first retry after a failure; doubled up to MAX_ERROR_DELAY
MAX_ERROR_DELAY = 30.0
WATCH_TIMEOUT = 290  # kube-rs's timeoutSeconds


@dataclass(frozen=True, slots=True)
class CacheJob:
    """What the cache process watches, with which identity, and where it logs."""

    config: KubeConfig | None  # the service account's; None: load `kubeconfig` (rule 5)
    kubeconfig: str  # --kubeconfig PATH, loaded lazily in the process; "" with `config`
    node: str
    log: Log


@dataclass(slots=True)
class PodCacheProcess:
    """The supervisor as the agent's parent sees it: its pid, the stop pipe's write end, and
    the feed's read end (non-blocking), which the parent's loop polls."""

    pid: int
    stop_w: int
    feed_r: int

    @classmethod
    def start(
        cls, config: KubeConfig | None, kubeconfig: str, node: str, log: Log
    ) -> PodCacheProcess:
        stop_r, stop_w = os.pipe2(os.O_CLOEXEC)
        feed_r, feed_w = os.pipe2(os.O_CLOEXEC)
        agent = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - in the child
            os.close(stop_w)
            os.close(feed_r)
            job = CacheJob(config, kubeconfig, node, log)
            _in_child("pod cache supervisor", log, lambda: _supervise(job, stop_r, feed_w, agent))
        os.close(stop_r)
        os.close(feed_w)
        os.set_blocking(feed_r, False)
        log("info", f"pod cache: watching the pods of node {node} (pid {pid})")
        return cls(pid, stop_w, feed_r)

    def stop(self, log: Log) -> None:
        if self.stop_w >= 0:
            os.close(self.stop_w)
            self.stop_w = -1
        if not _wait(self.pid, STOP_WAIT + 5):
            log("warning", "pod cache: did not stop in time; killed")
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        if self.feed_r >= 0:
            os.close(self.feed_r)
            self.feed_r = -1


def _supervise(
    job: CacheJob, stop_r: int, feed_w: int, agent: int
) -> None:  # pragma: no cover - in the child
    _orphan_guard(agent)

    def child(me: int, _restarts: int) -> NoReturn:
        _in_child("pod cache", job.log, lambda: _watch(job, stop_r, feed_w, me))

    restart_loop("pod cache", stop_r, job.log, child)


def _watch(job: CacheJob, stop_r: int, feed_w: int, parent: int) -> None:  # pragma: no cover
    _orphan_guard(parent)
    lock = threading.Lock()
    stopping = threading.Event()

    def send(message: Mapping[str, object]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with lock:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(feed_w, view) :]
                except BrokenPipeError:  # the agent is gone
                    os._exit(0)

    identity = _identity(job, stop_r, send)
    send({"k": "cluster", "id": config_identity(identity()[0])})
    threads = [
        threading.Thread(
            target=run_watch,
            args=(job, identity, watch, send, stopping),
            name=f"pod cache {watch}",
            daemon=True,
        )
        for watch in WATCHES
    ]
    for thread in threads:
        thread.start()
    while not select.select([stop_r], [], [], BEAT)[0]:
        if not all(thread.is_alive() for thread in threads):
            # A watch that died of a bug must not be covered by this thread's beats: the
            # process ends, the parent hears no beat (the cache answers nothing), and the
            # supervisor starts a new one after its back-off.
            job.log("error", "pod cache: a watch thread died; restarting")
            os._exit(70)
        send({"k": "beat"})
    stopping.set()
    os._exit(0)  # the watch threads may be blocked in a read: nothing of theirs to finish


def _identity(job: CacheJob, stop_r: int, send: Send) -> Identity:  # pragma: no cover
    """Rule 5: the job's fixed configuration, or the kubeconfig's once it loaded (this
    process ends here when the agent stops first)."""
    from multicall.agent.identity import KubeconfigSource, stop_sleep

    config = job.config
    if config is not None:
        return lambda: (config, 0)
    source = KubeconfigSource(job.kubeconfig, "pod cache", job.log)
    stopped = stop_sleep(stop_r)
    told: list[bool] = []

    def sleep(seconds: float) -> bool:
        if not told:  # called only after a failed attempt: the parent's gauge turns 1
            send({"k": "identity", "waiting": True})
            told.append(True)
        return stopped(seconds)

    if source.wait(sleep) is None:
        os._exit(0)
    if told:
        send({"k": "identity", "waiting": False})
    return source.current


def cursor_for(watch: str, node: str) -> WatchCursor:
    from multicall.core.kube.watch import Selector, WatchCursor

    if watch == PODS:
        return WatchCursor(
            "/api/v1/pods", Selector(fields=f"spec.nodeName={node}"), timeout_seconds=WATCH_TIMEOUT
        )
    if watch == NAMESPACES:
        return WatchCursor("/api/v1/namespaces", Selector(), timeout_seconds=WATCH_TIMEOUT)
    return WatchCursor(  # SERVICES: the one a control-plane pod's ADD reads
        "/api/v1/namespaces/default/services",
        Selector(fields="metadata.name=kubernetes"),
        timeout_seconds=WATCH_TIMEOUT,
    )


def run_watch(
    job: CacheJob, identity: Identity, watch: str, send: Send, stopping: threading.Event
) -> None:
    """One watch until `stopping` (rule 2), on a connection of its own, made again with a
    kubeconfig loaded again (rule 5)."""
    from multicall.errors import KubeError

    config, generation = identity()
    cluster = config_identity(config)
    session = _session(config)
    cursor = cursor_for(watch, job.node)
    failures = 0
    while not stopping.is_set():
        config, now = identity()
        if now != generation:
            if config_identity(config) != cluster:
                job.log("warning", "pod cache: the agent's kubeconfig now names another API "
                        "server or trust; starting over with it")  # fmt: skip
                os._exit(0)  # rule 5: the supervisor's next process lists from nothing
            session.close()
            session, generation = _session(config), now
        try:
            step(session, cursor, watch, send)
            failures = 0
        except KubeError as exc:
            if stopping.is_set():
                return
            send({"k": "down", "w": watch})
            failures += 1
            if failures == 1 or failures % 10 == 0:
                job.log("warning", f"pod cache: {watch}: {exc.message}; listing again")
            cursor.relist()  # rule 2: only a completed LIST makes the cache live again
            delay = min(ERROR_DELAY * 2.0 ** (failures - 1), MAX_ERROR_DELAY)
            stopping.wait(delay * random.uniform(0.8, 1.2))  # noqa: S311 - jitter


def _session(config: KubeConfig) -> Session:
    from multicall.effects.kube.stream import ClientOptions, Session, Token

    return Session(config, Token(config), ClientOptions())


def step(session: Session, cursor: WatchCursor, watch: str, send: Send) -> None:
    """One LIST page, or one WATCH until it ends (KubeError when it failed)."""
    from multicall.core.kube.watch import Kind, Phase, parse_watch_event
    from multicall.effects.kube.stream import StatusError, list_page
    from multicall.errors import KubeError

    reduce = REDUCE[watch]
    try:
        if cursor.phase is Phase.LIST:
            events = cursor.list_page(list_page(session, cursor.request()))
        else:
            events = []
            for line in session.watch_lines(cursor.request(), cursor.timeout_seconds):
                if line is None:  # an event lost: the cache would miss a change
                    raise KubeError("a watch event exceeded the size limit")
                for event in cursor.watch_event(parse_watch_event(line)):
                    _send_event(send, watch, event.kind, event.object, reduce)
            return
    except StatusError as exc:
        cursor.request_failed(exc.status)
        raise
    for event in events:
        if event.kind is Kind.INIT:
            send({"k": "init", "w": watch})
        elif event.kind is Kind.INIT_DONE:
            send({"k": "done", "w": watch})
        else:
            _send_event(send, watch, event.kind, event.object, reduce)


def _send_event(
    send: Send,
    watch: str,
    kind: object,
    obj: Mapping[str, object] | None,
    reduce: Callable[[Mapping[str, object]], dict[str, object] | None],
) -> None:
    from multicall.core.kube.watch import Kind

    record = reduce(obj) if obj is not None else None
    if record is None:
        return
    if kind is not Kind.DELETE and record_size(record) > MAX_RECORD:
        # Too large to answer with (core/kube/pod_cache.py rule 2): its identity only, so
        # the parent drops an older version it may hold.
        meta = record["metadata"]
        assert isinstance(meta, dict)
        ident = {k: meta[k] for k in ("name", "namespace", "uid") if k in meta}
        send({"k": "drop", "w": watch, "o": {"metadata": ident}})
        return
    send({"k": "del" if kind is Kind.DELETE else "put", "w": watch, "o": record})
