"""What linkerd-cni's ADD gives a pod, computed once for everyone who compares against it:
CHECK (plugin/commands.py), the repair controller's check of a repaired sandbox (through
CHECK's `commands.drifted_families`) and iptables-verify (plugin/verify.py).

Rules of this module:
1. A pod's options are the config's, overridden by the pod's and its namespace's
   config.linkerd.io annotations (and, for control-plane pods, the API service's ports), and
   only for a pod the plugin meshes (`pod_policy.decide`); ADD programs exactly these.
2. The expected nat table is ADD's plan applied to a fresh network namespace; a pod the
   plugin gives no rules expects a fresh table.
3. ADD appends a PREROUTING/OUTPUT jump only when none matching upstream's regex is there
   (proxy_init.has_jump), so a jump found in the live table (with another comment or none)
   is the one ADD kept: the expectation adopts the first such jump of each chain, and
   CHECK passes after ADD (unless the netns already held two jumps to one chain).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multicall.core.firewall.model import Family, ProxyInitOptions
    from multicall.core.firewall.ruleset import Table
    from multicall.core.kube.pod_policy import Decision
    from multicall.plugin.pod_inputs import PodInputs


@dataclass(frozen=True, slots=True)
class PodOptions:
    """Whether the plugin meshes a pod (with upstream's line for it), and its options."""

    decision: Decision
    options: ProxyInitOptions | None  # None exactly when the pod gets no rules


def _ignore(_decision: Decision) -> None:
    """The default for `on_decision`: nothing to log."""


def options_for_pod(
    base: ProxyInitOptions,
    inputs: PodInputs,
    *,
    on_decision: Callable[[Decision], None] = _ignore,
) -> PodOptions:
    """The options ADD programs for the pod of `inputs` given the config's `base` options.
    `on_decision` sees the decision before any annotation is read (the plugin logs it and
    names its next step there, so that an invalid annotation's error says where it was)."""
    from multicall.core.kube.pod_policy import decide, effective_options

    decision = decide(inputs.pod)
    on_decision(decision)
    if not decision.meshed:
        return PodOptions(decision, None)
    options = effective_options(base, inputs.pod, inputs.namespace_annotations, inputs.service)
    return PodOptions(decision, options)


def expected_for_pod(
    options: ProxyInitOptions | None,
    family: Family,
    *,
    backend: str = "legacy",
    present: Table | None = None,
) -> Table:
    """The nat table of one family that ADD leaves in a fresh network namespace for a pod
    with `options` (None: a pod that gets no rules). `backend` ("legacy" or "nft") only
    flavours the message of options ADD would reject. `present` is the live table: its
    jumps to the PROXY_INIT chains are the ones ADD kept (rule 3)."""
    from multicall.core.firewall.proxy_init import empty_table, expected_table

    if options is None:
        return empty_table()
    return expected_table(options, family, existing=_kept_jumps(present), backend=backend)


def _kept_jumps(present: Table | None) -> Table | None:
    """A fresh table holding only the jumps of `present` that ADD would not add again."""
    from dataclasses import replace

    from multicall.core.firewall.proxy_init import JUMP_CHAINS, empty_table, has_jump

    if present is None:
        return None
    fresh = empty_table(present.name)
    jumps = []
    for chain in JUMP_CHAINS:
        # The first one only: a second jump is still reported (traffic would cross the
        # chain twice), as CHECK always did; ADD itself never leaves two in a fresh netns.
        found = (r for r in present.rules_of(chain) if has_jump(replace(fresh, rules=(r,)), chain))
        jumps += list(found)[:1]
    return replace(fresh, rules=tuple(jumps)) if jumps else None
