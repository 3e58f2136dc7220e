"""Issue 28's rows: `iptables-mode: nftables` (native nf_tables) against the iptables-nft mode
in the same run. The ADDs alternate the two modes one by one (fresh pod netns each), through
the warm one-shot binary and through a node agent, so both modes see the same load; beside
them, what each mode sends the kernel for one pod (rules, set elements, batch bytes, from
the same planning code the plugin runs) for the chart's defaults and for a 32,768-port list.

`bench.py --only native` runs these alone (the built binary needed); each native ADD is
checked as the others are, untimed: exit 0, prevResult printed, and the table as Debian's
`nft list table ip linkerd-proxy-init` prints it (the oracle) accepted by the binary's own
`iptables-verify --mode nftables --input -` for the pod (so the check holds for the binary
under test, whichever layout its version writes).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bench.agent_rows import agent_plugin, agent_running
from bench.measure import Row
from bench.paths import GOLDEN, ONESHOT
from bench.plugin_runs import Bench, Plugin
from multicall.core.firewall.model import Family, ProxyInitOptions
from multicall.core.firewall.nft.batch import build_batch
from multicall.core.firewall.nft.native import build_native_batch, native_table
from multicall.core.firewall.proxy_init import empty_table, plan_change
from tests.support.kubeapi import pods_from_golden
from tests.support.scenarios import scenario_options

MODES = ("nft", "nftables")
V4 = Family.IPV4


def native_problem(bench: Bench, netns: str) -> str:
    """ "" when the pod's native table is what the binary expects for it (module docstring)."""
    listed = subprocess.run(
        ["nsenter", f"--net={netns}", "--", "nft", "list", "table", "ip", "linkerd-proxy-init"],
        capture_output=True, check=False,
    ).stdout  # fmt: skip
    if bench.native_verifier is None:
        return "no verifier for the nftables mode"
    verifier, pod = bench.native_verifier
    conf = bench.cluster.workdir / f"stdin-{Path(netns).name}"
    check = [*verifier, "--config", str(conf), "--pod", str(pod), "--input", "-", "--mode",
             "nftables"]  # fmt: skip
    proc = subprocess.run(check, input=listed, capture_output=True, check=False)
    if b"redirect to :4143" not in listed or proc.returncode != 0:
        return f"native table not as expected: {(proc.stdout + proc.stderr)[-300:]!r}"
    return ""


def alternating(bench: Bench, plugin: Plugin, n: int, add: Any) -> None:
    """n ADDs per mode through `plugin`, the modes taking turns (the first pair warms up)."""
    rows = {mode: Row(f"cnibox ADD, {plugin.name}, {mode} (alternating)") for mode in MODES}
    for i in range(n + 1):
        for mode in MODES:
            with bench.namespaces.fresh() as netns:
                done, ok = bench.add_once(plugin, mode, netns)
            if i:
                rows[mode].add(done.ms, ok, done.cpu_ms)
    for mode in MODES:
        add(rows[mode])


def sizes(options: ProxyInitOptions) -> dict[str, dict[str, int]]:
    """What one ADD of a fresh pod netns sends, per mode: rules, set elements, batch bytes."""
    change = plan_change(empty_table(), options, V4, backend="nft")
    nft = build_batch(change, frozenset(), V4, 0, 1)
    table = native_table(options, V4)
    native = build_native_batch((table,), 1)
    elements = sum(len(s.items) for r in table.rules for s in r.sets)
    return {
        "nft": {"rules": len(change.append), "set_items": 0, "batch_bytes": len(nft.data)},
        "nftables": {"rules": len(table.rules), "set_items": elements,
                     "batch_bytes": len(native.data)},
    }  # fmt: skip


CASES = {
    "chart defaults (meshed pod)": scenario_options("default-nft"),
    "32,768 ignored outbound ports (every odd one)": ProxyInitOptions(
        outbound_ports_to_ignore=tuple(str(p) for p in range(1, 65536, 2))
    ),
}


def native_rows(
    bench: Bench, binary: Path, impls: dict[str, Plugin], workdir: Path, n: int, *, add: Any
) -> dict[str, Any]:
    """The rows (one-shot, then agent) and the sizes; returns what goes into the results."""
    pod = workdir / "native-pod.json"
    pod.write_text(json.dumps(pods_from_golden(GOLDEN)[0]))
    bench.native_verifier = ([str(binary), "iptables-verify"], pod)
    alternating(bench, Plugin(ONESHOT, impls["binary"].argv, impls["binary"].env), n, add)
    with agent_running(binary, bench.cluster, workdir) as (sock, _log, _proc):
        alternating(bench, agent_plugin(workdir, sock), n, add)
    out = {name: sizes(options) for name, options in CASES.items()}
    print(f"{'one pod, ipv4':<48}{'mode':>10}{'rules':>8}{'set items':>11}{'batch bytes':>13}")
    for name, by_mode in out.items():
        for mode, s in by_mode.items():
            print(f"{name:<48}{mode:>10}{s['rules']:>8}{s['set_items']:>11}{s['batch_bytes']:>13}")
    return out
