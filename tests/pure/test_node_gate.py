"""core/node_gate.py: the taint patches change only our taint and test what they read; the
condition moves its transition time only on a flip; the environment is bounded."""

from __future__ import annotations

import pytest

from multicall.core import node_gate as g

OURS = {"key": g.DEFAULT_TAINT_KEY, "effect": "NoSchedule"}
OTHER = {"key": "x/y", "effect": "NoExecute", "value": "v"}
TAINT = g.Taint()


def node(taints: list[object] | None, rv: str = "7") -> dict[str, object]:
    spec = {} if taints is None else {"taints": taints}
    return {"metadata": {"resourceVersion": rv}, "spec": spec}


def test_remove_tests_the_list_and_keeps_the_others() -> None:
    patch = g.remove_taint_patch(node([OTHER, OURS]), TAINT)
    assert patch == [
        {"op": "test", "path": "/spec/taints", "value": [OTHER, OURS]},
        {"op": "replace", "path": "/spec/taints", "value": [OTHER]},
    ]
    only = g.remove_taint_patch(node([OURS]), TAINT)
    assert only is not None
    assert only[1] == {"op": "remove", "path": "/spec/taints"}
    assert g.remove_taint_patch(node([OTHER]), TAINT) is None
    assert g.remove_taint_patch(node(None), TAINT) is None
    # same key, other effect: not ours
    assert g.remove_taint_patch(node([{**OURS, "effect": "NoExecute"}]), TAINT) is None


def test_add_tests_what_it_read() -> None:
    assert g.add_taint_patch(node([OURS]), TAINT) is None
    assert g.add_taint_patch(node([OTHER]), TAINT) == [
        {"op": "test", "path": "/spec/taints", "value": [OTHER]},
        {"op": "add", "path": "/spec/taints/-", "value": OURS},
    ]
    assert g.add_taint_patch(node(None, "42"), TAINT) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "add", "path": "/spec/taints", "value": [OURS]},
    ]
    with pytest.raises(g.GateInputError):
        g.add_taint_patch({"spec": {}}, TAINT)


@pytest.mark.parametrize(
    "bad",
    [
        {"spec": []},
        {"spec": {"taints": "x"}},
        {"spec": {"taints": [1]}},
        {"spec": {"taints": [{}] * (g.MAX_TAINTS + 1)}},
    ],
)
def test_malformed_nodes_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(g.GateInputError):
        g.remove_taint_patch(bad, TAINT)


def test_condition_transition_only_on_a_flip() -> None:
    ready = g.Verdict((g.CheckResult("PluginInstalled", True),))
    broken = g.Verdict((g.CheckResult("PluginInstalled", False, "gone\nnow"),))
    first = g.condition_patch(broken, None, "T1")
    assert first is not None
    cond = first["status"]["conditions"][0]  # type: ignore[index]
    assert cond["status"] == "False"
    assert cond["reason"] == "PluginInstalledFailed"
    assert cond["message"] == "PluginInstalled: gone now"
    assert g.condition_patch(broken, cond, "T2") is None  # nothing changed: no write
    flipped = g.condition_patch(ready, cond, "T3")
    assert flipped is not None
    assert flipped["status"]["conditions"][0]["lastTransitionTime"] == "T3"  # type: ignore[index]
    other = g.Verdict((g.CheckResult("PluginInstalled", False, "else"),))
    same = g.condition_patch(other, cond, "T4")
    assert same is not None
    assert same["status"]["conditions"][0]["lastTransitionTime"] == "T1"  # type: ignore[index]


def test_message_is_bounded() -> None:
    verdict = g.Verdict((g.CheckResult("SelfTest", False, "x" * 10_000),))
    assert len(verdict.message) == g.MAX_MESSAGE


def test_environment() -> None:
    assert not g.parse_gate_env({}).enabled
    config = g.parse_gate_env({"CNIBOX_GATE": "true", "NODE_NAME": "n1"})
    assert config.enabled
    assert config.node == "n1"
    assert config.taint == TAINT
    assert config.reapply
    for bad in (
        {"CNIBOX_GATE": "maybe"},
        {"CNIBOX_GATE": "true"},
        {"CNIBOX_GATE": "true", "NODE_NAME": "a/b"},
        {"CNIBOX_GATE": "true", "NODE_NAME": "n", "CNIBOX_GATE_TAINT_EFFECT": "Never"},
        {"CNIBOX_GATE": "true", "NODE_NAME": "n", "CNIBOX_GATE_TAINT_KEY": "-bad-"},
        {"CNIBOX_GATE": "true", "NODE_NAME": "n", "CNIBOX_GATE_INTERVAL": "nan"},
        {"CNIBOX_GATE": "true", "NODE_NAME": "n", "CNIBOX_GATE_INTERVAL": "0"},
    ):
        with pytest.raises(g.GateInputError):
            g.parse_gate_env(bad)


def test_gate_metrics_exposition() -> None:
    """Issue 25's metrics as install-cni's /metrics shows them (Prometheus text 0.0.4)."""
    from multicall.core.installer.metrics import GateMetrics, render

    off = render(GateMetrics(), installed=True)
    assert off == (
        "# HELP cnibox_install_cni_installed 1 when linkerd-cni is in the CNI bin dir and "
        "chained in the primary CNI config.\n"
        "# TYPE cnibox_install_cni_installed gauge\ncnibox_install_cni_installed 1\n"
    )
    metrics = GateMetrics(enabled=True)
    text = render(metrics, installed=False)
    assert "cnibox_node_gate_enabled 1\n" in text
    assert "\ncnibox_node_gate_ready " not in text  # no round yet
    assert "\ncnibox_node_gate_chain_ready_seconds " not in text
    metrics.chain_ready_seconds = 1.5
    metrics.ready = True
    metrics.taint_removed_seconds = 2.25
    metrics.selftest(True, 0.2)
    metrics.selftest(False, 40.0)
    text = render(metrics, installed=True)
    for line in (
        "cnibox_node_gate_ready 1",
        "cnibox_node_gate_chain_ready_seconds 1.5",
        "cnibox_node_gate_taint_removed_seconds 2.25",
        'cnibox_node_gate_selftests_total{result="passed"} 1',
        'cnibox_node_gate_selftests_total{result="failed"} 1',
        'cnibox_node_gate_selftest_duration_seconds_bucket{le="0.25"} 1',
        'cnibox_node_gate_selftest_duration_seconds_bucket{le="+Inf"} 2',
        "cnibox_node_gate_selftest_duration_seconds_count 2",
        "cnibox_node_gate_selftest_duration_seconds_sum 40.2",
    ):
        assert f"\n{line}\n" in text, line
