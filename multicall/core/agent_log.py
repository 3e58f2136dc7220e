"""The node agent's line per request on its own stderr (what `kubectl logs` of the agent
shows; issue 24 "visible"), and the budget that keeps a flood of requests from flooding it.

Rules of this module:
1. Pure: the caller passes what it knows of the request and the time; the line is written
   by the agent's logger (effects/log.py), in its format (core/logs.py).
2. The pod's fields are upstream's log fields (`ContainerID`, `Namespace`, `Pod`:
   core/cni/skel.py `log_fields`, the same names as the plugin's own log lines), so one
   query finds a pod's lines in the agent's log and in the node's log_file.
3. Everything a caller sends is cut (`CUT` characters) and reaches the line only as a field
   value, which the formatter quotes (Go's %q in `plain`, JSON in `json`): no caller byte can
   start a line of its own. The message names the command from the fixed set only.
4. At most BURST lines at once and RATE a second after that (a token bucket); the lines
   not written are counted and said with the next one written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from multicall.core.agent_metrics import command_label

CUT = 256  # characters of a caller's value on the line (pod names are at most 253)
BURST = 200  # request lines written at once before the rate applies
RATE = 50.0  # request lines a second, sustained


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one request ended, as the parent learned it from its worker (or its death)."""

    result: str  # "ok", "error" (a CNI error result) or "fallback" (handed back)
    cni_code: str = ""  # the CNI error code of an error result
    reason: str = ""  # why it was handed back


def cut(value: str, limit: int = CUT) -> str:
    """`value`, or its first `limit` characters and how many more there were."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}...({len(value) - limit} more)"


def request_line(
    command: str, pod: Mapping[str, str], outcome: Outcome, seconds: float
) -> tuple[str, str, dict[str, str]]:
    """(level, message, fields) of the line for one request: `pod` is its log fields
    (skel.log_fields of the caller's environment), `seconds` from accept to outcome."""
    label = command_label(command)
    fields = {key: cut(value) for key, value in pod.items()}
    fields["command"] = cut(command, 32)
    fields["result"] = outcome.result
    fields["duration_ms"] = f"{seconds * 1000:.1f}"
    if outcome.result == "ok":
        return "info", f"{label} ok", fields
    if outcome.result == "error":
        fields["cni_code"] = cut(outcome.cni_code, 8)
        return "warning", f"{label} failed with CNI error {fields['cni_code']}", fields
    fields["reason"] = cut(outcome.reason, 128)
    return "info", f"{label} handed back to the caller", fields


@dataclass
class LineBudget:
    """A token bucket of request lines (rule 4): `take(now)` says whether a line may be
    written now; `skipped` the lines refused since the last one written."""

    burst: int = BURST
    rate: float = RATE
    tokens: float = -1.0  # full at the first take
    last: float = 0.0
    skipped: int = 0

    def take(self, now: float) -> bool:
        if self.tokens < 0:
            self.tokens, self.last = float(self.burst), now
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.skipped += 1
        return False

    def said(self) -> int:
        """The count of lines skipped before this one (reset: the line says it)."""
        skipped, self.skipped = self.skipped, 0
        return skipped
