"""The node agent's keeper, its pure part: the record of what a sandbox must hold, the
reasons a live table drifted from it, the back-off that stops a repair from fighting a
deliberate change forever, and the keeper's metric families (agent/keeper.py runs it).

Rules of this module:
1. A record is what one successful ADD programmed (plugin/recording.py `Programmed`) plus
   what a repair in place needs to run that ADD again (the runtime's CNI_* values, the
   network's name, the pod's IPs): one JSON document per sandbox, bounded in size, every
   field checked on the way back in (`decode` returns None for anything else). The file name
   is derived from the container id and interface, never from a path the caller chose.
2. Reasons are a small closed set (metric labels): what kind of difference CHECK's
   comparison found, per family.
3. Back-off: at most `attempts` repairs of one sandbox within `window` seconds, each waiting
   twice as long as the previous one; after that the keeper only reports that sandbox's
   drift until the window has passed (a deliberate change is not fought forever).
4. Metrics: the keeper runs in its own process; the agent's parent serves them. The keeper
   sends its counters as a snapshot (`encode_metrics`, one datagram) whenever they change;
   the parent decodes it (`decode_metrics`: fixed fields, fixed label sets, bounded) and
   renders the families with its own. A restarted keeper starts from zero (a counter reset,
   as after any process restart) and says how often it was restarted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from multicall.core.firewall.diff import ChainProblem, RuleProblem, RulesetDiff
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.openmetrics import Histogram, HistogramState, text_family, text_histogram
from multicall.core.repair.sandbox import CacheEntry

RECORD_VERSION = 1
MAX_RECORD_BYTES = 64 * 1024  # a record is ~1 KiB; options lists are bounded by the config's
MAX_RECORDS = 4096  # sandboxes kept per node (the kubelet's max-pods is 110 by default)
RECORD_SUFFIX = ".json"
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class KeeperMode(Enum):
    """--keeper: what the keeper does about drift."""

    OFF = "off"  # nothing is watched
    REPORT = "report"  # drift is detected, logged, counted and sent as an Event
    REPAIR = "repair"  # ... and re-programmed in place (the default)


class Reason(Enum):
    """What kind of drift a comparison found (a metric label)."""

    MISSING_TABLE = "missing_table"  # nftables: the linkerd-proxy-init table is gone
    MISSING_CHAIN = "missing_chain"
    MISSING_RULE = "missing_rule"
    FOREIGN_RULE = "foreign_rule"  # a rule that ADD does not program, in an owned chain
    REORDERED = "reordered"
    CHANGED = "changed"  # a rule replaced by another (e.g. another proxy port)
    NATIVE_CHANGED = "native_changed"  # nftables: the table differs (a text diff)
    NEVER_PROGRAMMED = "never_programmed"  # a meshed pod whose sandbox has no rules at all


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    """What one sandbox must hold, and how to program it again."""

    container_id: str
    ifname: str
    network: str
    netns: str  # CNI_NETNS as the runtime gave it (a path of the node's mount namespace)
    args: Mapping[str, str]  # CNI_ARGS, parsed
    ips: tuple[str, ...]  # the pod's addresses from prevResult: the netns must hold one
    mode: Mode
    families: tuple[Family, ...]
    options: ProxyInitOptions
    source: str = "add"  # add (the agent served the ADD) | repair (the keeper programmed it)

    @property
    def namespace(self) -> str:
        return self.args.get("K8S_POD_NAMESPACE", "")

    @property
    def pod(self) -> str:
        return self.args.get("K8S_POD_NAME", "")

    @property
    def uid(self) -> str:
        return self.args.get("K8S_POD_UID", "")

    @property
    def key(self) -> str:
        return record_key(self.container_id, self.ifname)


def record_key(container_id: str, ifname: str) -> str:
    """The record's file name; "" for ids that cannot name a file safely."""
    if not _SAFE_ID.fullmatch(container_id) or not _SAFE_ID.fullmatch(ifname or "eth0"):
        return ""
    return f"{container_id}-{ifname or 'eth0'}{RECORD_SUFFIX}"


def parse_cni_args(text: str) -> dict[str, str]:
    """CNI_ARGS (`K=V;K=V`), as skel splits it; malformed pairs are skipped here (the plugin
    already refused them before anything was programmed)."""
    pairs = (item.partition("=") for item in text.split(";") if "=" in item)
    return {key: value for key, _, value in pairs}


