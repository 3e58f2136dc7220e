"""The firewall engine's entry points: apply Linkerd's PROXY_INIT rules inside a pod's network
namespace, and read a nat table back, choosing the backend from `iptables-mode`.

Rules of this module:
1. Everything happens in this process, inside the target netns (`ns.entered_netns`); the
   caller's own netns is refused unless the `NetnsRef` allows it (CNI_NETNS_OVERRIDE).
2. Every family is dumped and planned before any is changed: options that the IPv6 pass
   rejects (an IPv4 CIDR) leave the IPv4 table untouched as well. Each table then changes
   in one transaction (one libiptc commit, one nf_tables batch).
3. `legacy` is x_tables through libiptc, `nft` is nf_tables over netlink, `plain` detects as
   Istio does: legacy if legacy already holds rules in this netns, else nft if the kernel
   speaks it, else legacy; the choice is logged.
4. Simulate mode and the logging of dropped port items are the plugin's
   (`multicall.plugin.commands`): this engine only ever programs or reads rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from multicall.core.firewall.model import (
    Family,
    FirewallBackend,
    Mode,
    ProxyInitOptions,
    TableChange,
)
from multicall.core.firewall.proxy_init import plan_change
from multicall.core.firewall.ruleset import Table
from multicall.effects import ns
from multicall.effects.ns import NetnsRef
from multicall.errors import FirewallError

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    """The default log: drop messages."""


# ----------------------------------------------------------------------------- backends


def legacy_backend() -> FirewallBackend:
    # Imported here: libiptc's module (ctypes, pickle, subprocess) costs every nft ADD ~50 ms.
    from multicall.effects.firewall.legacy import IptcBackend

    backend: FirewallBackend = IptcBackend()
    return backend


def nft_backend() -> FirewallBackend:
    from multicall.effects.firewall.nft import NftBackend

    backend: FirewallBackend = NftBackend()
    return backend


def _nft_usable() -> FirewallBackend | None:
    from multicall.effects.firewall.nft import NftBackend

    backend = NftBackend()
    return backend if backend.available() else None


def _legacy_has_rules(family: Family) -> bool:
    try:
        from multicall.effects.firewall.legacy import IptcBackend

        return IptcBackend().has_rules(family)
    except FirewallError:
        return False  # libiptc unusable here: legacy cannot be what this netns uses


def detect_backend(family: Family, log: Log = _quiet) -> FirewallBackend:
    """Istio's order: legacy if it has rules here, else nft if usable, else legacy."""
    if _legacy_has_rules(family):
        backend = legacy_backend()
        reason = "legacy tables already hold rules in this netns"
    elif (nft := _nft_usable()) is not None:
        backend, reason = nft, "no legacy rules here and nf_tables is usable"
    else:
        backend, reason = legacy_backend(), "nf_tables is not usable"
    log(f"iptables-mode plain: using {backend.name} for {family.value} ({reason})")
    return backend


def backend_for(mode: Mode, family: Family, log: Log = _quiet) -> FirewallBackend:
    """The backend of `mode`; call it inside the target netns (`plain` looks around)."""
    if mode is Mode.LEGACY:
        return legacy_backend()
    if mode is Mode.NFT:
        return nft_backend()
    return detect_backend(family, log)


# ----------------------------------------------------------------------------- apply


@dataclass(frozen=True, slots=True)
class Pass:
    """One family's planned change and the backend that will apply it."""

    family: Family
    backend: FirewallBackend
    change: TableChange


def plan_pass(options: ProxyInitOptions, family: Family, mode: Mode, log: Log) -> Pass:
    backend = backend_for(mode, family, log)
    before = backend.dump(family, "nat")
    change = plan_change(before, options, family, backend=backend.name)
    return Pass(family, backend, change)


def apply_proxy_init(
    netns: NetnsRef | str,
    options: ProxyInitOptions,
    *,
    mode: Mode,
    families: tuple[Family, ...],
    log: Log = _quiet,
) -> None:
    """Program PROXY_INIT_REDIRECT/PROXY_INIT_OUTPUT and their jumps in the pod's netns (a
    `NetnsRef`, or a path: never the caller's own), for each of `families` in order.
    Raises FirewallError (rules rejected), NetnsError (netns).
    """
    with ns.entered_netns(netns):
        passes = [plan_pass(options, family, mode, log) for family in families]
        for planned in passes:
            planned.backend.apply(planned.family, planned.change)
            log(describe(planned))


def describe(planned: Pass) -> str:
    change = planned.change
    return (
        f"{planned.family.value} nat via {planned.backend.name}: created "
        f"{list(change.create_chains)}, flushed {list(change.flush_chains)}, "
        f"appended {len(change.append)} rules"
    )


# ----------------------------------------------------------------------------- dump


def dump_nat(netns: NetnsRef | str, *, mode: Mode, family: Family, log: Log = _quiet) -> Table:
    """The nat table of `family` in the netns, read through `mode`'s backend."""
    with ns.entered_netns(netns):
        return backend_for(mode, family, log).dump(family, "nat")
