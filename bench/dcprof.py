"""Run cnibox (`python bench/dcprof.py APPLET ...`) and report on stderr, at exit, how many
dataclasses it created and the CPU time their creation took, per module: in 3.11 each one
compiles its generated methods with exec() (the binary loads them precompiled, see
multicall/dataclass_cache.py). With `--cprofile FILE` first, the run is also profiled."""

from __future__ import annotations

import cProfile
import dataclasses
import runpy
import sys
import time
from collections import defaultdict
from typing import Any, NoReturn

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


_profile: cProfile.Profile | None = None


def _report_and_exit(code: int) -> NoReturn:
    # cnibox leaves through os._exit (no atexit): report first.
    if _profile is not None:
        _profile.disable()
        _profile.dump_stats(_profile_path)
    _report()
    _exit_now(code)  # set below, once dataclasses are being counted


def _parse() -> tuple[str, list[str]]:
    import argparse

    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        usage="dcprof.py [-h] [--cprofile FILE] APPLET [ARGS...]",
    )
    parser.add_argument("--cprofile", metavar="FILE", default="", help="also cProfile the run")
    parser.add_argument("applet", metavar="APPLET", help="what cnibox runs (its first argument)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the applet's arguments")
    parsed = parser.parse_args()
    return parsed.cprofile, [parsed.applet, *parsed.args]


_profile_path, args = _parse()
if _profile_path:
    _profile = cProfile.Profile()
dataclasses._process_class = _timed  # type: ignore[attr-defined]
from multicall import dispatch  # noqa: E402 - after the patch: it makes dataclasses too

_exit_now = dispatch.exit_now
dispatch.exit_now = _report_and_exit
sys.argv = ["multicall", *args]
if _profile is not None:
    _profile.enable()
runpy.run_module("multicall", run_name="__main__")
