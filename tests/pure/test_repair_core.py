"""The repair controller's pure parts: upstream's event filter (its Rust test cases ported,
plus the field-by-field edges), the Event kube-rs publishes, the command line, the log format
and filter, and the OpenMetrics text prometheus-client renders."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from multicall.core.openmetrics import Counter, Histogram, Sample, exposition, format_float
from multicall.core.repair import policy
from multicall.core.repair.cli import Options, parse_args, parse_duration
from multicall.core.tracing_log import LEVELS, format_line, parse_filter
from multicall.core.usage import Show
from multicall.errors import UsageError


def validator(exit_code: object, *, name: str = policy.VALIDATOR) -> dict[str, Any]:
    return {"name": name, "lastState": {"terminated": {"exitCode": exit_code}}}


def pod(status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"metadata": {"name": "pod2", "namespace": "default", **meta}}
    if status is not None:
        doc["status"] = status
    return doc


FAILED = {"initContainerStatuses": [validator(95)]}

# ---------------------------------------------------------------- upstream's test_process_events


def test_upstream_pod_without_status_is_ignored() -> None:
    """pod1 of upstream's test: no status at all ("Skipped, no status")."""
    assert policy.verdict(pod(name="pod1")) is policy.Verdict.NO_STATUS


def test_upstream_pod_whose_validator_exited_95_is_processed() -> None:
    """pod2: the validator's lastState.terminated.exitCode is 95."""
    assert policy.verdict(pod(FAILED)) is policy.Verdict.REPAIR


def test_upstream_pod_being_deleted_is_ignored() -> None:
    """pod3: pod2 with a deletionTimestamp."""
    deleting = pod(FAILED, deletionTimestamp="2024-01-01T00:00:00Z")
    assert policy.verdict(deleting) is policy.Verdict.DELETING


# ---------------------------------------------------------------- the filter, field by field


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({}, policy.Verdict.HEALTHY),  # status without init statuses
        ({"initContainerStatuses": []}, policy.Verdict.HEALTHY),
        ({"initContainerStatuses": [validator(1)]}, policy.Verdict.HEALTHY),
        ({"initContainerStatuses": [validator(0)]}, policy.Verdict.HEALTHY),
        ({"initContainerStatuses": [validator(95, name="linkerd-init")]}, policy.Verdict.HEALTHY),
        ({"initContainerStatuses": [validator("95")]}, policy.Verdict.HEALTHY),  # not an int
        ({"initContainerStatuses": [validator(True)]}, policy.Verdict.HEALTHY),
        ({"initContainerStatuses": [{"name": policy.VALIDATOR}]}, policy.Verdict.HEALTHY),
        # the current state failing is not enough: upstream reads lastState only
        (
            {
                "initContainerStatuses": [
                    {"name": policy.VALIDATOR, "state": {"terminated": {"exitCode": 95}}}
                ]
            },
            policy.Verdict.HEALTHY,
        ),
        # upstream takes the FIRST status of that name
        ({"initContainerStatuses": [validator(1), validator(95)]}, policy.Verdict.HEALTHY),
        ({"initContainerStatuses": [validator(95), validator(1)]}, policy.Verdict.REPAIR),
        # other init containers do not matter
        (
            {"initContainerStatuses": [validator(95, name="other"), validator(95)]},
            policy.Verdict.REPAIR,
        ),
        # containerStatuses are not looked at
        ({"containerStatuses": [validator(95)]}, policy.Verdict.HEALTHY),
    ],
)
def test_filter_edges(status: dict[str, Any], expected: policy.Verdict) -> None:
    assert policy.verdict(pod(status)) is expected


def test_status_that_is_not_an_object_counts_as_absent() -> None:
    assert policy.verdict({"metadata": {}, "status": None}) is policy.Verdict.NO_STATUS
    assert policy.verdict({"metadata": {}, "status": "x"}) is policy.Verdict.NO_STATUS


def test_selector_is_upstreams_watch() -> None:
    selector = policy.pod_selector("node-7")
    assert (selector.labels, selector.fields) == (
        "linkerd.io/control-plane-ns",
        "spec.nodeName=node-7",
    )


# ---------------------------------------------------------------- the Event


