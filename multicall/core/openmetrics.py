"""Counters and histograms, and the two text expositions cnibox serves on `/metrics`: the
OpenMetrics text exactly as Rust's `prometheus-client` renders it (the crate upstream's
controllers register into), so a dashboard written for upstream reads the repair
controller's `/metrics` unchanged; and the Prometheus text format (version 0.0.4, labelled
samples) that the node agent has always served (core/agent_metrics.py defines its families).

Rules of this module (1-3 OpenMetrics, 4 the Prometheus text):
1. A registered metric's HELP gets a full stop appended (prometheus-client's `Descriptor`);
   a counter's sample is `<name>_total`; a histogram writes `_sum`, `_count`, then cumulative
   `_bucket{le="..."}` lines ending with `+Inf`; the exposition ends with `# EOF`.
2. Families whose help is written verbatim (collectors, e.g. process metrics) use `verbatim`.
3. Each metric's state is one immutable value replaced in a single assignment, so a scrape
   from another thread sees a consistent histogram without a lock.
4. Prometheus text: HELP is written as given; labels in the order given, values escaped;
   numbers are Python's repr for floats (`1.0`, `0.005`) and decimal for ints; a histogram
   series writes its cumulative `_bucket` lines, `+Inf` last, then `_sum` and `_count`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# client_golang's default buckets, which upstream copies for both latency histograms
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def format_float(value: float) -> str:
    """Rust `dtoa`'s shortest round-trip form: `1.0`, `0.005`, `1e-7`, `+Inf`."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(float(value))
    if "e" in text:
        mantissa, exponent = text.split("e")
        sign = "-" if exponent.startswith("-") else ""
        text = f"{mantissa.removesuffix('.0')}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"
    return text


@dataclass(slots=True)
class Counter:
    """A counter metric."""

    name: str
    help: str
    value: int = 0

    def inc(self, by: int = 1) -> None:
        self.value += by

    def render(self, prefix: str) -> str:
        name = f"{prefix}{self.name}"
        return f"# HELP {name} {self.help}.\n# TYPE {name} counter\n{name}_total {self.value}\n"


@dataclass(frozen=True, slots=True)
class HistogramState:
    """A histogram's sums and bucket counts at one moment."""

    total: float = 0.0
    count: int = 0
    buckets: tuple[int, ...] = ()  # per-bucket (not cumulative) counts, +Inf last


@dataclass(slots=True)
class Histogram:
    """A histogram metric."""

    name: str
    help: str
    bounds: Sequence[float] = DEFAULT_BUCKETS
    state: HistogramState = field(default_factory=HistogramState)

    def observe(self, value: float) -> None:
        old = self.state
        counts = list(old.buckets or (0,) * (len(self.bounds) + 1))
        counts[bisect.bisect_left(self.bounds, value)] += 1
        self.state = HistogramState(old.total + value, old.count + 1, tuple(counts))

    def render(self, prefix: str) -> str:
        name = f"{prefix}{self.name}"
        state = self.state
        counts = state.buckets or (0,) * (len(self.bounds) + 1)
        lines = [
            f"# HELP {name} {self.help}.",
            f"# TYPE {name} histogram",
            f"{name}_sum {format_float(state.total)}",
            f"{name}_count {state.count}",
        ]
        running = 0
        for bound, count in zip((*self.bounds, math.inf), counts, strict=True):
            running += count
            lines.append(f'{name}_bucket{{le="{format_float(bound)}"}} {running}')
        return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Sample:
    """One family whose help is written as given (prometheus-client's collector path)."""

    name: str
    help: str
    type: str  # counter | gauge
    value: int | float
    unit: str = ""  # seconds | bytes: appended to the name, announced by # UNIT

    def render(self, prefix: str) -> str:
        name = f"{prefix}{self.name}" + (f"_{self.unit}" if self.unit else "")
        value = format_float(self.value) if isinstance(self.value, float) else str(self.value)
        lines = [f"# HELP {name} {self.help}", f"# TYPE {name} {self.type}"]
        if self.unit:
            lines.append(f"# UNIT {name} {self.unit}")
        lines.append(f"{name}{'_total' if self.type == 'counter' else ''} {value}")
        return "\n".join(lines) + "\n"


def exposition(sections: Iterable[tuple[str, Iterable[Counter | Histogram | Sample]]]) -> str:
    """Every (prefix, metrics) section in order, then `# EOF`."""
    parts = [
        metric.render(f"{prefix}_" if prefix else "") for prefix, ms in sections for metric in ms
    ]
    return "".join(parts) + "# EOF\n"


# ----------------------------------------------------------------------------- Prometheus text

Labels = Mapping[str, str]


def _label_set(labels: Labels) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{{{inner}}}" if inner else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def text_family(name: str, kind: str, help: str, samples: Iterable[tuple[Labels, float]]) -> str:
    """One counter or gauge family: HELP, TYPE, then one line per labelled sample."""
    lines = [f"# HELP {name} {help}\n# TYPE {name} {kind}\n"]
    lines += [f"{name}{_label_set(labels)} {_number(value)}\n" for labels, value in samples]
    return "".join(lines)


def text_histogram(name: str, help: str, series: Iterable[tuple[Labels, Histogram]]) -> str:
    """One histogram family: HELP, TYPE, then per labelled series its cumulative buckets
    (the histogram's own bounds, then +Inf), `_sum` and `_count`."""
    lines = [f"# HELP {name} {help}\n# TYPE {name} histogram\n"]
    for labels, histogram in series:
        state = histogram.state
        counts = state.buckets or (0,) * (len(histogram.bounds) + 1)
        running = 0
        for bound, count in zip((*histogram.bounds, math.inf), counts, strict=True):
            running += count
            le = "+Inf" if math.isinf(bound) else _number(bound)
            lines.append(f"{name}_bucket{_label_set({**labels, 'le': le})} {running}\n")
        lines.append(f"{name}_sum{_label_set(labels)} {_number(state.total)}\n")
        lines.append(f"{name}_count{_label_set(labels)} {state.count}\n")
    return "".join(lines)
