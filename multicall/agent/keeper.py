"""The node agent's keeper: every recorded sandbox keeps the redirect its ADD programmed.

What it watches: the record of every sandbox programmed through the agent (or repaired by
the keeper), in the node's record directory (effects/sandbox_records.py; the agent's worker
writes one after each ADD that programmed rules and removes it on DEL). Each record says
what the sandbox must hold (core/keeper.py). For nf_tables sandboxes (`iptables-mode` nft or
nftables) it holds a netlink socket made inside the pod's netns and subscribed to the
kernel's nf_tables notifications (effects/nft_events.py): no dump runs while nothing
changes. x_tables (legacy, plain) has no notifications: those sandboxes are compared in a
periodic sweep, at most `MAX_SWEEP` per pass.

What it compares: CHECK's own comparison (`commands.drifted_families`) of the live tables
with what the record's options make, after every notification and sweep.

What it repairs, and why that is safe: the plugin's own ADD, run in the sandbox through
the seam (plugin/in_place.py: the node's current linkerd-cni entry, the CNI_* values of the
record, the netns opened once and checked to hold the pod's IP), which replaces the owned
chains in one transaction and is then verified. Never for a netns whose pod is gone, being
deleted or replaced by another UID (asked of the API first), nor for a netns that is no longer
the recorded one (device and inode), and never more than the back-off allows
(core/keeper.BackOff): after that, drift is reported only. Mode `report` never repairs.

Threads: one. The loop waits in poll(2) on the notification sockets, an inotify watch on
the record directory and a stop pipe; the timeout is the next sweep or scheduled repair.
Its metrics go to the agent's parent as snapshots (agent/keeper_process.py rule 4).

It is one file (~600 lines) because the watch list, the back-off state and the metrics are
one loop's state that detection, adoption and repair all change on each turn; the API
adapters and `note_request` at its end are the few lines that use the keeper's types.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from multicall.core.firewall.model import Mode
from multicall.core.keeper import (
    BackOff,
    KeeperMetrics,
    KeeperMode,
    Reason,
    Refusal,
    SandboxRecord,
)

if TYPE_CHECKING:
    from multicall.agent.pod_cache import Ask
    from multicall.core.repair.sandbox import CacheEntry
    from multicall.effects.inotify import Inotify
    from multicall.effects.kube.stream import Session
    from multicall.effects.nft_events import NftEvents
    from multicall.effects.pod_sandbox import SandboxFinder
    from multicall.effects.sandbox_records import RecordStore
    from multicall.plugin.commands import FamilyDrift
    from multicall.plugin.in_place import Repairer
    from multicall.plugin.ports import Firewall
    from multicall.plugin.recording import Programmed

Log = Callable[[str, str], None]  # (level, message)
EVENT_REASON = "LinkerdCNIRedirectDrifted"
EVENT_NOTE_MAX = 1000  # events.k8s.io/v1 `note` is at most 1 kB
MAX_SWEEP = 512  # x_tables sandboxes compared per sweep
EVENT_DRIFT = (Mode.NFT, Mode.NFTABLES)  # backends whose changes the kernel announces
RESEND = 0.25  # seconds before a snapshot the parent had no room for is sent again


class EventSink(Protocol):
    """Posts a Kubernetes Event about a pod (the agent's API identity); False: there is no
    API to post it to."""

    def post(self, record: SandboxRecord, action: str, note: str) -> bool: ...


class PodState(Protocol):
    """Whether the recorded pod still runs: None when it does, else why not."""

    def gone(self, record: SandboxRecord) -> Refusal | None: ...


@dataclass(slots=True)
class Watched:
    """One recorded sandbox the keeper watches."""

    record: SandboxRecord
    path: str  # its netns as this process sees it
    identity: tuple[int, int]  # (device, inode) of that netns when watching began
    events: NftEvents | None = None
    repairs: tuple[float, ...] = ()  # when it was repaired (the back-off's input)
    due: float | None = None  # a repair waiting for its back-off delay
    backed_off: bool = False  # reported as no longer repaired, until the window passes
    changed_at: float = 0.0  # when the change a scheduled repair is for was noticed


@dataclass(slots=True)
class Keeper:
    """Keeps every recorded sandbox redirected: watches, compares, repairs (module doc)."""

    store: RecordStore
    finder: SandboxFinder  # the node's CNI config dir, host root: where ADD's entry is
    repairer: Repairer
    firewall: Firewall
    events: EventSink
    pods: PodState
    log: Log
    mode: KeeperMode = KeeperMode.REPAIR
    sweep_every: float = 10.0
    backoff: BackOff = field(default_factory=BackOff)
    clock: Callable[[], float] = time.monotonic
    metrics: KeeperMetrics = field(default_factory=KeeperMetrics)
    watched: dict[str, Watched] = field(default_factory=dict)  # by record key
    by_fd: dict[int, str] = field(default_factory=dict)
    next_sweep: float = 0.0
    passed_over: dict[str, float] = field(default_factory=dict)  # cache files not adopted
    report_fd: int = -1  # where the metrics snapshots go (the agent's parent); -1: nowhere
    unsent: bytes = b""  # a snapshot the parent's socket had no room for yet
    sent: bytes = b""

    # ------------------------------------------------------------------ the loop

    def run(self, stop_fd: int) -> None:
        """Until `stop_fd` is readable (or closed)."""
        from multicall.effects.inotify import (
            IN_CLOSE_WRITE,
            IN_DELETE,
            IN_MOVED_FROM,
            IN_MOVED_TO,
            Inotify,
        )

        self.store.ready()
        with Inotify() as notify:
            notify.add_watch(
                self.store.directory, IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM
            )
            self.resync()
            self.discover()
            poll = select.poll()
            poll.register(stop_fd, select.POLLIN)
            poll.register(notify.fileno(), select.POLLIN)
            registered: set[int] = set()
            self.next_sweep = self.clock() + self.sweep_every
            while True:
                for fd in set(self.by_fd) - registered:
                    poll.register(fd, select.POLLIN)
                for fd in registered - set(self.by_fd):
                    with contextlib.suppress(KeyError):
                        poll.unregister(fd)
                registered = set(self.by_fd)
                self.publish()  # what this turn changed, before waiting again
                ready = poll.poll(self.timeout_ms())
                now = self.clock()
                for fd, _mask in ready:
                    if fd == stop_fd:
                        self.close()
                        return
                    if fd == notify.fileno():
                        self.records_changed(notify)
                    elif fd in self.by_fd:
                        self.notified(self.by_fd[fd], now)
                self.run_due(self.clock())
                if self.clock() >= self.next_sweep:
                    self.sweep()

    def timeout_ms(self) -> int:
        now = self.clock()
        wake = [self.next_sweep, *(w.due for w in self.watched.values() if w.due is not None)]
        if self.unsent:
            wake.append(now + RESEND)
        return max(0, int((min(wake) - now) * 1000) + 1)

    def publish(self) -> None:
        """The metrics to the agent's parent when they changed since the last snapshot sent
        (nothing while nothing happens); a full socket is tried again after RESEND."""
        from multicall.core.keeper import encode_metrics

        if self.report_fd < 0:
            return
        snapshot = encode_metrics(self.metrics, os.getpid())
        if snapshot == self.sent:
            self.unsent = b""
            return
        try:
            os.write(self.report_fd, snapshot)
        except (BlockingIOError, InterruptedError):
            self.unsent = snapshot
            return
        except OSError:  # the agent is gone: the stop pipe ends this loop
            self.report_fd = -1
            return
        self.sent, self.unsent = snapshot, b""

    def close(self) -> None:
        for key in list(self.watched):
            self.unwatch(key)

    # ------------------------------------------------------------------ what is watched

    def records_changed(self, notify: Inotify) -> None:
        events = notify.read_events()
        if any(e.overflowed for e in events):
            self.resync()
            return
        for name in {e.name for e in events if e.name}:
            self.reload(name)

    def resync(self) -> None:
        """Every record in the directory watched; watches without a record dropped."""
        keys = set(self.store.keys())
        for key in set(self.watched) - keys:
            self.unwatch(key)
        for key in sorted(keys):
            self.reload(key)

    def reload(self, key: str) -> None:
        record = self.store.read(key)
        current = self.watched.get(key)
        if record is None:
            if current is not None:
                self.unwatch(key)  # DEL: the record went, so does the watch
            return
        if current is not None and current.record == record:
            return
        if current is not None:
            self.unwatch(key)
        self.watch(record)

    def watch(self, record: SandboxRecord, repairs: tuple[float, ...] = ()) -> None:
        """`repairs`: the back-off's history when a record is replaced (follow)."""
        from multicall.effects.ns import ns_identity, open_netns
        from multicall.effects.pod_sandbox import Refused
        from multicall.errors import NetnsError

        try:
            path = self.finder.host_path(record.netns)
            fd = open_netns(path)
        except (Refused, NetnsError) as exc:
            # No such file in a directory this process sees (Refused: host_path found none;
            # NetnsNotFound), or a file there that is no namespace (errno None: a bind mount
            # a reboot took): the sandbox is gone and never comes back under this record.
            # A directory it does not see (a mount missing), or another error (EACCES),
            # says nothing about the sandbox: the record is kept.
            gone = exc.errno is None if isinstance(exc, NetnsError) else True
            if gone and self.finder.netns_dir_visible(record.netns):
                self.prune(record, f"its network namespace is gone ({exc})")
            else:
                self.log("info", f"keeper: not watching {record.key}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - OSError and friends: kept, not watched
            self.log("info", f"keeper: not watching {record.key}: {exc}")
            return
        try:
            watched = Watched(record, path, ns_identity(fd), repairs=repairs)
            if record.mode in EVENT_DRIFT:
                from multicall.effects.nft_events import NftEvents

                try:
                    watched.events = NftEvents.subscribe(fd, path)
                except OSError as exc:
                    self.log("warning", f"keeper: no nf_tables events for {record.key}: {exc}")
        finally:
            os.close(fd)
        self.watched[record.key] = watched
        if watched.events is not None:
            self.by_fd[watched.events.fileno()] = record.key
        self.count_watched()
        self.log("debug", f"keeper: watching {_pod(record)} in {record.netns}")
        self.check(watched, self.clock())  # drift since the ADD, or across an agent restart

    def unwatch(self, key: str) -> None:
        watched = self.watched.pop(key, None)
        if watched is None:
            return
        if watched.events is not None:
            self.by_fd.pop(watched.events.fileno(), None)
            watched.events.close()
        self.count_watched()
        self.log("debug", f"keeper: no longer watching {key}")

    def count_watched(self) -> None:
        from multicall.core.keeper import VIA

        via = ("events" if w.events is not None else "sweep" for w in self.watched.values())
        counts = dict.fromkeys(VIA, 0)
        for name in via:
            counts[name] += 1
        self.metrics.watched = counts

    # ------------------------------------------------------------------ detection

    def notified(self, key: str, now: float) -> None:
        watched = self.watched.get(key)
        if watched is None or watched.events is None:
            return
        try:
            changed = watched.events.drain()
        except OSError as exc:
            self.log("warning", f"keeper: {key}: reading nf_tables events failed: {exc}")
            changed = True
        if changed:
            self.check(watched, now)

    def discover(self) -> None:
        """Sandboxes in the runtime's CNI result cache that no record names: the ones whose
        ADD ran without linkerd-cni in the chain (after a reboot, before install-cni re-chained
        it) or one-shot. Each is programmed in place through the seam, whose ADD decides from
        the API whether the pod is meshed at all; one that is not, or cannot be programmed
        yet (the chain still incomplete), is passed over for the back-off window. Bounded:
        at most MAX_SWEEP cache files per pass."""
        from multicall.core.repair.sandbox import parse_cache_entry
        from multicall.effects.fs import read_file

        if self.mode is not KeeperMode.REPAIR or not self.finder.cache_dir:
            return  # "": the agent was not told where the runtime's cache is
        results = os.path.join(self.finder.cache_dir, "results")
        try:
            names = sorted(os.listdir(results))[: MAX_SWEEP * 4]
        except OSError:
            return
        recorded = {w.record.container_id for w in self.watched.values()}
        now = self.clock()
        tried = 0
        for name in names:
            since = self.passed_over.get(name)
            if since is not None and now - since < self.backoff.window:
                continue
            try:
                data = read_file(os.path.join(results, name), 1024 * 1024, follow=False)
            except Exception:  # noqa: BLE001 - not a regular small file: not a cache entry
                data = None
            entry = parse_cache_entry(data) if data is not None else None
            if entry is None or entry.container_id in recorded:
                continue
            if tried >= MAX_SWEEP:
                break
            tried += 1
            if not self.adopt(entry):
                self.passed_over[name] = now
        for name in set(self.passed_over) - set(names):
            del self.passed_over[name]  # the sandbox is gone

    def adopt(self, entry: CacheEntry) -> bool:
        """The plugin's ADD in place for an unrecorded sandbox, then its record (watched
        from then on); False when it was not programmed (logged at debug: most are pods
        that are not meshed)."""
        from multicall.core.keeper import record_from_sandbox
        from multicall.effects.pod_sandbox import Sandbox

        started = self.clock()
        try:
            path = self.finder.host_path(entry.netns)
            found = Sandbox(entry, path, self.finder.plugin_config(entry.network))
            done = self.repairer.repair_sandbox(found, entry.ips)
        except Exception as exc:  # noqa: BLE001 - Refused and every CniboxError: passed over
            self.log("debug", f"keeper: sandbox {entry.container_id} not programmed: {exc}")
            return False
        record = record_from_sandbox(
            entry, mode=done.mode, families=done.families, options=done.options
        )
        if record is None:
            return False
        self.metrics.count_drift((Reason.NEVER_PROGRAMMED,))
        self.metrics.count_repair((Reason.NEVER_PROGRAMMED,))
        self.metrics.repair_latency.observe(max(0.0, self.clock() - started))
        self.log("info", f"keeper: {_pod(record)}: its sandbox had no record; programmed in place")
        self.post(record, "Repairing", "The pod's sandbox was not recorded as programmed by "
                  "linkerd-cni (e.g. it started while linkerd-cni was missing from the CNI "
                  "chain); linkerd-cni's ADD programmed it in place and it verifies.")  # fmt: skip
        try:
            self.store.write(record)
        except Exception as exc:  # noqa: BLE001 - watched without a record until restart
            self.log("warning", f"keeper: cannot record {record.key}: {exc}")
        self.watch(record)
        return True

    def sweep(self) -> None:
        """x_tables sandboxes compared; every sandbox's netns checked to still be there;
        unrecorded sandboxes looked for."""
        self.metrics.sweeps += 1
        self.next_sweep = self.clock() + self.sweep_every
        compared = 0
        for key in list(self.watched):
            watched = self.watched.get(key)
            if watched is None or self.vanished(watched):
                continue
            if watched.events is None and compared < MAX_SWEEP:
                compared += 1
                self.check(watched, self.clock())
        self.discover()

    def vanished(self, watched: Watched) -> bool:
        """The recorded netns is gone or another one (the runtime tore the sandbox down
        without a DEL the agent saw): the record and the watch go."""
        from multicall.effects.ns import ns_identity

        try:
            same = ns_identity(watched.path) == watched.identity
        except OSError:
            same = False
        if not same:
            self.unwatch(watched.record.key)
            self.prune(watched.record, "its sandbox is gone")
        return not same

    def prune(self, record: SandboxRecord, why: str) -> None:
        """The record of a sandbox that no longer exists goes (a DEL the agent never saw, a
        node reboot): nothing is compared or repaired for it."""
        self.log("info", f"keeper: {_pod(record)}: record {record.key} removed: {why}")
        self.metrics.pruned += 1
        try:
            self.store.remove(record.key)
        except Exception as exc:  # noqa: BLE001 - OSError: logged; read again at restart
            self.log("warning", f"keeper: cannot remove the record {record.key}: {exc}")

    def check(self, watched: Watched, since: float) -> None:
        """Compare the live tables with the record; report or repair what drifted."""
        found = self.compare(watched)
        if found is None:
            return
        if not found:
            watched.due = None
            return
        reasons = tuple(sorted({r for f in found for r in f.reasons}, key=lambda r: r.value))
        self.metrics.count_drift(reasons)
        self.metrics.detection.observe(max(0.0, self.clock() - since))
        what = _what(reasons)
        diff = "\n".join(f"{f.family.value}:\n{f.text}" for f in found)
        self.log("warning", f"keeper: {_pod(watched.record)}: the redirect drifted ({what})")
        self.log("debug", f"keeper: {watched.record.key}: {diff}")
        if self.mode is KeeperMode.REPORT:
            self.metrics.count_refusal(Refusal.MODE_REPORT)
            self.post(watched.record, "Reporting", f"The redirect rules drifted ({what}); "
                      f"mode report leaves them alone.\n{diff}")  # fmt: skip
            return
        self.schedule(watched, reasons, diff, since)

    def compare(self, watched: Watched) -> list[FamilyDrift] | None:
        """The drifted families (empty: none); None when the sandbox could not be read."""
        from multicall.effects.ns import NetnsRef, ns_identity, open_netns
        from multicall.plugin.commands import drifted_families

        record = watched.record
        try:
            fd = open_netns(watched.path)
        except Exception:  # noqa: BLE001 - gone: the sweep's check drops it
            return None
        try:
            if ns_identity(fd) != watched.identity:
                return None
            return drifted_families(
                self.firewall,
                NetnsRef(watched.path, fd=fd),
                record.options,
                mode=record.mode,
                families=record.families,
                log=lambda _line: None,
            )
        except Exception as exc:  # noqa: BLE001 - a CniboxError or OSError: logged, kept
            self.log("warning", f"keeper: {record.key}: cannot read its tables: {exc}")
            return None
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ repair

    def schedule(
        self, watched: Watched, reasons: tuple[Reason, ...], diff: str, since: float
    ) -> None:
        now = self.clock()
        what = _what(reasons)
        watched.repairs = self.backoff.trim(watched.repairs, now)
        delay = self.backoff.delay(watched.repairs, now)
        if delay is None:
            self.metrics.count_refusal(Refusal.BACKED_OFF)
            if not watched.backed_off:
                watched.backed_off = True
                self.post(watched.record, "Reporting",
                          f"The redirect rules drifted ({what}) again after "
                          f"{len(watched.repairs)} repairs; no more repairs for "
                          f"{self.backoff.window:.0f}s (a deliberate change is not fought).\n"
                          f"{diff}")  # fmt: skip
            return
        watched.backed_off = False
        if delay > 0:
            if watched.due is None:
                self.metrics.repairs_delayed += 1
                watched.changed_at = since
            watched.due = now + delay
            return
        self.repair(watched, reasons, since)

    def run_due(self, now: float) -> None:
        for watched in list(self.watched.values()):
            if watched.due is not None and watched.due <= now:
                watched.due = None
                self.check(watched, watched.changed_at)  # still drifted? repaired now

    def repair(self, watched: Watched, reasons: tuple[Reason, ...], since: float) -> None:
        """`since`: when the change was noticed (the repair latency's start)."""
        from multicall.core.repair.sandbox import CacheEntry
        from multicall.effects.pod_sandbox import Sandbox

        record = watched.record
        what = _what(reasons)
        try:
            gone = self.pods.gone(record)
        except Exception as exc:  # noqa: BLE001 - KubeError, OSError: not repaired blind
            self.log("warning", f"keeper: {_pod(record)}: cannot ask for the pod: {exc}")
            gone = Refusal.POD_UNKNOWN
        if gone is not None:
            self.log("info", f"keeper: {_pod(record)}: not repaired: {gone.text}")
            self.metrics.count_refusal(gone)
            return
        watched.repairs = (*watched.repairs, self.clock())
        entry = CacheEntry(
            container_id=record.container_id,
            network=record.network,
            ifname=record.ifname,
            netns=record.netns,
            args=record.args,
            ips=record.ips,
        )
        try:
            found = Sandbox(entry, watched.path, self.finder.plugin_config(record.network))
            done = self.repairer.repair_sandbox(found, record.ips)
        except Exception as exc:  # noqa: BLE001 - Refused and every CniboxError are reported
            self.metrics.repair_failures += 1
            self.log("warning", f"keeper: {_pod(record)}: repair failed: {exc}")
            self.post(record, "Reporting", f"The redirect rules drifted ({what}); "
                      f"repairing them in place failed: {exc}")  # fmt: skip
            return
        self.metrics.count_repair(reasons)
        self.metrics.repair_latency.observe(max(0.0, self.clock() - since))
        self.log("info", f"keeper: {_pod(record)}: repaired in place ({what})")
        self.post(record, "Repairing", f"The redirect rules drifted ({what}); "
                  "linkerd-cni's ADD re-programmed them in place and they verify.")  # fmt: skip
        self.follow(watched, done)

    def follow(self, watched: Watched, done: Programmed) -> None:
        """A repair programs the node's linkerd-cni entry as it is now. When that differs from
        the record (the entry's iptables-mode or options changed since the pod's ADD), the
        record follows what was programmed: compared with the old expectation, the sandbox
        would drift again at once and be re-programmed on every check until the back-off
        stopped it. The back-off's history goes with it."""
        import dataclasses

        record = watched.record
        now = (done.mode, done.families, done.options)
        if now == (record.mode, record.families, record.options):
            return
        followed = dataclasses.replace(
            record, mode=done.mode, families=done.families, options=done.options
        )
        self.log("info", f"keeper: {_pod(record)}: recorded as programmed now "
                 f"({record.mode.value} -> {done.mode.value})")  # fmt: skip
        try:
            self.store.write(followed)
        except Exception as exc:  # noqa: BLE001 - watched as programmed until a restart
            self.log("warning", f"keeper: cannot record {record.key}: {exc}")
        self.unwatch(record.key)
        self.watch(followed, repairs=watched.repairs)

    def post(self, record: SandboxRecord, action: str, note: str) -> None:
        try:
            if self.events.post(record, action, note[:EVENT_NOTE_MAX]):
                self.metrics.count_event(action)
        except Exception as exc:  # noqa: BLE001 - an Event is best effort: counted, logged
            self.metrics.events_failed += 1
            self.log("warning", f"keeper: cannot post an Event for {_pod(record)}: {exc}")


def _pod(record: SandboxRecord) -> str:
    return f"{record.namespace}/{record.pod}"


def _what(reasons: tuple[Reason, ...]) -> str:
    return ", ".join(r.value for r in reasons) or "changed"


# ----------------------------------------------------------------------------- API adapters


@dataclass(slots=True)
class ApiEvents:
    """Events through the agent's stream session (effects/kube/stream.py), as it is now
    (agent/identity.py `Sessions`: made again when the agent's kubeconfig changed)."""

    session: Callable[[], Session]
    instance: str
    timeout: float = 5.0

    def post(self, record: SandboxRecord, action: str, note: str) -> bool:
        from multicall.core.repair.policy import PodRef, event_document
        from multicall.effects.kube.stream import create_event

        ref = PodRef(record.namespace, record.pod, record.uid, "")
        doc = event_document(
            ref, self.instance, time.time_ns(), action=action, note=note, reason=EVENT_REASON
        )
        doc["reportingController"] = "linkerd-cni-agent"
        create_event(self.session(), record.namespace, doc, self.timeout)
        return True


@dataclass(slots=True)
class ApiPods:
    """Asks the API whether the recorded pod still runs (one GET, before a repair)."""

    session: Callable[[], Session]

    def gone(self, record: SandboxRecord) -> Refusal | None:
        from multicall.core.kube import paths

        answer = self.session().request("GET", paths.pod(record.namespace, record.pod))
        if answer.status == 404:
            return Refusal.POD_GONE
        if answer.status != 200:
            return Refusal.POD_UNKNOWN
        from multicall.core.keeper import pod_gone

        return pod_gone(answer.json(), record.uid)


@dataclass(slots=True)
class CachedPods:
    """`ApiPods` with the parent's pod cache asked first (agent/pod_cache.py rule 4): a
    record of the pod with the recorded UID answers (terminating: the same refusal as the
    API's object); anything else (no record, another UID, the cache not synced, live or of
    this cluster, no answer in time) is the API's GET, as without a cache. Another UID is
    not taken as "replaced": a cache a moment behind could hold the older pod."""

    api: ApiPods
    ask: Ask
    cluster: Callable[[], str]

    def gone(self, record: SandboxRecord) -> Refusal | None:
        from multicall.agent.pod_cache import ask_cache
        from multicall.core.keeper import pod_gone

        if record.uid:
            question: dict[str, object] = {
                "what": "pod", "ns": record.namespace, "name": record.pod, "uid": record.uid
            }  # fmt: skip
            found = ask_cache(self.ask, question, self.cluster())
            if not isinstance(found, str):
                return pod_gone(found, record.uid)
        return self.api.gone(record)


# ----------------------------------------------------------------------------- the record


def note_request(
    store: RecordStore,
    env: Mapping[str, str],
    config: bytes,
    programmed: Programmed | None,
    exit_code: int,
) -> str:
    """After the agent served a request: an ADD that programmed rules is recorded (what the
    sandbox must hold from now on), a DEL removes the record (the keeper stops watching).
    Returns what happened, for the worker's log ("" for nothing); never raises: a record
    that cannot be written leaves the pod unwatched, not its ADD failed."""
    from multicall.core.keeper import record_from_add, record_key

    command = env.get("CNI_COMMAND", "")
    try:
        if command == "DEL":
            key = record_key(env.get("CNI_CONTAINERID", ""), env.get("CNI_IFNAME", ""))
            return "record removed" if store.remove(key) else ""
        if command != "ADD" or exit_code != 0 or programmed is None:
            return ""
        record = record_from_add(
            env,
            config,
            mode=programmed.mode,
            families=programmed.families,
            options=programmed.options,
        )
        if record is None:
            return "not recorded: the request does not identify its sandbox"
        store.ready()
        store.write(record)
    except Exception as exc:  # noqa: BLE001 - CniboxError, OSError: the ADD stands
        return f"cannot record the sandbox: {exc}"
    return "recorded"
