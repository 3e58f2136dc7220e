"""The expected-vs-actual comparison of one table, rule by rule in canonical form.

Rules of this module:
1. Rules are compared by their canonical form (`canonical.canonical`); order within a chain
   counts, counters never do.
2. By default only the chains named with the owned prefix (`PROXY_INIT_`) and the rules
   jumping to them are compared; `strict` compares the whole table.
3. A rule missing in one place and present in another is reported as moved, not as one
   missing and one unexpected rule.
4. The owned rules must also be reached: in the nat table's PREROUTING and OUTPUT, a rule
   ahead of the jump into the owned chains that can end a TCP packet's walk (ACCEPT,
   RETURN, DROP, REJECT, DNAT, a goto, a jump into another chain...) bypasses the redirect
   and is reported (`bypasses`), whatever the mode. CHECK, iptables-verify and the agent's
   drift detection judge with this one function. The raw table, when given, is judged too
   (`untracked`): a packet made untracked there (NOTRACK, CT --notrack) never reaches nat.
   Other tables are not: mangle and filter cannot make a packet skip nat's chains (their
   ACCEPT ends their own chain only; a DROP stops the packet, which then reaches no one).
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from multicall.core.firewall.canonical import CanonicalRule, canonical
from multicall.core.firewall.protocols import protocol_number
from multicall.core.firewall.ruleset import BUILTIN_CHAINS, Rule, Table, render_rule

OWNED_PREFIX = "PROXY_INIT_"


class RuleProblem(Enum):
    MISSING = "missing"
    UNEXPECTED = "unexpected"
    OUT_OF_ORDER = "out-of-order"
    BYPASS = "bypass"  # ahead of the jump into the owned chains, it can end the walk


class ChainProblem(Enum):
    MISSING = "missing-chain"
    UNEXPECTED = "unexpected-chain"
    POLICY = "wrong-policy"


@dataclass(frozen=True, slots=True)
class RuleDelta:
    """One rule that is missing, unexpected or out of order."""

    problem: RuleProblem
    chain: str
    rule: Rule  # the expected rule (missing, out-of-order) or the actual one (unexpected)
    expected_position: int | None  # 1-based within the compared rules of the chain
    actual_position: int | None
    duplicate: bool = False  # unexpected, but an identical rule is also present

    @property
    def text(self) -> str:
        return render_rule(self.rule)


@dataclass(frozen=True, slots=True)
class ChainDelta:
    """One chain that is missing, unexpected or has another policy."""

    problem: ChainProblem
    chain: str
    expected_policy: str | None = None
    actual_policy: str | None = None


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One line of the unified-diff view: ' ' same, '-' expected only, '+' actual only."""

    op: str
    rule: Rule
    note: str = ""


@dataclass(frozen=True, slots=True)
class ChainHunk:
    """The diff lines of one chain."""

    chain: str
    lines: tuple[DiffLine, ...]


@dataclass(frozen=True, slots=True)
class RulesetDiff:
    """Every difference between an expected and an actual table."""

    table: str
    strict: bool
    prefix: str
    chains: tuple[ChainDelta, ...] = ()
    rules: tuple[RuleDelta, ...] = ()
    hunks: tuple[ChainHunk, ...] = ()
    compared_rules: int = 0

    @property
    def ok(self) -> bool:
        return not self.chains and not self.rules

    def _of(self, problem: RuleProblem) -> tuple[RuleDelta, ...]:
        return tuple(d for d in self.rules if d.problem is problem)

    @property
    def missing(self) -> tuple[RuleDelta, ...]:
        return self._of(RuleProblem.MISSING)

    @property
    def unexpected(self) -> tuple[RuleDelta, ...]:
        return self._of(RuleProblem.UNEXPECTED)

    @property
    def out_of_order(self) -> tuple[RuleDelta, ...]:
        return self._of(RuleProblem.OUT_OF_ORDER)

    @property
    def bypasses(self) -> tuple[RuleDelta, ...]:
        return self._of(RuleProblem.BYPASS)


