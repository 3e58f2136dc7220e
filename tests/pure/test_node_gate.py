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
