"""A bench row and its statistics."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

# ----------------------------------------------------------------------------- numbers


@dataclass
class Row:
    name: str
    samples_ms: list[float] = field(default_factory=list)
    failures: int = 0
    # /usr/bin/time's %M for one extra run (wait4 of a posix_spawn child would count the
    # bench's own memory: vfork's child carries the parent's high-water mark into exec)
    peak_rss_kb: int | None = None
    cpu_ms: list[float] = field(default_factory=list)  # user + system of the process tree
    wall_ms: float | None = None  # concurrency rows: first spawn to last reaping
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    @property
    def p90(self) -> float:
        return percentile(self.samples_ms, 0.90)

    @property
    def p99(self) -> float:
        return percentile(self.samples_ms, 0.99)

    def add(self, ms: float, ok: bool, cpu_ms: float) -> None:
        self.samples_ms.append(ms)
        self.failures += 0 if ok else 1
        self.cpu_ms.append(cpu_ms)


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 30 samples is the largest)."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, -(-len(ordered) * q // 1))  # ceil(n*q)
    return ordered[int(rank) - 1]