def diff_tables(
    expected: Table,
    actual: Table,
    *,
    strict: bool = False,
    prefix: str = OWNED_PREFIX,
    chains_known: bool = True,
    raw: Table | None = None,
) -> RulesetDiff:
    """Compare two dumps of one table (see the module rules for what counts).
    `chains_known=False`: `actual` holds only what `may_matter` kept (see `bypasses`).
    `raw`: the same netns's raw table, judged by `untracked` (None: not read)."""
    chains: list[ChainDelta] = []
    rules: list[RuleDelta] = []
    hunks: list[ChainHunk] = []
    compared = 0
    exp_rules, act_rules = _by_chain(expected), _by_chain(actual)
    exp_chains, act_chains = _declared(expected), _declared(actual)
    builtins = BUILTIN_CHAINS.get(expected.name, ())
    for name in _chain_names(exp_chains, act_chains, builtins):
        chains += _chain_deltas(
            exp_chains, act_chains, name, builtins, strict=strict, prefix=prefix
        )
        owned = strict or name.startswith(prefix)
        exp = _scoped(exp_rules.get(name, []), owned, prefix)
        act = _scoped(act_rules.get(name, []), owned, prefix)
        compared += len(exp)
        deltas, hunk = _diff_chain(name, exp, act)
        rules += deltas
        if hunk is not None:
            hunks.append(hunk)
    # Bypasses are judged for Linkerd's chains only: upstream writes nothing in the built-in
    # chains but the jumps, so any terminating rule ahead of them is foreign. Another
    # prefix (an Istio payload compared with iptables-verify --prefix) has rules of its own
    # there by design (`-o NIC -j RETURN`), which this rule cannot tell from a bypass.
    judged = bypasses(actual, prefix, chains_known=chains_known) if prefix == OWNED_PREFIX else {}
    for chain, found in judged.items():
        rules += found
        notes = [DiffLine("+", d.rule, "bypass: ends the walk before the jump") for d in found]
        hunks.append(ChainHunk(chain, tuple(notes)))
    if raw is not None and prefix == OWNED_PREFIX and expected.name == "nat":
        for chain, found in untracked(raw).items():
            rules += found
            note = "bypass: untracked in the raw table, the packet skips nat"
            hunks.append(
                ChainHunk(f"{chain} (raw)", tuple(DiffLine("+", d.rule, note) for d in found))
            )
    return RulesetDiff(
        expected.name, strict, prefix, tuple(chains), tuple(rules), tuple(hunks), compared
    )


def _declared(table: Table) -> dict[str, str | None]:
    names: dict[str, str | None] = {c.name: c.policy for c in table.chains}
    for rule in table.rules:
        names.setdefault(rule.chain, None)
    return names


def _by_chain(table: Table) -> dict[str, list[Rule]]:
    out: dict[str, list[Rule]] = {}
    for rule in table.rules:
        out.setdefault(rule.chain, []).append(rule)
    return out


def _chain_names(
    exp: dict[str, str | None], act: dict[str, str | None], builtins: Sequence[str]
) -> list[str]:
    """Every chain either side has; outside owned chains only jumps into them are compared."""
    names = set(exp) | set(act)
    return [n for n in builtins if n in names] + sorted(names - set(builtins))


def _chain_deltas(
    exp: dict[str, str | None],
    act: dict[str, str | None],
    name: str,
    builtins: Sequence[str],
    *,
    strict: bool,
    prefix: str,
) -> list[ChainDelta]:
    if name in builtins:
        # Built-in chains always exist; a restore file may leave them undeclared (None).
        e, a = exp.get(name), act.get(name)
        if strict and e is not None and a is not None and e != a:
            return [ChainDelta(ChainProblem.POLICY, name, e, a)]
        return []
    if not strict and not name.startswith(prefix):
        return []
    if name in exp and name not in act:
        return [ChainDelta(ChainProblem.MISSING, name)]
    if name in act and name not in exp:
        return [ChainDelta(ChainProblem.UNEXPECTED, name)]
    return []


def may_matter(rule: Rule, *, strict: bool, prefix: str = OWNED_PREFIX) -> bool:
    """False for a rule `diff_tables` would not look at: outside the owned chains, in
    non-strict mode, only rules naming an owned chain are compared, and the rules of the
    chains that hold the jumps are judged (rule 4) (a streaming reader of a large table
    keeps only these)."""
    if strict or rule.chain.startswith(prefix) or rule.chain in JUMP_CHAINS:
        return True
    return prefix in " ".join(rule.spec) and any(t.startswith(prefix) for t in rule.spec)


def _scoped(rules: Iterable[Rule], owned: bool, prefix: str) -> list[tuple[CanonicalRule, Rule]]:
    if owned:
        return [(canonical(r.spec), r) for r in rules]
    # Only a rule naming an owned chain can jump to one: skip canonicalising the rest.
    named = [r for r in rules if any(t.startswith(prefix) for t in r.spec)]
    keyed = [(canonical(r.spec), r) for r in named]
    return [(k, r) for k, r in keyed if k.verdict and k.target.startswith(prefix)]


