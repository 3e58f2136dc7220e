"""The `legacy` firewall backend: x_tables through libiptc (python-iptables), in-process.

Rules of this module:
1. python-iptables is imported lazily, after `bundle.prepare_iptc()`, with its import-time
   side effects defused: no `modprobe` child, no `ldconfig`/`gcc` library search (libraries
   are looked up in the bundle and the usual directories only), no deprecation noise.
2. Its per-process caches are bypassed: a libiptc handle owns a socket of the netns it was
   opened in, so every call opens fresh handles in the current netns and closes them.
3. Each operation runs in a forked child (`run_isolated`): see there why. Except in a
   single-use process (a `SingleUse` passed in: a node agent's worker serves one request on
   one thread, then exits) with a backend made for one family (`sole`: an apply that
   touches that family only): there they run in the process itself (`SingleUse.run_here`),
   saving two forks of a large process per ADD. libxtables then holds that family's
   extensions, so the process hands any other family back (`errors.ServeElsewhere`, before
   anything changed: a child forked from it could not load that family's extensions).
   Such a process may load one family's extensions before its request arrives
   (`SingleUse.preload`: no handle, no netns, no rule), the same refusal then covers the
   other family.
4. `apply` edits one handle (create, flush, append) and commits once: the kernel swaps the
   whole table or nothing. Errors before the commit leave the table untouched.
   The engine holds the xtables lock (effects/firewall/locks.py) from the snapshot the change
   was planned from to the commit, as iptables holds it for one command. A writer that does
   not take the lock shows as a conflict instead of being overwritten: the handle no longer
   matches the snapshot (chains, rule counts), a chain to create exists or one to flush is
   gone, or the commit fails with EAGAIN (the kernel's table moved since the handle read it);
   each raises FirewallConflict and the engine plans again.
5. `dump` prints rules the way `iptables-legacy-save` does (`print_rule4`/`print_rule6` of
   iptables 1.8.9): address part in C order, then `-m NAME` plus each extension's own save
   output, then the target, tokenised into canonical `Rule.spec`s by the save-text lexer.

The package: loading.py (rules 1-2: python-iptables and handles), dump.py (rule 5),
apply.py (rule 4), isolation.py (rule 3: children, `SingleUse`); this module is the backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from multicall.core.firewall.model import Family, Snapshot, TableChange
from multicall.core.firewall.ruleset import Table
from multicall.effects.firewall.legacy import isolation
from multicall.effects.firewall.legacy.apply import apply_change
from multicall.effects.firewall.legacy.dump import chain_names, dump_table
from multicall.effects.firewall.legacy.isolation import OTHER_FAMILY, SingleUse
from multicall.effects.firewall.legacy.loading import opened
from multicall.errors import ServeElsewhere

T = TypeVar("T")
NAME = "legacy"
TABLE_NAMES = {Family.IPV4: "/proc/net/ip_tables_names", Family.IPV6: "/proc/net/ip6_tables_names"}


# ----------------------------------------------------------------------------- backend


def tables_present(family: Family) -> tuple[str, ...]:
    """Tables x_tables has instantiated in this netns (without instantiating any)."""
    try:
        with open(TABLE_NAMES[family]) as names:
            return tuple(line.strip() for line in names if line.strip())
    except FileNotFoundError:
        return ()


def table_has_rules(family: Family, table: str) -> bool:
    with opened(family, table) as handle:
        for name in chain_names(handle):
            if not handle.builtin_chain(name) or handle.first_rule(name):
                return True
    return False


class IptcBackend:
    """FirewallBackend for x_tables (what `iptables-legacy` programs). `sole`: the one family
    its user will touch in this process (an apply of one family), whose operations may then
    run in-process when this process is `single_use` (rule 3)."""

    def __init__(self, sole: Family | None = None, single_use: SingleUse | None = None) -> None:
        self.sole = sole
        self.single_use = single_use

    @property
    def name(self) -> str:
        return NAME

    def _run(self, family: Family, work: Callable[[], T]) -> T:
        single = self.single_use
        if single is None:
            return isolation.run_isolated(work)
        if single.family is not None and single.family is not family:
            # Neither here nor in a child forked from here: hand it back (rule 3). Raised
            # from a read (every apply plans all families first), so nothing changed yet.
            raise ServeElsewhere(OTHER_FAMILY)
        if family is self.sole:
            return single.run_here(family, work)
        return isolation.run_isolated(work)

    def dump(self, family: Family, table: str = "nat") -> Table:
        def work() -> Table:
            # Reading must not instantiate a table the netns never had (x_tables creates one
            # on first open, and its hooks then see every packet): CHECK reads raw too.
            if table != "nat" and table not in tables_present(family):
                return Table(table, ())
            return dump_table(family, table)

        return self._run(family, work)

    def snapshot(self, family: Family, table: str = "nat") -> Snapshot:
        dumped = self.dump(family, table)
        return Snapshot(dumped, None, frozenset(c.name for c in dumped.chains))

    def apply(self, family: Family, change: TableChange, base: Snapshot | None = None) -> None:
        self._run(family, lambda: apply_change(family, change, base))

    def has_rules(self, family: Family) -> bool:
        present = tables_present(family)
        return bool(present) and self._run(
            family, lambda: any(table_has_rules(family, t) for t in present)
        )
