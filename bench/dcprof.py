"""Run cnibox (`python bench/dcprof.py APPLET ...`) and report on stderr, at exit, how many
dataclasses it created and the CPU time their creation took, per module: in 3.11 each one
compiles its generated methods with exec(), in the built binary too."""

from __future__ import annotations

import atexit
import dataclasses
import runpy
import sys
import time
from collections import defaultdict
from typing import Any

_stats: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_process_class = dataclasses._process_class  # type: ignore[attr-defined]


def _timed(cls: type, *args: Any, **kwargs: Any) -> Any:
    start = time.process_time()
    try:
        return _process_class(cls, *args, **kwargs)
    finally:
        entry = _stats[cls.__module__]
        entry[0] += 1
        entry[1] += time.process_time() - start


def _report() -> None:
    count = sum(int(n) for n, _ in _stats.values())
    cpu = sum(t for _, t in _stats.values())
    lines = [
        f"dataclasses: {count} created, {1000 * cpu:.1f} ms CPU "
        f"of {1000 * time.process_time():.1f} ms for the whole process"
    ]
    for module, (n, t) in sorted(_stats.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  {module:<40}{int(n):>4}{1000 * t:>8.1f} ms")
    sys.stderr.write("\n".join(lines) + "\n")


dataclasses._process_class = _timed  # type: ignore[attr-defined]
atexit.register(_report)
sys.argv = ["multicall", *sys.argv[1:]]
runpy.run_module("multicall", run_name="__main__")
