"""Log lines as Rust's `tracing-subscriber` writes them for kubert (`--log-format plain|json`),
filtered by an `EnvFilter`-style `--log-level` (`info`, `linkerd_cni_repair_controller=info,
warn`), so upstream's log queries and level settings keep working.

Rules of this module:
1. Plain: `<RFC 3339 µs>Z <LEVEL right-aligned to 5> <target>: <message> k=v ...` (no ANSI
   colours: container logs are not terminals). JSON: `{"timestamp","level","fields":{
   "message",...},"target"}` in that order, as tracing-subscriber's JSON formatter emits.
2. A filter directive is `LEVEL` or `TARGET=LEVEL` (`TARGET` matches itself and its `::`
   children); the most specific target wins, a bare level is the default, none means ERROR.
   Span-field directives (`target[span{f=v}]=level`) are refused, not half-supported.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from multicall.errors import UsageError

LEVELS = {"trace": 0, "debug": 1, "info": 2, "warn": 3, "error": 4, "off": 5}
NAMES = {0: "TRACE", 1: "DEBUG", 2: "INFO", 3: "WARN", 4: "ERROR"}


@dataclass(frozen=True, slots=True)
class LogFilter:
    """Which levels are logged, per target prefix."""

    default: int
    targets: tuple[tuple[str, int], ...] = ()  # longest target first

    def enabled(self, target: str, level: int) -> bool:
        for prefix, threshold in self.targets:
            if target == prefix or target.startswith(prefix + "::"):
                return level >= threshold
        return level >= self.default


def parse_filter(text: str) -> LogFilter:
    default = LEVELS["error"]
    targets: dict[str, int] = {}
    for raw in text.split(","):
        directive = raw.strip()
        if not directive:
            continue
        if "[" in directive or "{" in directive:
            raise UsageError(f"invalid log level {text!r}: span directives are not supported")
        target, _, level = directive.rpartition("=")
        if level.lower() not in LEVELS:
            if target:
                raise UsageError(f"invalid log level {text!r}: unknown level {level!r}")
            target, level = directive, "trace"  # a bare target enables everything under it
        if target:
            targets[target] = LEVELS[level.lower()]
        else:
            default = LEVELS[level.lower()]
    ordered = tuple(sorted(targets.items(), key=lambda item: -len(item[0])))
    return LogFilter(default, ordered)


def timestamp(nanos: int) -> str:
    """RFC 3339 in UTC with microseconds and `Z` (tracing's and k8s MicroTime's form)."""
    stamp = datetime.fromtimestamp(nanos // 1_000_000_000, UTC)
    return f"{stamp:%Y-%m-%dT%H:%M:%S}.{nanos // 1000 % 1_000_000:06d}Z"


def format_line(
    fmt: str,
    nanos: int,
    level: int,
    target: str,
    message: str,
    *,
    fields: Sequence[tuple[str, str]] = (),
) -> str:
    if fmt == "json":
        body = {"message": message, **dict(fields)}
        doc = {
            "timestamp": timestamp(nanos),
            "level": NAMES[level],
            "fields": body,
            "target": target,
        }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n"
    extra = "".join(f" {key}={value}" for key, value in fields)
    return f"{timestamp(nanos)} {NAMES[level]:>5} {target}: {message}{extra}\n"
