"""A table diff as people and programs read it: a unified-diff-style text, a one-line
summary, and the `--json` document of iptables-verify."""

from __future__ import annotations

from multicall.core.firewall.canonical import canonical
from multicall.core.firewall.diff import ChainDelta, ChainHunk, ChainProblem, RuleDelta, RulesetDiff
from multicall.core.firewall.ruleset import render_rule, render_spec

JSON_SCHEMA = "cnibox.iptables-verify.diff/v1"


def format_diff(diff: RulesetDiff, *, context: int = 3) -> str:
    """A unified-diff-style report: `-` expected only, `+` actual only, with a summary."""
    scope = "whole table" if diff.strict else f"{diff.prefix}* chains and jumps to them"
    out = [f"--- expected {diff.table} ({scope})", f"+++ actual {diff.table}"]
    for delta in diff.chains:
        out.append(_chain_line(delta))
    for hunk in diff.hunks:
        out.append(f"@@ {diff.table} {hunk.chain} @@")
        out += _hunk_lines(hunk, context)
    out.append(format_summary(diff))
    return "\n".join(out) + "\n"


def _chain_line(delta: ChainDelta) -> str:
    if delta.problem is ChainProblem.POLICY:
        return (
            f"! policy of {delta.chain}: expected {delta.expected_policy}, "
            f"actual {delta.actual_policy}"
        )
    if delta.problem is ChainProblem.MISSING:
        return f"- :{delta.chain} -    # missing chain"
    return f"+ :{delta.chain} -    # unexpected chain"


def _hunk_lines(hunk: ChainHunk, context: int) -> list[str]:
    changed = [i for i, line in enumerate(hunk.lines) if line.op != " "]
    keep = {i for c in changed for i in range(c - context, c + context + 1)}
    out: list[str] = []
    skipped = False
    for i, line in enumerate(hunk.lines):
        if i not in keep:
            if not skipped:
                out.append("  ...")
            skipped = True
            continue
        skipped = False
        text = render_rule(line.rule)
        where = f", line {line.rule.line}" if line.rule.line is not None else ""
        suffix = f"    # {line.note}{where}" if line.note else ""
        out.append(f"{line.op} {text}{suffix}")
    return out


def format_summary(diff: RulesetDiff) -> str:
    if diff.ok:
        return f"{diff.table}: OK ({diff.compared_rules} rules compared)"
    parts = [
        f"{len(diff.missing)} missing",
        f"{len(diff.unexpected)} unexpected",
        f"{len(diff.out_of_order)} out of order",
        f"{len(diff.chains)} chain problem(s)",
    ]
    if diff.bypasses:
        parts.append(f"{len(diff.bypasses)} bypass(es) of the jump")
    return f"{diff.table}: MISMATCH: " + ", ".join(parts)


JsonValue = str | int | bool | None | list["JsonValue"] | dict[str, "JsonValue"]


def diff_to_json(diff: RulesetDiff) -> dict[str, JsonValue]:
    """The `--json` document's diff part (schema in docs/iptables-verify.md)."""
    return {
        "schema": JSON_SCHEMA,
        "match": diff.ok,
        "table": diff.table,
        "scope": "strict" if diff.strict else "owned",
        "prefix": diff.prefix,
        "compared_rules": diff.compared_rules,
        "chains": [_chain_json(d) for d in diff.chains],
        "rules": [_rule_json(d) for d in diff.rules],
    }


def _chain_json(delta: ChainDelta) -> dict[str, JsonValue]:
    return {
        "problem": delta.problem.value,
        "chain": delta.chain,
        "expected_policy": delta.expected_policy,
        "actual_policy": delta.actual_policy,
    }


def _rule_json(delta: RuleDelta) -> dict[str, JsonValue]:
    return {
        "problem": delta.problem.value,
        "chain": delta.chain,
        "rule": delta.text,
        "canonical": render_spec(canonical(delta.rule.spec).spec),
        "expected_position": delta.expected_position,
        "actual_position": delta.actual_position,
        "line": delta.rule.line,
        "duplicate": delta.duplicate,
    }
