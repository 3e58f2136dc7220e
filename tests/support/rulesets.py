"""Rule-set helpers only tests need: the save text of a whole ruleset, the last table of
concatenated dumps, and the `iptables-restore --noflush` input of a planned change (what
upstream's replay and the oracles feed Debian's iptables)."""

from __future__ import annotations

from multicall.core.firewall.model import TableChange
from multicall.core.firewall.ruleset import Ruleset, Table, render_rule, render_table


def render_ruleset(ruleset: Ruleset) -> str:
    return "".join(render_table(t) for t in ruleset.tables)


def last_table(ruleset: Ruleset, name: str) -> Table | None:
    """The last `name` table of a ruleset: concatenated dumps describe the latest state last."""
    found = [t for t in ruleset.tables if t.name == name]
    return found[-1] if found else None


def render_restore(change: TableChange) -> str:
    """`iptables-restore --noflush` input for `change`.

    Declaring a user chain creates it or, if present, flushes it; built-in chains are never
    declared, so their rules survive and each listed jump is appended. Only valid against
    the table the change was planned from: restoring it twice duplicates the jumps (the
    `--noflush` trap in fixtures/derived/iptables-canonicalization/).
    """
    lines = [f"*{change.table}"]
    lines += [f":{name} - [0:0]" for name in (*change.create_chains, *change.flush_chains)]
    lines += [render_rule(r) for r in change.append]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"
