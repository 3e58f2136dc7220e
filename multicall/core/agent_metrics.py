"""The node agent's metrics and their Prometheus text exposition (docs/agent.md "Operations").

Pure: the agent's event loop records, `/metrics` renders.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

# Seconds. An ADD through the agent is a few ms; the one-shot path ~0.1 s; API timeouts 5 s.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Histogram:
    """Latency counts per bucket of one metric series."""

    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, seconds: float) -> None:
        self.n += 1
        self.total += seconds
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1


@dataclass
class Metrics:
    """Everything `/metrics` shows; label values are bounded sets (commands, reasons)."""

    requests: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    durations: dict[str, Histogram] = field(default_factory=dict)
    fallbacks: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    idle_workers: int = 0
    worker_crashes: int = 0
    extension_loads: int = 0
    queued: int = 0
    workers_started: int = 0
    worker_reuses: int = 0

    def served(self, command: str, result: str, cni_code: str, seconds: float) -> None:
        self.requests[(command, result, cni_code)] += 1
        self.durations.setdefault(command, Histogram()).observe(seconds)

    def fell_back(self, reason: str) -> None:
        self.fallbacks[reason] += 1


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{{{inner}}}" if inner else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def render(metrics: Metrics, build: str) -> str:
    out: list[str] = []

    def family(name: str, kind: str, text: str) -> None:
        out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")

    family("cnibox_agent_info", "gauge", "The agent's build (content hash of the binary).")
    out.append(f"cnibox_agent_info{_labels(build=build)} 1\n")
    family(
        "cnibox_agent_requests_total",
        "counter",
        "Plugin invocations answered with a result, by CNI command, result and CNI error code.",
    )
    for (command, result, code), n in sorted(metrics.requests.items()):
        labels = _labels(command=command, result=result, cni_code=code)
        out.append(f"cnibox_agent_requests_total{labels} {n}\n")
    name = "cnibox_agent_request_duration_seconds"
    family(name, "histogram", "From accepting the connection to the result, by command.")
    for command, hist in sorted(metrics.durations.items()):
        for bound, count in zip(BUCKETS, hist.counts, strict=True):
            labels = _labels(command=command, le=_number(bound))
            out.append(f"{name}_bucket{labels} {count}\n")
        out.append(f"{name}_bucket{_labels(command=command, le='+Inf')} {hist.n}\n")
        out.append(f"{name}_sum{_labels(command=command)} {_number(hist.total)}\n")
        out.append(f"{name}_count{_labels(command=command)} {hist.n}\n")
    family(
        "cnibox_agent_fallbacks_total",
        "counter",
        "Requests the agent handed back to the caller's one-shot path, by reason.",
    )
    for reason, n in sorted(metrics.fallbacks.items()):
        out.append(f"cnibox_agent_fallbacks_total{_labels(reason=reason)} {n}\n")
    family("cnibox_agent_refused_total", "counter", "Connections refused, by reason.")
    for reason, n in sorted(metrics.refused.items()):
        out.append(f"cnibox_agent_refused_total{_labels(reason=reason)} {n}\n")
    family("cnibox_agent_in_flight", "gauge", "Requests being served now.")
    out.append(f"cnibox_agent_in_flight {metrics.in_flight}\n")
    family("cnibox_agent_idle_workers", "gauge", "Pre-forked workers waiting for a request.")
    out.append(f"cnibox_agent_idle_workers {metrics.idle_workers}\n")
    family("cnibox_agent_queued", "gauge", "Callers waiting for a worker (--max-workers busy).")
    out.append(f"cnibox_agent_queued {metrics.queued}\n")
    family("cnibox_agent_workers_started_total", "counter", "Worker processes forked.")
    out.append(f"cnibox_agent_workers_started_total {metrics.workers_started}\n")
    family(
        "cnibox_agent_worker_reuses_total",
        "counter",
        "Times a worker took another request after serving one (--worker-requests).",
    )
    out.append(f"cnibox_agent_worker_reuses_total {metrics.worker_reuses}\n")
    family("cnibox_agent_worker_crashes_total", "counter", "Workers that died without a result.")
    out.append(f"cnibox_agent_worker_crashes_total {metrics.worker_crashes}\n")
    family(
        "cnibox_agent_xtables_extension_loads_total",
        "counter",
        "x_tables extensions loaded by workers while serving a request (a worker preloads "
        "those of the previous legacy request's family before its own arrives).",
    )
    out.append(f"cnibox_agent_xtables_extension_loads_total {metrics.extension_loads}\n")
    return "".join(out)