def test_event_document_is_kube_rs_recorders() -> None:
    ref = policy.pod_ref(pod(FAILED, uid="u-1", resourceVersion="42"))
    nanos = 1_700_000_000_123_456_789
    doc = policy.event_document(ref, "linkerd-cni-abcde", nanos)
    assert doc == {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "action": "Deleting",
        "eventTime": "2023-11-14T22:13:20.123456Z",
        "metadata": {"name": f"pod2.{nanos:x}", "namespace": "default"},
        "note": "Deleting pod to create a new one with proper CNI config",
        "reason": "LinkerdCNINotConfigured",
        "regarding": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "pod2",
            "namespace": "default",
            "resourceVersion": "42",
            "uid": "u-1",
        },
        "reportingController": "linkerd-cni-repair-controller",
        "reportingInstance": "linkerd-cni-abcde",
        "type": "Normal",
    }
    assert list(doc) == sorted(doc, key=lambda k: (k not in ("apiVersion", "kind"), k))


def test_recent_is_bounded_and_forgets_the_oldest() -> None:
    recent = policy.Recent(3)
    for key in "abcd":
        recent.add(key)
    assert len(recent) == 3
    assert "a" not in recent
    assert all(k in recent for k in "bcd")
    recent.add("b")  # refreshed: now the newest
    recent.add("e")
    assert "c" not in recent
    assert "b" in recent


# ---------------------------------------------------------------- command line


ENV = {
    "LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME": "n1",
    "LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME": "p1",
}


def options(args: list[str], env: dict[str, str]) -> Options:
    parsed = parse_args(args, env)
    assert isinstance(parsed, Options)
    return parsed


def test_env_supplies_upstreams_flags_and_flags_win() -> None:
    opts = options([], ENV)
    assert (opts.node_name, opts.controller_pod_name) == ("n1", "p1")
    assert opts.log_level == "linkerd_cni_repair_controller=info,warn"
    assert opts.log_format == "plain"
    assert opts.admin_addr == "0.0.0.0:9990"
    assert opts.headers_timeout == 9.0
    opts = options(["--node-name=n2", "--log-level", "debug", "--log-format=json"], ENV)
    assert (opts.node_name, opts.log_level, opts.log_format) == ("n2", "debug", "json")


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {}, "--node-name <NODE_NAME>\n  --controller-pod-name <CONTROLLER_POD_NAME>"),
        (["--nope"], ENV, "unexpected argument '--nope' found"),
        (["--node-name"], ENV, "a value is required for '--node-name <NODE_NAME>'"),
        (["--log-format", "xml"], ENV, "must be 'plain' or 'json'"),
        (["--node-name", "a", "--node-name=b"], ENV, "cannot be used multiple times"),
        (["--kube-api-response-headers-timeout", "soon"], ENV, "invalid duration 'soon'"),
    ],
)
def test_bad_command_lines_are_usage_errors(
    args: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_args(args, {**env, "LINKERD_CNI_REPAIR_CONTROLLER_LOG_FORMAT": ""})
    assert message in caught.value.message
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("args", "show"),
    [
        (["-h"], Show.HELP),
        (["--node-name", "n", "--help"], Show.HELP),
        (["-V"], Show.VERSION),
        (["--version", "--nope"], Show.VERSION),  # clap stops at the request
    ],
)
def test_help_and_version_requests_end_parsing(args: list[str], show: Show) -> None:
    assert parse_args(args, {}) is show


