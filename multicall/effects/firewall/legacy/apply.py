"""Applying a planned change to an x_tables table: one handle edited (create, flush,
append: each rule's options handed to the libxtables extension that owns them) and
committed once (rule 4 of effects/firewall/legacy)."""

from __future__ import annotations

import errno as errno_mod
from typing import Any

from multicall.core.firewall.model import Family, Snapshot, TableChange
from multicall.core.firewall.ruleset import Rule
from multicall.effects.firewall.legacy.dump import chain_names, entries, module_target_class
from multicall.effects.firewall.legacy.loading import iptc, opened, tool_name
from multicall.errors import FirewallConflict, FirewallError

STANDARD_VERDICTS = frozenset({"ACCEPT", "DROP", "QUEUE", "RETURN"})


# ----------------------------------------------------------------------------- apply


def apply_change(family: Family, change: TableChange, base: Snapshot | None = None) -> None:
    module = iptc()
    errors = (module.IPTCError, module.xtables.XTablesError, ValueError, AttributeError)
    with opened(family, change.table) as handle:
        if base is not None and not _handle_matches(handle, base):
            raise FirewallConflict(
                f"{tool_name(family)}: the {change.table} table changed since it was read",
                table=change.table,
            )
        try:
            for name in change.create_chains:
                if handle.is_chain(name):
                    raise FirewallConflict(
                        f"{tool_name(family)}: chain {name} appeared since the table was read",
                        table=change.table,
                    )
                handle.create_chain(name)
            for name in change.flush_chains:
                if not handle.is_chain(name):
                    raise FirewallConflict(
                        f"{tool_name(family)}: chain {name} vanished since the table was read",
                        table=change.table,
                    )
                handle.flush_entries(name)
            for rule in change.append:
                handle.append_entry(rule.chain, encode_rule(handle, rule, family).rule)
        except errors as exc:
            raise FirewallError(f"{tool_name(family)}: {exc}", table=change.table) from exc
        _commit(handle, family, change.table)


def _handle_matches(handle: Any, base: Snapshot) -> bool:
    """The handle holds the chains and per-chain rule counts of the snapshot."""
    names = chain_names(handle)
    if set(names) != {c.name for c in base.table.chains}:
        return False
    return all(
        sum(1 for _ in entries(handle, name)) == len(base.table.rules_of(name)) for name in names
    )


def _commit(handle: Any, family: Family, table: str) -> None:
    """One TC_COMMIT; EAGAIN means the kernel's table is no longer the one the handle read."""
    if handle._iptc.iptc_commit(handle._handle) == 1:
        return
    err = iptc().ip4tc._get_errno_loc()[0]  # read before any other call can clobber it
    text = handle._iptc.iptc_strerror(err)
    message = (
        f"{tool_name(family)}: can't commit: {text.decode() if isinstance(text, bytes) else text}"
    )
    if err == errno_mod.EAGAIN:
        raise FirewallConflict(message, table=table, errno=err)
    raise FirewallError(message, table=table, errno=err)


def encode_rule(handle: Any, rule: Rule, family: Family) -> Any:
    """A python-iptables rule from canonical tokens (the forms `iptables-save` prints)."""
    module = iptc()
    out = module.Rule() if family is Family.IPV4 else module.Rule6()
    words = list(rule.spec)
    current: Any = None
    i, invert = 0, ""
    while i < len(words):
        if words[i] == "!":
            invert, i = "!", i + 1
            continue
        i, current = _feed(handle, out, current, words, i, invert=invert)
        invert = ""
    for match in out.matches:
        match._final_check()
    if out.target is None:
        out.target = module.Target(out, "")  # no -j: fall through
    out.target._final_check()
    return out


_ADDRESS_SETTERS = {
    "-s": "src",
    "-d": "dst",
    "-i": "in_interface",
    "-o": "out_interface",
    "-p": "protocol",
}


def _feed(handle: Any, out: Any, current: Any, words: list[str], i: int, *, invert: str) -> Any:
    """Consume one option at `i`; returns (next index, the match/target options go to)."""
    word = words[i]
    if word in _ADDRESS_SETTERS:
        setattr(out, _ADDRESS_SETTERS[word], invert + words[i + 1])
        return i + 2, current
    if word == "-f":
        out.fragment = not invert
        return i + 1, current
    if word == "-m":
        return i + 2, out.create_match(words[i + 1])
    if word in ("-j", "-g"):
        return i + 2, _make_target(handle, out, words[i + 1], goto=word == "-g")
    return _option(current, words, i, invert), current


def _option(current: Any, words: list[str], i: int, invert: str) -> int:
    """Feed `--name [value]` to the last match/target; returns the next index."""
    word = words[i]
    if current is None or not word.startswith("--"):
        raise ValueError(f"unexpected {word!r} in rule")
    value = ""
    following = words[i + 1] if i + 1 < len(words) else None
    if following is not None and not _starts_option(following):
        value, i = following, i + 1
    current.parse(word[2:], invert + value)
    return i + 1


def _starts_option(word: str) -> bool:
    return word == "!" or word.startswith("--") or word in ("-m", "-j", "-g")


def _make_target(handle: Any, rule: Any, name: str, *, goto: bool) -> Any:
    module = iptc()
    if name in STANDARD_VERDICTS:
        target = module.Target(rule, name, goto=goto)
    elif handle.is_chain(name):
        target = module.Target(rule, "", goto=goto)
        target.standard_target = name
    else:
        target = module_target_class()(rule, name, goto=goto)
    rule.target = target
    return target