def _diff_chain(
    chain: str,
    expected: list[tuple[CanonicalRule, Rule]],
    actual: list[tuple[CanonicalRule, Rule]],
) -> tuple[list[RuleDelta], ChainHunk | None]:
    exp_keys = [k for k, _ in expected]
    act_keys = [k for k, _ in actual]
    if exp_keys == act_keys:
        return [], None
    matcher = difflib.SequenceMatcher(None, exp_keys, act_keys, autojunk=False)
    removed: list[int] = []
    added: list[int] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            removed += range(i1, i2)
        if tag in ("insert", "replace"):
            added += range(j1, j2)
    moved = _moves(removed, added, exp_keys, act_keys)
    deltas = _deltas(chain, expected, actual, removed=removed, added=added, moved=moved)
    return deltas, _hunk(chain, matcher, expected, actual, moved)


def _moves(
    removed: list[int],
    added: list[int],
    exp_keys: list[CanonicalRule],
    act_keys: list[CanonicalRule],
) -> dict[int, int]:
    """Pair removed expected rules with added identical actual rules: those only moved."""
    pool: dict[CanonicalRule, list[int]] = {}
    for j in added:
        pool.setdefault(act_keys[j], []).append(j)
    moved: dict[int, int] = {}
    for i in removed:
        candidates = pool.get(exp_keys[i])
        if candidates:
            moved[i] = candidates.pop(0)
    return moved


def _deltas(
    chain: str,
    expected: list[tuple[CanonicalRule, Rule]],
    actual: list[tuple[CanonicalRule, Rule]],
    *,
    removed: list[int],
    added: list[int],
    moved: dict[int, int],
) -> list[RuleDelta]:
    out: list[RuleDelta] = []
    moved_to = set(moved.values())
    exp_count = Counter(k for k, _ in expected)
    for i in removed:
        rule = expected[i][1]
        if i in moved:
            out.append(RuleDelta(RuleProblem.OUT_OF_ORDER, chain, rule, i + 1, moved[i] + 1))
        else:
            out.append(RuleDelta(RuleProblem.MISSING, chain, rule, i + 1, None))
    for j in added:
        if j not in moved_to:
            key, rule = actual[j]
            dup = exp_count[key] > 0
            out.append(RuleDelta(RuleProblem.UNEXPECTED, chain, rule, None, j + 1, dup))
    return out


def _hunk(
    chain: str,
    matcher: difflib.SequenceMatcher[CanonicalRule],
    expected: list[tuple[CanonicalRule, Rule]],
    actual: list[tuple[CanonicalRule, Rule]],
    moved: dict[int, int],
) -> ChainHunk:
    moved_to = {j: i for i, j in moved.items()}
    wanted = {key for key, _ in expected}
    lines: list[DiffLine] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            lines += [DiffLine(" ", expected[i][1]) for i in range(i1, i2)]
            continue
        for i in range(i1, i2):
            note = f"moved: actual #{moved[i] + 1}" if i in moved else "missing"
            lines.append(DiffLine("-", expected[i][1], note))
        for j in range(j1, j2):
            note = "unexpected duplicate" if actual[j][0] in wanted else "unexpected"
            if j in moved_to:
                note = f"moved: expected #{moved_to[j] + 1}"
            lines.append(DiffLine("+", actual[j][1], note))
    return ChainHunk(chain, tuple(lines))


# --- rule 4: is the jump reached? ----------------------------------------------------------

JUMP_CHAINS = ("PREROUTING", "OUTPUT")  # of the nat table: where the jumps into ours are
# Targets after which the packet goes on to the next rule. A verdict, a NAT target or a goto
# may end the walk; a jump into another chain may when that chain's rules may (an ACCEPT,
# a DNAT), judged through the chains the table holds.
CONTINUING_TARGETS = frozenset({"", "LOG", "NFLOG", "MARK", "CONNMARK", "AUDIT", "TRACE"})
_TCP, _ANY = 6, 0
MAX_DEPTH = 100  # chains within chains judged; deeper is judged as ending (bounded stack)


def bypasses(
    table: Table, prefix: str = OWNED_PREFIX, *, chains_known: bool = True
) -> dict[str, list[RuleDelta]]:
    """Per nat chain of JUMP_CHAINS, the rules ahead of its first jump into an owned chain
    that can end a TCP packet's walk (`-I OUTPUT 1 -j ACCEPT` disables the redirect). A
    chain without such a jump has none: the missing jump is the diff's own finding.
    `chains_known=False` (a streamed read that kept no other chain's rules): a jump into
    another chain is judged as if that chain could end the walk."""
    if table.name != "nat":
        return {}
    rules = _by_chain(table)
    ends = _ChainEnds(table, chains_known)
    out: dict[str, list[RuleDelta]] = {}
    for chain in JUMP_CHAINS:
        found: list[RuleDelta] = []
        for position, rule in enumerate(rules.get(chain, []), 1):
            key = canonical(rule.spec)
            if key.target.startswith(prefix):
                if found:
                    out[chain] = found
                break
            if _may_match_tcp(key, chain) and ends.target_may_end(key, top=True):
                found.append(RuleDelta(RuleProblem.BYPASS, chain, rule, None, position))
    return out