def prev_result_ips(config: bytes) -> tuple[str, ...]:
    """The addresses (without prefix) of the prevResult in a plugin's stdin config."""
    try:
        doc = json.loads(config)
    except ValueError:
        return ()
    prev = doc.get("prevResult") if isinstance(doc, dict) else None
    entries = prev.get("ips") if isinstance(prev, dict) else None
    ips = []
    for entry in entries if isinstance(entries, list) else []:
        address = entry.get("address") if isinstance(entry, dict) else None
        if isinstance(address, str) and address:
            ips.append(address.split("/", 1)[0])
    return tuple(ips)


def network_name(config: bytes) -> str:
    try:
        doc = json.loads(config)
    except ValueError:
        return ""
    name = doc.get("name") if isinstance(doc, dict) else None
    return name if isinstance(name, str) else ""


def record_from_add(
    env: Mapping[str, str],
    config: bytes,
    *,
    mode: Mode,
    families: tuple[Family, ...],
    options: ProxyInitOptions,
    source: str = "add",
) -> SandboxRecord | None:
    """The record of an ADD that programmed `options` (None: nothing identifies the sandbox
    well enough to watch it: no pod identity, no netns, no IP, or ids unusable as names)."""
    record = SandboxRecord(
        container_id=env.get("CNI_CONTAINERID", ""),
        ifname=env.get("CNI_IFNAME", "") or "eth0",
        network=network_name(config),
        netns=env.get("CNI_NETNS", ""),
        args=parse_cni_args(env.get("CNI_ARGS", "")),
        ips=prev_result_ips(config),
        mode=mode,
        families=families,
        options=options,
        source=source,
    )
    usable = record.key and record.netns.startswith("/") and record.ips and record.pod
    return record if usable and record.namespace and record.network else None


def record_from_sandbox(
    entry: CacheEntry,
    *,
    mode: Mode,
    families: tuple[Family, ...],
    options: ProxyInitOptions,
) -> SandboxRecord | None:
    """The record of a sandbox the keeper programmed in place (the runtime's cached ADD names
    it); None as for `record_from_add`."""
    record = SandboxRecord(
        container_id=entry.container_id,
        ifname=entry.ifname or "eth0",
        network=entry.network,
        netns=entry.netns,
        args=dict(entry.args),
        ips=entry.ips,
        mode=mode,
        families=families,
        options=options,
        source="repair",
    )
    return record if record.key and record.ips and record.pod and record.namespace else None


def encode(record: SandboxRecord) -> bytes:
    doc = {
        "version": RECORD_VERSION,
        "containerId": record.container_id,
        "ifName": record.ifname,
        "network": record.network,
        "netns": record.netns,
        "args": dict(record.args),
        "ips": list(record.ips),
        "mode": record.mode.value,
        "families": [f.value for f in record.families],
        "options": asdict(record.options),
        "source": record.source,
    }
    return json.dumps(doc, sort_keys=True).encode()


def decode(data: bytes) -> SandboxRecord | None:
    """A record as `encode` wrote it, or None (too large, another version, any field of the
    wrong type or value)."""
    if len(data) > MAX_RECORD_BYTES:
        return None
    try:
        doc = json.loads(data)
        return _decode(doc) if isinstance(doc, dict) else None
    except (ValueError, TypeError, KeyError):
        return None


