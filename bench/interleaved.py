"""Interleaved rows: each plugin ADD right after one upstream replay, so both sides run under
the same load (the issue-11 ratios of the agent and of the one-shot binary)."""

from __future__ import annotations

from typing import Any

from bench.measure import Row
from bench.paths import ONESHOT
from bench.plugin_runs import Bench, Plugin
from bench.upstream import replay_once


def interleaved(
    bench: Bench, plugin: Plugin, mode: str, n: int, *, meshed: bool, pair: list[Row]
) -> Row:
    """n ADDs through `plugin` (the agent, or the one-shot binary), each right after one
    upstream replay; returns the plugin's row and puts the replay's (same samples' time
    slots) in `pair`."""
    kind = "ADD" if meshed else "ADD unmeshed"
    replay = Row(f"upstream replay, {mode} (interleaved with {plugin.name} {kind})")
    agent = Row(f"cnibox {kind}, {plugin.name}, {mode}")
    for i in range(n + 1):
        total, cpu, ok, _ = replay_once(bench.spawner, bench.namespaces, mode, [])
        with bench.namespaces.fresh() as netns:
            done, served_ok = bench.add_once(plugin, mode, netns, meshed=meshed)
        if i:  # the first pair warms both up
            replay.add(total, ok, cpu)
            agent.add(done.ms, served_ok, done.cpu_ms)
    replay.note = "11 processes"
    pair.append(replay)
    return agent


def oneshot_rows(bench: Bench, impls: dict[str, Plugin], n: int, add: Any) -> None:
    """The warm one-shot binary ADD, each right after one upstream replay (same load)."""
    plugin = Plugin(ONESHOT, impls["binary"].argv, impls["binary"].env)
    pair: list[Row] = []
    add(interleaved(bench, plugin, "nft", n, meshed=True, pair=pair))
    add(pair[0])
