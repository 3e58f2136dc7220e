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
   speaks it, else legacy; the choice is logged. `nftables` is no iptables backend: its own
   native tables (core/firewall/nft/native.py), all of a pod's families in one batch
   (`apply_native_proxy_init`, `dump_native`); it has no nat table to dump.
4. Simulate mode and the logging of dropped port items are the plugin's
   (`multicall.plugin.commands`): this engine only ever programs or reads rules.
5. Concurrency: each change is planned from a snapshot and applied against it; when the table
   moved in between (FirewallConflict: nothing was changed) the family is planned again from
   a fresh snapshot and applied again, up to ATTEMPTS times with a growing, jittered pause,
   so the result is exactly what one run on the final table makes (no duplicate jumps).
   Before its first legacy read, an apply takes the netns lock and the xtables lock
   (`locks.py`, honouring `use-wait-flag`) and holds both to its end, as iptables holds the
   xtables lock for one command; nf_tables needs no lock (its generation id guards the batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.core.firewall.model import (
    Family,
    FirewallBackend,
    Mode,
    ProxyInitOptions,
    Snapshot,
    TableChange,
)
from multicall.core.firewall.proxy_init import plan_change
from multicall.core.firewall.ruleset import Table
from multicall.core.logs import MessageLog, quiet
from multicall.effects import ns
from multicall.effects.firewall.locks import XtablesLock, legacy_locks
from multicall.effects.ns import NetnsRef
from multicall.errors import FirewallConflict, FirewallError

if TYPE_CHECKING:  # the backends' modules are imported when first used (`Backends`)
    from multicall.core.firewall.nft.native import NativeTable
    from multicall.effects.firewall.legacy.isolation import SingleUse
    from multicall.effects.firewall.nft import HandedSocket


# ----------------------------------------------------------------------------- backends


@dataclass(frozen=True, slots=True)
class Backends:
    """How this process reaches the two backends for one netns: `handed`, the caller's
    netlink socket in it (nft.py rule 2), and `single_use`, whether this process serves one
    request (legacy.py rule 3). The default: neither (a one-shot plugin, a controller)."""

    handed: HandedSocket | None = None
    single_use: SingleUse | None = None

    @classmethod
    def for_netns(cls, netns: NetnsRef | str, single_use: SingleUse | None) -> Backends:
        if isinstance(netns, str) or netns.netlink_fd is None:
            return cls(None, single_use)
        from multicall.effects.firewall.nft import HandedSocket

        return cls(HandedSocket(netns.netlink_fd, netns.fd), single_use)

    def legacy(self, sole: Family | None = None) -> FirewallBackend:
        """`sole`: the only family the caller will touch (legacy.py rule 3)."""
        # Imported here: libiptc's module (ctypes, pickle, subprocess) costs every nft ADD
        # ~50 ms.
        from multicall.effects.firewall.legacy import IptcBackend

        backend: FirewallBackend = IptcBackend(sole, self.single_use)
        return backend

    def nft(self) -> FirewallBackend:
        from multicall.effects.firewall.nft import NftBackend

        backend: FirewallBackend = NftBackend(handed=self.handed)
        return backend

    def nft_usable(self) -> FirewallBackend | None:
        from multicall.effects.firewall.nft import NftBackend

        backend = NftBackend(handed=self.handed)
        return backend if backend.available() else None

    def legacy_has_rules(self, family: Family) -> bool:
        try:
            from multicall.effects.firewall.legacy import IptcBackend

            return IptcBackend(None, self.single_use).has_rules(family)
        except FirewallError:
            return False  # libiptc unusable here: legacy cannot be what this netns uses


PLAIN = Backends()  # immutable: no caller socket, not single-use


def detect_backend(
    family: Family, log: MessageLog = quiet, *, sole: bool = False, backends: Backends = PLAIN
) -> FirewallBackend:
    """Istio's order: legacy if it has rules here, else nft if usable, else legacy."""
    legacy_sole = family if sole else None
    if backends.legacy_has_rules(family):
        backend = backends.legacy(legacy_sole)
        reason = "legacy tables already hold rules in this netns"
    elif (nft := backends.nft_usable()) is not None:
        backend, reason = nft, "no legacy rules here and nf_tables is usable"
    else:
        backend, reason = backends.legacy(legacy_sole), "nf_tables is not usable"
    log(f"iptables-mode plain: using {backend.name} for {family.value} ({reason})")
    return backend


def backend_for(
    mode: Mode,
    family: Family,
    log: MessageLog = quiet,
    *,
    sole: bool = False,
    backends: Backends = PLAIN,
) -> FirewallBackend:
    """The backend of `mode`; call it inside the target netns (`plain` looks around).
    `sole`: `family` is the only one the caller touches (legacy.py rule 3)."""
    if mode is Mode.LEGACY:
        return backends.legacy(family if sole else None)
    if mode is Mode.NFT:
        return backends.nft()
    if mode is Mode.NFTABLES:
        raise FirewallError(
            'iptables-mode "nftables" programs no iptables nat table: read its '
            "linkerd-proxy-init tables instead"
        )
    return detect_backend(family, log, sole=sole, backends=backends)


# ----------------------------------------------------------------------------- apply

ATTEMPTS = 8
PAUSE_FIRST, PAUSE_MAX = 0.01, 0.2  # seconds; at most ~1 s of pauses over all attempts


@dataclass(frozen=True, slots=True)
class Pass:
    """One family's planned change, the snapshot it was planned from, and its backend."""

    family: Family
    backend: FirewallBackend
    change: TableChange
    base: Snapshot


class _Session:
    """One apply: a backend instance per kind shared by the families (nft's dual-stack needs
    no second read, see nft.py), and the legacy locks taken before the first legacy read."""

    def __init__(
        self,
        mode: Mode,
        options: ProxyInitOptions,
        lock: XtablesLock,
        log: MessageLog,
        stack: ExitStack,
        *,
        sleep: Callable[[float], None] = time.sleep,
        sole: bool = False,
        backends: Backends = PLAIN,
    ) -> None:
        self.mode, self.options, self.lock, self.log = mode, options, lock, log
        self.stack, self.sleep = stack, sleep
        self.sole = sole  # one family only: a single-use process may run libiptc in-process
        self.kinds = backends
        self.backends: dict[str, FirewallBackend] = {}
        self.locked = False

    def backend(self, family: Family) -> FirewallBackend:
        found = backend_for(self.mode, family, self.log, sole=self.sole, backends=self.kinds)
        backend = self.backends.setdefault(found.name, found)
        if backend.name == "legacy" and not self.locked:
            self.stack.enter_context(
                legacy_locks(self.lock, wait=self.options.use_wait_flag, log=self.log)
            )
            self.locked = True
        return backend

    def plan(self, family: Family, backend: FirewallBackend | None = None) -> Pass:
        """The change for `family`, planned from a snapshot read now."""
        backend = backend or self.backend(family)
        base = backend.snapshot(family, "nat")
        change = plan_change(base.table, self.options, family, backend=backend.name)
        return Pass(family, backend, change, base)

    def apply(self, planned: Pass) -> Pass:
        """Apply, planning again after each conflict (rule 5); returns what was applied."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                planned.backend.apply(planned.family, planned.change, planned.base)
                return planned
            except FirewallConflict as exc:
                if attempt == ATTEMPTS:
                    raise FirewallError(
                        f"the {planned.family.value} nat table kept changing while being "
                        f"written ({ATTEMPTS} attempts); nothing was changed: {exc.message}",
                        table="nat",
                    ) from exc
                self.log(f"{exc.message}; planning again (attempt {attempt + 1})")
                self.sleep(pause(attempt))
                planned = self.plan(planned.family, planned.backend)
        raise AssertionError("unreachable")  # pragma: no cover


def pause(attempt: int) -> float:
    """Seconds to wait before attempt `attempt + 1`: doubling from 10 ms, at most 200 ms,
    jittered so two writers that collided do not collide again in step."""
    import random  # here: only a conflict needs it (_random, _sha512, bisect on every ADD)

    return min(PAUSE_MAX, PAUSE_FIRST * 2.0 ** (attempt - 1)) * random.uniform(0.5, 1.0)  # noqa: S311


def apply_proxy_init(
    netns: NetnsRef | str,
    options: ProxyInitOptions,
    *,
    mode: Mode,
    families: tuple[Family, ...],
    log: MessageLog = quiet,
    lock: XtablesLock | None = None,
    single_use: SingleUse | None = None,
) -> None:
    """Program PROXY_INIT_REDIRECT/PROXY_INIT_OUTPUT and their jumps in the pod's netns (a
    `NetnsRef`, or a path: never the caller's own), for each of `families` in order.
    `lock` says where the xtables lock is (default: as iptables finds it, see locks.py);
    `single_use`: this process serves one request (legacy.py rule 3).
    Raises FirewallError (rules rejected, lock busy), NetnsError (netns).
    """
    if mode is Mode.NFTABLES:
        apply_native_proxy_init(netns, options, families=families, log=log)
        return
    with ns.entered_netns(netns, netlink_only=mode is Mode.NFT), ExitStack() as stack:
        sole = len(set(families)) == 1
        backends = Backends.for_netns(netns, single_use)
        session = _Session(
            mode, options, lock or XtablesLock(), log, stack, sole=sole, backends=backends
        )
        passes = [session.plan(family) for family in families]
        for planned in passes:
            log(describe(session.apply(planned)))


def describe(planned: Pass) -> str:
    """One log line per family: `ipv4 nat via nft: created PROXY_INIT_REDIRECT,
    PROXY_INIT_OUTPUT; flushed none; appended 7 rules`."""
    change = planned.change

    def names(chains: tuple[str, ...]) -> str:
        return ", ".join(chains) or "none"

    return (
        f"{planned.family.value} nat via {planned.backend.name}: created "
        f"{names(tuple(change.create_chains))}; flushed {names(tuple(change.flush_chains))}; "
        f"appended {len(change.append)} rules"
    )


def apply_native_proxy_init(
    netns: NetnsRef | str,
    options: ProxyInitOptions,
    *,
    families: tuple[Family, ...],
    log: MessageLog = quiet,
) -> None:
    """`iptables-mode: nftables`: every family's `linkerd-proxy-init` table, planned before
    anything is sent (rule 2), then programmed in one batch. No lock, no retry: the batch
    replaces the tables whatever they held (native.py rule 4)."""
    from multicall.core.firewall.nft.native import TABLE, native_table
    from multicall.effects.firewall.nft import apply_native

    tables = tuple(native_table(options, family) for family in dict.fromkeys(families))
    handed = Backends.for_netns(netns, None).handed
    with ns.entered_netns(netns, netlink_only=True):
        apply_native(tables, handed)
    for table in tables:
        log(
            f"{table.family.value} {TABLE} via nftables: table replaced, "
            f"{len(table.rules)} rules in one batch"
        )


# ----------------------------------------------------------------------------- dump


def dump_nat(
    netns: NetnsRef | str,
    *,
    mode: Mode,
    family: Family,
    log: MessageLog = quiet,
    single_use: SingleUse | None = None,
    table: str = "nat",
) -> Table:
    """The nat table (or `table`: CHECK and iptables-verify read raw too) of `family` in
    the netns, read through `mode`'s backend."""
    backends = Backends.for_netns(netns, single_use)
    with ns.entered_netns(netns, netlink_only=mode is Mode.NFT):
        return backend_for(mode, family, log, backends=backends).dump(family, table)


def dump_native(
    netns: NetnsRef | str, *, family: Family, log: MessageLog = quiet
) -> NativeTable | None:
    """The family's native `linkerd-proxy-init` table in the netns (None: there is none)."""
    from multicall.effects.firewall.nft import read_native

    handed = Backends.for_netns(netns, None).handed
    with ns.entered_netns(netns, netlink_only=True):
        return read_native(family, handed)