def _strings(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("expected a list of strings")
    return tuple(value)


def _decode(doc: Mapping[str, object]) -> SandboxRecord | None:
    if doc.get("version") != RECORD_VERSION:
        return None
    text = {k: doc[k] for k in ("containerId", "ifName", "network", "netns", "mode", "source")}
    if not all(isinstance(v, str) for v in text.values()):
        return None
    args = doc["args"]
    if not isinstance(args, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in args.items()
    ):
        return None
    options = _options(doc["options"])
    record = SandboxRecord(
        container_id=str(text["containerId"]),
        ifname=str(text["ifName"]),
        network=str(text["network"]),
        netns=str(text["netns"]),
        args=args,
        ips=_strings(doc["ips"]),
        mode=Mode(text["mode"]),
        families=tuple(Family(f) for f in _strings(doc["families"])),
        options=options,
        source=str(text["source"]),
    )
    return record if record.key and record.families else None


def _options(value: object) -> ProxyInitOptions:
    if not isinstance(value, dict):
        raise TypeError("options")
    ints = ("incoming_proxy_port", "outgoing_proxy_port", "proxy_uid", "proxy_gid")
    for name in ints:
        if type(value[name]) is not int:
            raise TypeError(name)
    ports = value["ports_to_redirect"]
    if not isinstance(ports, list) or not all(type(p) is int for p in ports):
        raise TypeError("ports_to_redirect")
    if type(value["use_wait_flag"]) is not bool:
        raise TypeError("use_wait_flag")
    return ProxyInitOptions(
        incoming_proxy_port=value["incoming_proxy_port"],
        outgoing_proxy_port=value["outgoing_proxy_port"],
        proxy_uid=value["proxy_uid"],
        proxy_gid=value["proxy_gid"],
        ports_to_redirect=tuple(ports),
        inbound_ports_to_ignore=_strings(value["inbound_ports_to_ignore"]),
        outbound_ports_to_ignore=_strings(value["outbound_ports_to_ignore"]),
        subnets_to_ignore=_strings(value["subnets_to_ignore"]),
        use_wait_flag=value["use_wait_flag"],
    )


# ----------------------------------------------------------------------------- drift


def diff_reasons(diff: RulesetDiff) -> tuple[Reason, ...]:
    """The kinds of drift in one family's comparison (empty: none)."""
    reasons: set[Reason] = set()
    if any(c.problem is ChainProblem.MISSING for c in diff.chains):
        reasons.add(Reason.MISSING_CHAIN)
    missing, unexpected = len(diff.missing), len(diff.unexpected)
    if missing and unexpected:
        reasons.add(Reason.CHANGED)
    elif missing and Reason.MISSING_CHAIN not in reasons:
        reasons.add(Reason.MISSING_RULE)
    elif unexpected:
        reasons.add(Reason.FOREIGN_RULE)
    if any(d.problem is RuleProblem.OUT_OF_ORDER for d in diff.rules):
        reasons.add(Reason.REORDERED)
    if any(c.problem is not ChainProblem.MISSING for c in diff.chains):
        reasons.add(Reason.CHANGED)
    return tuple(sorted(reasons, key=lambda r: r.value))


def native_reasons(expected: Sequence[str], found: Sequence[str] | None) -> tuple[Reason, ...]:
    """nftables mode: the table is gone, or differs from the expected text."""
    if found is None:
        return (Reason.MISSING_TABLE,)
    return () if list(expected) == list(found) else (Reason.NATIVE_CHANGED,)


def pod_gone(pod: Mapping[str, object], uid: str) -> Refusal | None:
    """Why a pod object no longer owns the recorded sandbox (None when it does)."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    if uid and meta.get("uid") != uid:
        return Refusal.POD_REPLACED
    if meta.get("deletionTimestamp"):
        return Refusal.POD_TERMINATING
    return None


# ----------------------------------------------------------------------------- back-off


@dataclass(frozen=True, slots=True)
class BackOff:
    """Rule 3's numbers: --keeper-repair-attempts within --keeper-repair-window."""

    attempts: int = 5
    window: float = 600.0
    first_delay: float = 0.0  # the first repair runs at once
    next_delay: float = 1.0  # then 1 s, 2 s, 4 s, ...

    def delay(self, recent: Sequence[float], now: float) -> float | None:
        """Seconds to wait before the next repair given the times of the recent ones (None:
        too many within the window, report only)."""
        inside = [t for t in recent if now - t < self.window]
        if len(inside) >= self.attempts:
            return None
        if not inside:
            return self.first_delay
        due = max(inside) + self.next_delay * 2.0 ** (len(inside) - 1)
        return max(0.0, due - now)

    def trim(self, recent: Sequence[float], now: float) -> tuple[float, ...]:
        return tuple(t for t in recent if now - t < self.window)


# ----------------------------------------------------------------------------- metrics

PREFIX = "cnibox_agent_keeper_"  # beside the agent's own cnibox_agent_ families
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
VIA = ("events", "sweep")  # how the keeper learns of a change in a sandbox
EVENT_ACTIONS = ("Repairing", "Reporting")  # the Events' `action`
MAX_SNAPSHOT = 16 * 1024  # a snapshot is ~1.5 KiB: its fields are fixed (rule 4)


class Refusal(Enum):
    """Why drift was left alone (a metric label); the text is the log's and the Event's."""

    MODE_REPORT = "mode_report"
    BACKED_OFF = "backed_off"
    POD_GONE = "pod_gone"
    POD_TERMINATING = "pod_terminating"
    POD_REPLACED = "pod_replaced"
    POD_UNKNOWN = "pod_unknown"  # the API did not answer 200 or 404 for the pod

    @property
    def text(self) -> str:
        return _REFUSAL_TEXT[self]


_REFUSAL_TEXT = {
    Refusal.MODE_REPORT: "mode report leaves it alone",
    Refusal.BACKED_OFF: "repaired too often recently (back-off)",
    Refusal.POD_GONE: "the pod is gone",
    Refusal.POD_TERMINATING: "the pod is terminating",
    Refusal.POD_REPLACED: "the pod was replaced by another with the same name",
    Refusal.POD_UNKNOWN: "the API did not say whether the pod still runs",
}


def _zeros(labels: Sequence[str]) -> dict[str, int]:
    return dict.fromkeys(labels, 0)


def _latency() -> Histogram:
    return Histogram("latency", "", LATENCY_BUCKETS)


@dataclass(slots=True)
class KeeperMetrics:
    """The keeper's families (Prometheus text, as the agent's own: core/agent_metrics.py).
    Every labelled family has a fixed label set, every value present from the start (a
    series that appears only after the first drift cannot be alerted on by `rate`)."""

    watched: dict[str, int] = field(default_factory=lambda: _zeros(VIA))
    drift: dict[str, int] = field(default_factory=lambda: _zeros([r.value for r in Reason]))
    repairs: dict[str, int] = field(default_factory=lambda: _zeros([r.value for r in Reason]))
    refused: dict[str, int] = field(default_factory=lambda: _zeros([r.value for r in Refusal]))
    events: dict[str, int] = field(default_factory=lambda: _zeros(EVENT_ACTIONS))
    repair_failures: int = 0
    repairs_delayed: int = 0  # a repair that waited for its back-off delay
    events_failed: int = 0
    sweeps: int = 0
    pruned: int = 0  # records of sandboxes found gone
    restarts: int = 0  # of the keeper process by its supervisor (agent/keeper_process.py)
    detection: Histogram = field(default_factory=_latency)
    repair_latency: Histogram = field(default_factory=_latency)

    def count_drift(self, reasons: Sequence[Reason]) -> None:
        for reason in reasons:
            self.drift[reason.value] += 1

    def count_repair(self, reasons: Sequence[Reason]) -> None:
        for reason in reasons:
            self.repairs[reason.value] += 1

    def count_refusal(self, refusal: Refusal) -> None:
        self.refused[refusal.value] += 1

    def count_event(self, action: str) -> None:
        if action in self.events:
            self.events[action] += 1

    @property
    def repaired(self) -> int:
        """Sandboxes re-programmed (a repair counts once per reason: this is per sandbox)."""
        return self.repair_latency.state.count

    def render(self) -> str:
        def family(name: str, kind: str, help: str, value: float) -> str:
            return text_family(PREFIX + name, kind, help, [({}, value)])

        def labelled(name: str, kind: str, help: str, label: str, values: dict[str, int]) -> str:
            samples = [({label: k}, v) for k, v in sorted(values.items())]
            return text_family(PREFIX + name, kind, help, samples)

        return "".join(
            [
                labelled("sandboxes_watched", "gauge", "Sandboxes whose redirect the keeper "
                         "watches, by how it learns of a change.", "via", self.watched),
                labelled("drift_total", "counter", "Drift the keeper detected, by reason.",
                         "reason", self.drift),
                labelled("repairs_total", "counter", "Drift re-programmed in place and "
                         "verified, by reason.", "reason", self.repairs),
                labelled("refused_total", "counter", "Drift left alone, by reason (mode "
                         "report, back-off, the pod gone, terminating, replaced or unknown).",
                         "reason", self.refused),
                family("repair_failures_total", "counter",
                       "Repairs in place that failed or did not verify.", self.repair_failures),
                family("repairs_delayed_total", "counter", "Repairs that waited for their "
                       "back-off delay (a sandbox that drifted again soon after a repair).",
                       self.repairs_delayed),
                labelled("events_total", "counter", "Kubernetes Events the keeper posted, "
                         "by action.", "action", self.events),
                family("event_failures_total", "counter",
                       "Kubernetes Events the keeper could not post.", self.events_failed),
                family("sweeps_total", "counter", "Periodic sweeps of x_tables tables.",
                       self.sweeps),
                family("records_pruned_total", "counter", "Records of sandboxes whose network "
                       "namespace is gone (a DEL the agent did not see, a node reboot), removed.",
                       self.pruned),
                family("restarts_total", "counter",
                       "Keeper processes restarted after one exited or died.", self.restarts),
                text_histogram(
                    PREFIX + "detection_seconds",
                    "From the kernel's notification (or the sweep's start) to the drift found.",
                    [({}, self.detection)],
                ),
                text_histogram(
                    PREFIX + "repair_seconds",
                    "From the change (the kernel's notification, or the sweep's start) to the "
                    "sandbox re-programmed in place and verified.",
                    [({}, self.repair_latency)],
                ),
            ]
        )  # fmt: skip


def render_process(cpu_seconds: float, resident_bytes: int) -> str:
    """The keeper process's own cost (read by the agent's parent at the scrape)."""
    return text_family(
        PREFIX + "cpu_seconds_total",
        "counter",
        "User and system CPU time the keeper process spent.",
        [({}, cpu_seconds)],
    ) + text_family(
        PREFIX + "resident_memory_bytes",
        "gauge",
        "The keeper process's resident memory.",
        [({}, resident_bytes)],
    )


def encode_metrics(metrics: KeeperMetrics, pid: int) -> bytes:
    """The keeper's snapshot for the agent's parent (rule 4): JSON of fixed fields."""

    def histogram(h: Histogram) -> dict[str, object]:
        state = h.state
        return {"sum": state.total, "count": state.count, "buckets": list(state.buckets)}

    doc = {
        "pid": pid,
        "watched": metrics.watched,
        "drift": metrics.drift,
        "repairs": metrics.repairs,
        "refused": metrics.refused,
        "events": metrics.events,
        "repairFailures": metrics.repair_failures,
        "repairsDelayed": metrics.repairs_delayed,
        "eventsFailed": metrics.events_failed,
        "sweeps": metrics.sweeps,
        "pruned": metrics.pruned,
        "restarts": metrics.restarts,
        "detection": histogram(metrics.detection),
        "repair": histogram(metrics.repair_latency),
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_metrics(data: bytes) -> tuple[KeeperMetrics, int] | None:
    """A snapshot as `encode_metrics` wrote it, with the keeper's pid; None for anything
    else (too large, a field missing, a label outside its fixed set, a negative count)."""
    if len(data) > MAX_SNAPSHOT:
        return None
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict):
            return None
        metrics = KeeperMetrics()
        for name in ("watched", "drift", "repairs", "refused", "events"):
            _fill(getattr(metrics, name), doc[name])
        metrics.repair_failures = _count(doc["repairFailures"])
        metrics.repairs_delayed = _count(doc["repairsDelayed"])
        metrics.events_failed = _count(doc["eventsFailed"])
        metrics.sweeps = _count(doc["sweeps"])
        metrics.pruned = _count(doc["pruned"])
        metrics.restarts = _count(doc["restarts"])
        _histogram(metrics.detection, doc["detection"])
        _histogram(metrics.repair_latency, doc["repair"])
        return metrics, _count(doc["pid"])
    except (ValueError, TypeError, KeyError):
        return None


def _count(value: object) -> int:
    if type(value) is not int or value < 0:
        raise TypeError("expected a count")
    return value


def _fill(into: dict[str, int], value: object) -> None:
    if not isinstance(value, dict) or set(value) != set(into):
        raise KeyError("labels")
    for key in into:
        into[key] = _count(value[key])


def _histogram(into: Histogram, value: object) -> None:
    if not isinstance(value, dict):
        raise TypeError("histogram")
    buckets = tuple(_count(b) for b in value["buckets"])
    total = value["sum"]
    if type(total) not in (int, float) or not total >= 0:
        raise TypeError("sum")
    count = _count(value["count"])
    if (buckets and len(buckets) != len(into.bounds) + 1) or sum(buckets) != count:
        raise ValueError("buckets")
    into.state = HistogramState(float(total), count, buckets)
