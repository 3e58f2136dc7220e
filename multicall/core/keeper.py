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
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from multicall.core.firewall.diff import ChainProblem, RuleProblem, RulesetDiff
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.openmetrics import Histogram, text_family, text_histogram
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


def pod_gone(pod: Mapping[str, object], uid: str) -> str:
    """Why a pod object no longer owns the recorded sandbox ("" when it does)."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    if uid and meta.get("uid") != uid:
        return "the pod was replaced by another with the same name"
    if meta.get("deletionTimestamp"):
        return "the pod is terminating"
    return ""


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

PREFIX = "linkerd_cni_agent_keeper_"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(slots=True)
class KeeperMetrics:
    """The keeper's families (Prometheus text, as the agent's own: core/agent_metrics.py)."""

    watched: dict[str, int] = field(default_factory=dict)  # by mechanism: events | sweep
    drift: dict[str, int] = field(default_factory=dict)  # by reason
    repairs: int = 0
    repair_failures: int = 0
    reports_only: int = 0  # drift left alone: mode report, or backed off
    events_failed: int = 0
    sweeps: int = 0
    adopted: int = 0  # sandboxes found without rules (or unrecorded) and programmed
    detection: Histogram = field(
        default_factory=lambda: Histogram("detection", "", LATENCY_BUCKETS)
    )
    repair_latency: Histogram = field(
        default_factory=lambda: Histogram("repair", "", LATENCY_BUCKETS)
    )

    def count_drift(self, reasons: Sequence[Reason]) -> None:
        for reason in reasons:
            self.drift[reason.value] = self.drift.get(reason.value, 0) + 1

    def render(self) -> str:
        def family(name: str, kind: str, help: str, value: float) -> str:
            return text_family(PREFIX + name, kind, help, [({}, value)])

        parts = [
            text_family(
                PREFIX + "sandboxes_watched",
                "gauge",
                "Sandboxes whose redirect the keeper watches, by how it learns of a change.",
                [({"via": k}, v) for k, v in sorted(self.watched.items())],
            ),
            text_family(
                PREFIX + "drift_total",
                "counter",
                "Drift the keeper detected, by reason.",
                [({"reason": k}, v) for k, v in sorted(self.drift.items())],
            ),
            family("repairs_total", "counter", "Sandboxes re-programmed in place.", self.repairs),
            family(
                "repair_failures_total",
                "counter",
                "Repairs in place that failed or did not verify.",
                self.repair_failures,
            ),
            family(
                "reported_only_total",
                "counter",
                "Drift reported and left alone (mode report, or backed off).",
                self.reports_only,
            ),
            family(
                "event_failures_total",
                "counter",
                "Kubernetes Events the keeper could not post.",
                self.events_failed,
            ),
            family(
                "adopted_total",
                "counter",
                "Meshed sandboxes found unrecorded (e.g. started without linkerd-cni in the "
                "chain) and programmed in place.",
                self.adopted,
            ),
            family("sweeps_total", "counter", "Periodic sweeps of x_tables tables.", self.sweeps),
            text_histogram(
                PREFIX + "detection_seconds",
                "From the kernel's notification (or the sweep's start) to the drift found.",
                [({}, self.detection)],
            ),
            text_histogram(
                PREFIX + "repair_seconds",
                "From the drift found to the sandbox re-programmed and verified.",
                [({}, self.repair_latency)],
            ),
        ]
        return "".join(parts)
