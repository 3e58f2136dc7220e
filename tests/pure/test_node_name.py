"""core/node_name.py: the agent's node name when neither flag nor downward API gives it."""

from __future__ import annotations

from multicall.core.node_name import node_name


def test_flag_wins_over_env_and_hostname() -> None:
    assert node_name("n1", {"NODE_NAME": "n2"}, "Host") == "n1"


def test_env_wins_over_hostname() -> None:
    """The chart's DaemonSet sets $NODE_NAME: its agent is unchanged by the default."""
    assert node_name("", {"NODE_NAME": "n2"}, "Host") == "n2"


def test_default_is_the_kubelets_trimmed_lowercased_hostname() -> None:
    """Kubernetes' GetHostname without --hostname-override: TrimSpace, then ToLower."""
    assert node_name("", {}, " Talos-Worker-1\n") == "talos-worker-1"


def test_no_name_at_all_is_empty() -> None:
    assert node_name("", {"NODE_NAME": ""}, "  ") == ""
