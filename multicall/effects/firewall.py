"""The firewall engine's entry points: apply Linkerd's PROXY_INIT rules inside a pod's network
namespace, and read a nat table back, choosing the backend from `iptables-mode`.

Rules of this module:
1. Everything happens in this process, inside the target netns (`ns.entered_netns`); the
   caller's own netns is refused unless `allow_own_netns` (libcni's CNI_NETNS_OVERRIDE).
2. Every family is dumped and planned before any is changed: options that the IPv6 pass
   rejects (an IPv4 CIDR) leave the IPv4 table untouched as well. Each table then changes
   in one transaction (one libiptc commit, one nf_tables batch).
3. `legacy` is x_tables through libiptc, `nft` is nf_tables over netlink, `plain` detects as
   Istio does: legacy if legacy already holds rules in this netns, else nft if the kernel
   speaks it, else legacy; the choice is logged.
4. Simulate mode enters nothing and changes nothing: it logs the commands upstream would run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from multicall.core.firewall import Family, FirewallBackend, Mode, ProxyInitOptions, TableChange
from multicall.core.proxy_init import build_run_argv, invalid_ports, plan_change
from multicall.core.ruleset import Table
from multicall.effects import ns
from multicall.errors import FirewallError

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    """The default log: drop messages."""


def families(*, ipv6: bool) -> tuple[Family, ...]:
    return (Family.IPV4, Family.IPV6) if ipv6 else (Family.IPV4,)


# ----------------------------------------------------------------------------- backends


def legacy_backend() -> FirewallBackend:
    # Imported here: libiptc's module (ctypes, pickle, subprocess) costs every nft ADD ~50 ms.
    from multicall.effects.iptc_backend import IptcBackend

    backend: FirewallBackend = IptcBackend()
    return backend


def nft_backend() -> FirewallBackend:
    from multicall.effects.nft_backend import NftBackend

    backend: FirewallBackend = NftBackend()
    return backend


def _nft_usable() -> FirewallBackend | None:
    from multicall.effects.nft_backend import NftBackend

    backend = NftBackend()
    return backend if backend.available() else None


def _legacy_has_rules(family: Family) -> bool:
    try:
        from multicall.effects.iptc_backend import IptcBackend

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
    netns_path: str,
    options: ProxyInitOptions,
    *,
    mode: Mode,
    ipv6: bool,
    simulate: bool = False,
    allow_own_netns: bool = False,
    log: Log = _quiet,
) -> None:
    """Program PROXY_INIT_REDIRECT/PROXY_INIT_OUTPUT and their jumps in the pod's netns.

    IPv4, then IPv6 when `ipv6`. Raises FirewallError (rules rejected), NetnsError (netns).
    """
    for dropped in invalid_ports(options):
        log(dropped.message())
    wanted = families(ipv6=ipv6)
    if simulate:
        log_simulation(netns_path, options, wanted, mode, log)
        return
    with ns.entered_netns(netns_path, allow_own=allow_own_netns):
        passes = [plan_pass(options, family, mode, log) for family in wanted]
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


def log_simulation(
    netns_path: str, options: ProxyInitOptions, wanted: Sequence[Family], mode: Mode, log: Log
) -> None:
    """Upstream's simulate output: each command line, existing rules taken as empty."""
    for family in wanted:
        for argv in build_run_argv(options, family, mode=mode, netns=netns_path):
            log(" ".join(argv))


# ----------------------------------------------------------------------------- dump


def differences(
    netns_path: str,
    options: ProxyInitOptions,
    *,
    mode: Mode,
    ipv6: bool,
    allow_own_netns: bool = False,
    log: Log = _quiet,
) -> list[str]:
    """One readable diff per family whose live nat table lacks what apply_proxy_init would
    program (empty: the netns holds exactly the expected rules). CHECK's comparison."""
    from multicall.core.proxy_init import expected_table
    from multicall.core.ruleset_diff import diff_tables, format_diff

    problems = []
    for family in families(ipv6=ipv6):
        expected = expected_table(options, family)
        actual = dump_nat(
            netns_path, mode=mode, family=family, allow_own_netns=allow_own_netns, log=log
        )
        diff = diff_tables(expected, actual)
        if not diff.ok:
            problems.append(f"{family.value}:\n{format_diff(diff)}")
    return problems


def dump_nat(
    netns_path: str,
    *,
    mode: Mode,
    family: Family,
    allow_own_netns: bool = False,
    log: Log = _quiet,
) -> Table:
    """The nat table of `family` in the netns, read through `mode`'s backend."""
    with ns.entered_netns(netns_path, allow_own=allow_own_netns):
        return backend_for(mode, family, log).dump(family, "nat")