def test_empty_env_counts_as_unset() -> None:
    with pytest.raises(UsageError):
        parse_args([], {**ENV, "LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME": ""})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("9s", 9.0),
        ("1m30s", 90.0),
        ("250ms", 0.25),
        ("2h3m4s5ms", 7384.005),
        ("1.5s", 1.5),
        ("7", 7.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


# ---------------------------------------------------------------- logs


def test_default_filter_shows_the_controller_at_info_and_others_at_warn() -> None:
    filt = parse_filter("linkerd_cni_repair_controller=info,warn")
    assert filt.enabled("linkerd_cni_repair_controller", LEVELS["info"])
    assert not filt.enabled("linkerd_cni_repair_controller", LEVELS["debug"])
    assert not filt.enabled("kubert::errors", LEVELS["info"])
    assert filt.enabled("kubert::errors", LEVELS["warn"])
    assert parse_filter("info").enabled("kubert::errors", LEVELS["info"])
    assert parse_filter("kubert=debug,error").enabled("kubert::errors", LEVELS["debug"])
    assert not parse_filter("").enabled("anything", LEVELS["warn"])  # EnvFilter: ERROR only


def test_span_directives_are_refused() -> None:
    with pytest.raises(UsageError):
        parse_filter("kube[watch{x=1}]=debug")


def test_plain_and_json_lines_are_tracing_subscribers() -> None:
    nanos = 1_700_000_000_000_001_000
    fields = (("namespace", "default"), ("name", "pod2"))
    plain = format_line(
        "plain",
        nanos,
        LEVELS["info"],
        "linkerd_cni_repair_controller",
        "Deleted pod",
        fields=fields,
    )
    assert plain == (
        "2023-11-14T22:13:20.000001Z  INFO linkerd_cni_repair_controller: "
        "Deleted pod namespace=default name=pod2\n"
    )
    json_line = format_line(
        "json",
        nanos,
        LEVELS["warn"],
        "linkerd_cni_repair_controller",
        "Pod deletion timed out",
        fields=fields,
    )
    assert json_line == (
        '{"timestamp":"2023-11-14T22:13:20.000001Z","level":"WARN","fields":{"message":'
        '"Pod deletion timed out","namespace":"default","name":"pod2"},'
        '"target":"linkerd_cni_repair_controller"}\n'
    )


# ---------------------------------------------------------------- metrics text


def test_exposition_is_prometheus_clients() -> None:
    """The text prometheus-client 0.23 renders for a counter and a histogram (its doc
    example's layout: HELP with a full stop, _total, _sum/_count/_bucket, # EOF)."""
    counter = Counter("pods_deleted", "Number of pods deleted by the controller")
    counter.inc()
    histogram = Histogram(
        "pods_delete_latency_seconds", "Pod deletion latency distribution", (0.005, 1.0)
    )
    histogram.observe(0.004)
    histogram.observe(3.0)
    text = exposition([("linkerd_cni_repair_controller", [counter, histogram])])
    assert text == (
        "# HELP linkerd_cni_repair_controller_pods_deleted Number of pods deleted by the "
        "controller.\n"
        "# TYPE linkerd_cni_repair_controller_pods_deleted counter\n"
        "linkerd_cni_repair_controller_pods_deleted_total 1\n"
        "# HELP linkerd_cni_repair_controller_pods_delete_latency_seconds Pod deletion latency "
        "distribution.\n"
        "# TYPE linkerd_cni_repair_controller_pods_delete_latency_seconds histogram\n"
        "linkerd_cni_repair_controller_pods_delete_latency_seconds_sum 3.004\n"
        "linkerd_cni_repair_controller_pods_delete_latency_seconds_count 2\n"
        'linkerd_cni_repair_controller_pods_delete_latency_seconds_bucket{le="0.005"} 1\n'
        'linkerd_cni_repair_controller_pods_delete_latency_seconds_bucket{le="1.0"} 1\n'
        'linkerd_cni_repair_controller_pods_delete_latency_seconds_bucket{le="+Inf"} 2\n'
        "# EOF\n"
    )


def test_collector_samples_keep_their_help_and_announce_units() -> None:
    text = exposition(
        [
            (
                "process",
                [
                    Sample(
                        "resident_memory", "Resident memory size in bytes", "gauge", 4096, "bytes"
                    )
                ],
            )
        ]
    )
    assert text == (
        "# HELP process_resident_memory_bytes Resident memory size in bytes\n"
        "# TYPE process_resident_memory_bytes gauge\n"
        "# UNIT process_resident_memory_bytes bytes\n"
        "process_resident_memory_bytes 4096\n# EOF\n"
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [(1.0, "1.0"), (0.005, "0.005"), (10.0, "10.0"), (1e-7, "1e-7"), (float("inf"), "+Inf")],
)
def test_float_format(value: float, text: str) -> None:
    assert format_float(value) == text


def test_histogram_snapshot_is_one_value() -> None:
    """A scrape racing an observe sees the old or the new state, never a mix."""
    h = Histogram("h", "x", (1.0,))
    before = h.state
    h.observe(0.5)
    assert before.count == 0
    assert h.state.count == 1
    assert sum(h.state.buckets) == 1
    assert re.search(r'h_bucket\{le="1.0"\} 1', h.render(""))
    assert copy.copy(h.state) == h.state
