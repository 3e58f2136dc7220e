"""The node agent's metrics: what it counts and its families' names, help and buckets
(docs/agent.md "Operations"). The counting and the Prometheus text are core/openmetrics.py's.

Pure: the agent's event loop records, `/metrics` renders.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from multicall.core.openmetrics import Histogram, text_family, text_histogram

# Seconds. An ADD through the agent is a few ms; the one-shot path ~0.1 s; API timeouts 5 s.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DURATION = "cnibox_agent_request_duration_seconds"
DURATION_HELP = "From accepting the connection to the result, by command."

# Label values come from these sets only (issue 24 #6: the `command` label was the caller's
# CNI_COMMAND, and 50 values of 100 KB made /metrics 96 MB): anything else counts as OTHER,
# so a caller moves a count, never the exposition's size.
OTHER = "other"
COMMANDS = frozenset({"ADD", "CHECK", "DEL", "STATUS", "GC", "VERSION"})  # the CNI spec's
# Every reason the agent hands a request back for: its parent's (agent/server.py), its
# worker's `Fallback`s (agent/worker.py) and the plugin's `ServeElsewhere`s (effects/).
# tests/pure/test_agent_protocol.py finds each in the source, so a new one cannot be missed.
# A reason with details ("bad request: short body") counts under the part before the colon.
FALLBACK_REASONS = frozenset(
    {
        "bad request",
        "caller gone",
        "caller in another user namespace",
        "caller lacks CAP_NET_ADMIN",
        "caller lacks CAP_NET_ADMIN and CAP_SYS_ADMIN",
        "caller lacks CAP_SYS_ADMIN",
        "caller not verified",
        "caller refused a file",
        "caller sent no netns",
        "caller stopped answering files",
        "caller's netns is not a network namespace",
        "caller's status unreadable",
        "cannot enter the caller's netns",
        "CNI_NETNS is not a network namespace",
        "CNI_NETNS is the agent's own netns",
        "CNI_NETNS not handed over",
        "deadline",
        "descriptors lost",
        "netlink descriptor is not a netfilter netlink socket",
        "netlink socket is not in CNI_NETNS",
        "netlink socket without CNI_NETNS",
        "netlink socket's netns unknown",
        "no CAP_SYS_ADMIN to enter the pod netns",
        "no worker",
        "openat2 unavailable",
        "other build",
        "output too large",
        "overloaded",
        "shutdown",
        "slow client",
        "worker died",
        "x_tables extensions of the other family loaded",
    }
)


def command_label(command: str) -> str:
    return command if command in COMMANDS else OTHER


def reason_label(reason: str) -> str:
    if reason in FALLBACK_REASONS:
        return reason
    head = reason.split(":", 1)[0]
    return head if head in FALLBACK_REASONS else OTHER


def code_label(code: str) -> str:
    """A CNI error code (1-3 digits, the spec's and the plugin's), or "" for a success."""
    return code if code == "" or (code.isdigit() and code.isascii() and len(code) <= 3) else OTHER


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
        """Counted under bounded labels: `command` and `cni_code` come from the worker's
        report of what the caller sent."""
        command = command_label(command)
        result = result if result in ("ok", "error") else OTHER
        self.requests[(command, result, code_label(cni_code))] += 1
        if command not in self.durations:
            self.durations[command] = Histogram(DURATION, DURATION_HELP, BUCKETS)
        self.durations[command].observe(seconds)

    def fell_back(self, reason: str) -> None:
        self.fallbacks[reason_label(reason)] += 1


# The unlabelled families after the labelled ones, in their order: name, type, help, and the
# `Metrics` attribute that holds the value.
SCALARS = (
    ("cnibox_agent_in_flight", "gauge", "Requests being served now.", "in_flight"),
    (
        "cnibox_agent_idle_workers",
        "gauge",
        "Pre-forked workers waiting for a request.",
        "idle_workers",
    ),
    (
        "cnibox_agent_queued",
        "gauge",
        "Callers waiting for a worker (--max-workers busy).",
        "queued",
    ),
    (
        "cnibox_agent_workers_started_total",
        "counter",
        "Worker processes forked.",
        "workers_started",
    ),
    (
        "cnibox_agent_worker_reuses_total",
        "counter",
        "Times a worker took another request after serving one (--worker-requests).",
        "worker_reuses",
    ),
    (
        "cnibox_agent_worker_crashes_total",
        "counter",
        "Workers that died without a result.",
        "worker_crashes",
    ),
    (
        "cnibox_agent_xtables_extension_loads_total",
        "counter",
        "x_tables extensions loaded by workers while serving a request (a worker preloads "
        "those of the previous legacy request's family before its own arrives).",
        "extension_loads",
    ),
)


def render(metrics: Metrics, build: str) -> str:
    """The agent's families in their order, as the Prometheus text format."""
    return "".join(
        [
            text_family(
                "cnibox_agent_info",
                "gauge",
                "The agent's build (content hash of the binary).",
                [({"build": build}, 1)],
            ),
            text_family(
                "cnibox_agent_requests_total",
                "counter",
                "Plugin invocations answered with a result, by CNI command, result and CNI "
                "error code.",
                [
                    ({"command": command, "result": result, "cni_code": code}, n)
                    for (command, result, code), n in sorted(metrics.requests.items())
                ],
            ),
            text_histogram(
                DURATION,
                DURATION_HELP,
                [({"command": command}, h) for command, h in sorted(metrics.durations.items())],
            ),
            text_family(
                "cnibox_agent_fallbacks_total",
                "counter",
                "Requests the agent handed back to the caller's one-shot path, by reason.",
                [({"reason": reason}, n) for reason, n in sorted(metrics.fallbacks.items())],
            ),
            text_family(
                "cnibox_agent_refused_total",
                "counter",
                "Connections refused, by reason.",
                [({"reason": reason}, n) for reason, n in sorted(metrics.refused.items())],
            ),
            *(
                text_family(name, kind, help_text, [({}, getattr(metrics, attribute))])
                for name, kind, help_text, attribute in SCALARS
            ),
        ]
    )