class _ChainEnds:
    """Whether a rule's target may end the walk; a chain's answer is memoised, and a loop
    adds nothing (the kernel refuses loops)."""

    def __init__(self, table: Table, known: bool) -> None:
        self.rules = _by_chain(table)
        self.chains = set(_declared(table))
        self.known = known
        self.memo: dict[str, bool] = {}

    def target_may_end(self, key: CanonicalRule, *, top: bool, depth: int = 0) -> bool:
        if not key.verdict or (key.verdict == "-j" and key.target in CONTINUING_TARGETS):
            return False
        if key.verdict == "-j" and key.target == "RETURN":
            return top  # in PREROUTING/OUTPUT it ends the walk; in another chain it returns
        if key.target in VERDICT_TARGETS or (key.verdict == "-g" and top):
            return True  # after a goto's chain, the built-in chain's policy ends the walk
        if key.target not in self.chains or not self.known or depth > MAX_DEPTH:
            return True  # another extension target, a chain whose rules are not here, or
            # nesting deeper than judged (a hostile save; the kernel allows far less)
        if key.target not in self.memo:
            self.memo[key.target] = False
            self.memo[key.target] = any(
                self.target_may_end(canonical(r.spec), top=False, depth=depth + 1)
                for r in self.rules.get(key.target, [])
            )
        return self.memo[key.target]


VERDICT_TARGETS = frozenset({"ACCEPT", "DROP", "QUEUE", "NFQUEUE", "REJECT", "DNAT", "REDIRECT"})


def untracked(raw: Table) -> dict[str, list[RuleDelta]]:
    """Per chain of the raw table's PREROUTING and OUTPUT, the rules that can make a TCP
    packet untracked: `-j NOTRACK`, `-j CT --notrack`, or a jump or goto into a chain whose
    rules (as the table holds them) can. An untracked packet is not seen by the nat table,
    so the jump into PROXY_INIT_* is never reached whatever nat holds. A chain whose rules
    are not in `raw` is judged as not untracking (a node's own raw chains, Calico's, are
    common and rarely untrack a pod's TCP): only untracking that can be seen is reported."""
    if raw.name != "raw":
        return {}
    rules = _by_chain(raw)
    memo: dict[str, bool] = {}

    def untracks(key: CanonicalRule, depth: int) -> bool:
        if not key.verdict:
            return False
        if key.target == "NOTRACK" or (
            key.target == "CT" and any(o.name == "--notrack" for o in key.target_options)
        ):
            return True
        if key.target not in rules:
            return False
        if depth > MAX_DEPTH:
            return True  # bounded stack: deeper than judged counts as untracking
        if key.target not in memo:
            memo[key.target] = False  # a loop adds nothing (the kernel refuses loops)
            memo[key.target] = any(
                untracks(canonical(r.spec), depth + 1) for r in rules[key.target]
            )
        return memo[key.target]

    out: dict[str, list[RuleDelta]] = {}
    for chain in JUMP_CHAINS:
        found = [
            RuleDelta(RuleProblem.BYPASS, chain, rule, None, position)
            for position, rule in enumerate(rules.get(chain, []), 1)
            if _may_match_tcp(key := canonical(rule.spec), chain) and untracks(key, 0)
        ]
        if found:
            out[chain] = found
    return out


def may_matter_raw(rule: Rule) -> bool:
    """What `untracked` may look at, for a streaming reader of a large raw table: the rules
    of PREROUTING and OUTPUT, and elsewhere those naming NOTRACK or CT or jumping into a
    chain whose name is not all capitals (iptables' own targets are)."""
    if rule.chain in JUMP_CHAINS:
        return True
    spec = rule.spec
    for i, token in enumerate(spec[:-1]):
        if token in ("-j", "--jump", "-g", "--goto"):
            target = spec[i + 1]
            return target in ("NOTRACK", "CT") or not target.isupper()
    return False


def _may_match_tcp(key: CanonicalRule, chain: str) -> bool:
    """Whether the rule can match a TCP packet the redirect is for."""
    for opt in key.base:
        if opt.name == "-p":
            number = protocol_number(opt.values[0])
            if number is not None and (number in (_TCP, _ANY)) == opt.negated:
                return False  # `-p udp`, `! -p tcp`: never a TCP packet
        if chain == "OUTPUT" and opt.name == "-o" and opt.values == ("lo",) and not opt.negated:
            return False  # PROXY_INIT_OUTPUT returns loopback traffic unredirected anyway
    return True
