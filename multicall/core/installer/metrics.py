"""install-cni's metrics (its admin server's `/metrics`, docs/install-cni.md "Admin server"):
the node readiness gate's timings and self-tests (issue 25), in the Prometheus text the node
agent serves (core/openmetrics.py renders, core/agent_metrics.py is the agent's).

Pure: the gate records (gate/run.py), a scrape renders. Each field is replaced in one
assignment, so a scrape from the admin server's thread reads consistent values.
"""

from __future__ import annotations

from dataclasses import dataclass

from multicall.core.openmetrics import Histogram, text_family, text_histogram

PREFIX = "cnibox_node_gate_"
# Seconds: a self-test is a few tenths (a scratch netns, one ADD/CHECK/DEL); the API 5 s.
SELFTEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RESULTS = ("passed", "failed")


@dataclass(slots=True)
class GateMetrics:
    """What the gate has seen since install-cni started (None: not yet)."""

    enabled: bool = False
    chain_ready_seconds: float | None = None  # installer start -> every check but the self-test
    taint_removed_seconds: float | None = None  # installer start -> the startup taint removed
    ready: bool | None = None  # the last round's verdict
    passed: int = 0
    failed: int = 0
    selftest_seconds: Histogram | None = None

    def selftest(self, ok: bool, seconds: float) -> None:
        if self.selftest_seconds is None:
            self.selftest_seconds = Histogram("", "", SELFTEST_BUCKETS)
        self.selftest_seconds.observe(seconds)
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def render(metrics: GateMetrics, installed: bool) -> str:
    """The exposition: whether the plugin is installed and chained now (read at the scrape),
    then the gate's families when the gate runs."""
    parts = [
        text_family(
            "cnibox_install_cni_installed",
            "gauge",
            "1 when linkerd-cni is in the CNI bin dir and chained in the primary CNI config.",
            [({}, 1 if installed else 0)],
        ),
    ]
    if not metrics.enabled:
        return "".join(parts)
    parts += [
        text_family(
            f"{PREFIX}enabled",
            "gauge",
            "1: the node readiness gate runs beside install-cni.",
            [({}, 1)],
        ),
        text_family(
            f"{PREFIX}ready",
            "gauge",
            "The last round's verdict: 1 when this node can program a pod end to end.",
            [] if metrics.ready is None else [({}, 1 if metrics.ready else 0)],
        ),
        text_family(
            f"{PREFIX}chain_ready_seconds",
            "gauge",
            "Seconds from install-cni's start to the chain first found ready (plugin file, "
            "chained config, API, agent).",
            [] if metrics.chain_ready_seconds is None else [({}, metrics.chain_ready_seconds)],
        ),
        text_family(
            f"{PREFIX}taint_removed_seconds",
            "gauge",
            "Seconds from install-cni's start to the startup taint removed by this pod.",
            [] if metrics.taint_removed_seconds is None else [({}, metrics.taint_removed_seconds)],
        ),
        text_family(
            f"{PREFIX}selftests_total",
            "counter",
            "Self-test ADD/CHECK/DEL runs in a scratch netns, by result.",
            [({"result": "passed"}, metrics.passed), ({"result": "failed"}, metrics.failed)],
        ),
    ]
    histogram = metrics.selftest_seconds
    if histogram is not None:
        parts.append(
            text_histogram(
                f"{PREFIX}selftest_duration_seconds",
                "How long each self-test took.",
                [({}, histogram)],
            )
        )
    return "".join(parts)
