"""Canonical form and table comparison: what the kernel rewrites compares equal, what changes
meaning never does, and each kind of difference is reported by name."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicall.core.firewall.canonical import canonical
from multicall.core.firewall.diff import ChainProblem, RuleProblem, diff_tables
from multicall.core.firewall.iptables_save import parse_save
from multicall.core.firewall.report import diff_to_json, format_diff
from multicall.core.firewall.ruleset import Chain, Rule, Table, render_rule
from tests.support import FIXTURES
from tests.support.rulesets import last_table

CANON = FIXTURES / "derived/iptables-canonicalization"
LINKERD = FIXTURES / "derived/linkerd-iptables"


def nat(path: Path) -> Table:
    table = last_table(parse_save(path.read_text(), source=path.name), "nat")
    assert table is not None
    return table


def same(a: str, b: str) -> bool:
    return canonical(shlex.split(a)) == canonical(shlex.split(b))


class TestCanonicalForm:
    @pytest.mark.parametrize(
        ("written", "saved"),
        [
            ("--protocol tcp --destination-port 80", "-p tcp -m tcp --dport 80"),
            ("-p TCP --dport 80", "-p tcp -m tcp --dport 80"),
            ("-p 6 --source-port 53", "-p tcp -m tcp --sport 53"),
            ("-p udp --dport 53", "-p udp -m udp --dport 53"),
            ("-p all -s 10.0.0.0/8 -j RETURN", "-s 10.0.0.0/8 -j RETURN"),
            ("--source 10.1.2.3/255.0.0.0", "-s 10.0.0.0/8"),
            ("--src 10.0.0.1", "-s 10.0.0.1/32"),
            ("-d 2001:DB8:0:0::1", "-d 2001:db8::1/128"),
            ("-o lo ! -d 127.0.0.1", "! -d 127.0.0.1/32 -o lo"),
            ("-d ! 127.0.0.1 --out-interface lo", "! -d 127.0.0.1/32 -o lo"),
            ("-j REDIRECT --to-port 4143", "-j REDIRECT --to-ports 4143"),
            (
                "-p tcp --match multiport --dports 1,2 -j RETURN",
                "-p tcp -m multiport --dports 1,2 -j RETURN",
            ),
            (
                "-p tcp -m multiport --destination-ports 1 -j RETURN",
                "-p tcp -m multiport --dports 1 -j RETURN",
            ),
            ("-j RETURN -m comment --comment x", "-m comment --comment x -j RETURN"),
            ("--jump RETURN -m owner --uid-owner 7", "-m owner --uid-owner 7 -j RETURN"),
            (
                "-m comment --comment c -m owner --uid-owner 7",
                "-m owner --uid-owner 7 -m comment --comment c",
            ),
            ("-p tcp --syn", "-p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN"),
            ("-p tcp --tcp-flags ack,syn SYN", "-p tcp -m tcp --tcp-flags SYN,ACK SYN"),
            (
                "-p tcp --tcp-flags ALL NONE",
                "-p tcp -m tcp --tcp-flags FIN,SYN,RST,PSH,ACK,URG NONE",
            ),
            ("-p tcp --dport ! 22", "-p tcp -m tcp ! --dport 22"),
            (
                "-m conntrack --ctstate RELATED,ESTABLISHED",
                "-m conntrack --ctstate ESTABLISHED,RELATED",
            ),
            (
                "-m multiport --dports 1 -m comment --comment x --dports 1",
                "-m multiport --dports 1 --dports 1 -m comment --comment x",
            ),
            ("-p tcp -j RETURN -c 3 4", "-p tcp -j RETURN"),
            ("-p tcp -m multiport --dport 1,2", "-p tcp -m multiport --dports 1,2"),
            ("-p tcp -j REDIRECT --to-p 5", "-p tcp -j REDIRECT --to-ports 5"),
            ("-m owner --uid 5", "-m owner --uid-owner 5"),
            ("-m limit --limit 60/m --limit-burst 5", "-m limit --limit 1/sec"),
            ("-m limit", "-m limit --limit 3/hour"),
            ("-m limit --limit 2/d", "-m limit --limit 2/day"),
        ],
    )
    def test_equal(self, written: str, saved: str) -> None:
        """How a rule was written and how iptables-save prints it compare equal."""
        assert same(written, saved)

    @pytest.mark.parametrize(
        ("a", "b"),
        [
            ("-p tcp --dport 80", "-p tcp --dport 81"),
            ("! -d 127.0.0.1", "-d 127.0.0.1"),
            ("-p tcp ! --dport 22", "-p tcp --dport 22"),
            ("-p tcp --dport 80", "-p udp --dport 80"),
            ("-s 10.0.0.0/8", "-s 10.0.0.0/16"),
            ("-d ::1", "-d ::1/64"),
            ("-j RETURN", "-g RETURN"),
            ("-j REDIRECT --to-ports 4143", "-j REDIRECT --to-ports 4140"),
            ("-j RETURN", ""),
            ("-m comment --comment a -j RETURN", "-m comment --comment b -j RETURN"),
            ("-p tcp -m tcp --dport 80", "-p tcp -m multiport --dports 80"),
            ("-m foo --a 1 -m bar --b 2", "-m foo --b 2 -m bar --a 1"),
            (
                "-m limit --limit 1/s -p tcp -m tcp --dport 22",
                "-p tcp -m tcp --dport 22 -m limit --limit 1/s",
            ),
            ("-m recent --set -m comment --comment x", "-m comment --comment x -m recent --set"),
            ("-p tcp -m tcp", "-p tcp"),
            ("-m limit --limit 1/s", "-m limit --limit 1/s --limit-burst 6"),
            (
                "-m limit --limit 1/s -m limit --limit 2/s",
                "-m limit --limit 2/s -m limit --limit 1/s",
            ),
            ("! -p tcp", "-p tcp"),
            ("-i eth0", "-o eth0"),
            ("-s 10.0.0.1", "-d 10.0.0.1"),
        ],
    )
    def test_different(self, a: str, b: str) -> None:
        """Rules that mean different things never compare equal."""
        assert not same(a, b)

    def test_canonical_spec_reads_like_save_output(self) -> None:
        """The canonical form renders as an iptables-save-like spec (for reports)."""
        key = canonical(shlex.split("-p tcp --destination-port 8080 -j REDIRECT --to-port 4143"))
        assert key.spec == (
            "-p",
            "tcp",
            "-m",
            "tcp",
            "--dport",
            "8080",
            "-j",
            "REDIRECT",
            "--to-ports",
            "4143",
        )

    def test_restore_input_equals_its_save(self) -> None:
        """Every rule of input.restore.txt equals its counterpart after one restore."""
        written = nat(CANON / "input.restore.txt")
        for flavour in ("nft", "legacy"):
            saved = nat(CANON / f"save-after-one-restore.{flavour}.txt")
            for chain in ("PREROUTING", "OUTPUT", "PROXY_INIT_OUTPUT", "PROXY_INIT_REDIRECT"):
                a = [canonical(r.spec) for r in written.rules_of(chain)]
                b = [canonical(r.spec) for r in saved.rules_of(chain)]
                assert a == b, chain

    @pytest.mark.parametrize("path", sorted(LINKERD.glob("*.iptables-save.txt")), ids=str)
    def test_linkerd_argv_equals_save(self, path: Path) -> None:
        """The exact argv upstream runs and the kernel's save text agree rule by rule."""
        name = path.name.removesuffix(".iptables-save.txt")
        appended: dict[str, list[tuple[str, ...]]] = {}
        for line in (LINKERD / f"{name}.argv.jsonl").read_text().splitlines():
            argv = json.loads(line)
            if "-A" in argv:
                at = argv.index("-A")
                spec = tuple(a for a in argv[at + 2 :] if a != "-w")
                if spec not in appended.setdefault(argv[at + 1], []):
                    appended[argv[at + 1]].append(spec)  # re-runs flush and re-add
        table = nat(path)
        for chain, specs in appended.items():
            assert [canonical(s) for s in specs] == [
                canonical(r.spec) for r in table.rules_of(chain)
            ], chain


# ------------------------------------------------------------------------------ comparison

KUBE_LINES = {
    ":POSTROUTING": [":KUBE-SERVICES - [0:0]"],
    "-A PREROUTING": ['-A PREROUTING -m comment --comment "k8s portals" -j KUBE-SERVICES'],
    "-A OUTPUT": ['-A OUTPUT -m comment --comment "k8s portals" -j KUBE-SERVICES'],
    "-A PROXY_INIT_OUTPUT -m owner": ["-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j RETURN"],
}


def with_kube_proxy(text: str) -> str:
    """A dump with kube-proxy's chain and jumps placed before each matching line."""
    out = []
    for line in text.splitlines():
        for start, extra in KUBE_LINES.items():
            if line.startswith(start):
                out += extra if start.startswith("-A") else []
                out.append(line)
                out += extra if not start.startswith("-A") else []
                break
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def kube_table() -> Table:
    text = (LINKERD / "default-nft.iptables-save.txt").read_text()
    table = last_table(parse_save(with_kube_proxy(text)), "nat")
    assert table is not None
    return table


def default_nft() -> Table:
    return nat(LINKERD / "default-nft.iptables-save.txt")


class TestDiffTables:
    def test_identical_tables_match(self) -> None:
        """A table compared with itself matches in both modes."""
        table = default_nft()
        assert diff_tables(table, table).ok
        assert diff_tables(table, table, strict=True).ok
        assert diff_tables(table, table).compared_rules == 7

    def test_other_chains_are_ignored_by_default(self) -> None:
        """kube-proxy's chain and its jumps do not matter unless --strict."""
        diff = diff_tables(default_nft(), kube_table())
        assert diff.ok, format_diff(diff)
        strict = diff_tables(default_nft(), kube_table(), strict=True)
        assert not strict.ok
        assert [c.chain for c in strict.chains] == ["KUBE-SERVICES"]
        assert strict.chains[0].problem is ChainProblem.UNEXPECTED
        assert {d.chain for d in strict.unexpected} == {"PREROUTING", "OUTPUT", "KUBE-SERVICES"}

    def test_restore_input_vs_one_and_two_restores(self) -> None:
        """input.restore.txt equals the save after one restore, not after two (dup jumps)."""
        written = nat(CANON / "input.restore.txt")
        for flavour in ("nft", "legacy"):
            once = nat(CANON / f"save-after-one-restore.{flavour}.txt")
            twice = nat(CANON / f"save-after-two-restores.{flavour}.txt")
            assert diff_tables(written, once).ok
            assert diff_tables(written, once, strict=True).ok
            diff = diff_tables(written, twice)
            assert not diff.ok
            assert [(d.chain, d.duplicate) for d in diff.unexpected] == [
                ("PREROUTING", True),
                ("OUTPUT", True),
            ]
            assert "unexpected duplicate" in format_diff(diff)

    def test_wrong_policy_only_in_strict(self) -> None:
        """A built-in chain's policy is checked in strict mode."""
        table = default_nft()
        chains = tuple(Chain(c.name, "DROP") if c.name == "OUTPUT" else c for c in table.chains)
        other = Table(table.name, chains, table.rules)
        assert diff_tables(table, other).ok
        diff = diff_tables(table, other, strict=True)
        assert [(c.problem, c.expected_policy, c.actual_policy) for c in diff.chains] == [
            (ChainProblem.POLICY, "ACCEPT", "DROP")
        ]
        assert "! policy of OUTPUT: expected ACCEPT, actual DROP" in format_diff(diff)

    def test_missing_owned_chain(self) -> None:
        """A PROXY_INIT chain that is not there is reported with all its rules."""
        table = default_nft()
        chains = tuple(c for c in table.chains if c.name != "PROXY_INIT_OUTPUT")
        rules = tuple(r for r in table.rules if r.chain != "PROXY_INIT_OUTPUT")
        diff = diff_tables(table, Table(table.name, chains, rules))
        assert [(c.problem, c.chain) for c in diff.chains] == [
            (ChainProblem.MISSING, "PROXY_INIT_OUTPUT")
        ]
        assert len(diff.missing) == 3

    def test_unexpected_owned_chain(self) -> None:
        """A PROXY_INIT_* chain nobody expects is reported even in the default mode."""
        table = default_nft()
        extra = Table(table.name, (*table.chains, Chain("PROXY_INIT_EXTRA")), table.rules)
        diff = diff_tables(table, extra)
        assert [(c.problem, c.chain) for c in diff.chains] == [
            (ChainProblem.UNEXPECTED, "PROXY_INIT_EXTRA")
        ]

    def test_undeclared_builtins_are_implicit(self) -> None:
        """A restore file that does not declare PREROUTING still has it."""
        written = parse_save("*nat\n:PROXY_INIT_X - [0:0]\n-A PREROUTING -j PROXY_INIT_X\nCOMMIT\n")
        saved = parse_save(
            "*nat\n:PREROUTING DROP [0:0]\n:PROXY_INIT_X - [0:0]\n"
            "-A PREROUTING -j PROXY_INIT_X\nCOMMIT\n"
        )
        assert diff_tables(written.tables[0], saved.tables[0], strict=True).ok


def _mutations(table: Table) -> list[tuple[str, Table, str, RuleProblem]]:
    """(label, mutated table, rule text the diff must name, problem) for each owned rule."""
    out = []
    rules = list(table.rules)
    owned = [i for i, r in enumerate(rules) if "PROXY_INIT_" in " ".join((r.chain, *r.spec))]
    for i in owned:
        rule = rules[i]
        text = render_rule(rule)
        out.append(("remove", [*rules[:i], *rules[i + 1 :]], text, RuleProblem.MISSING))
        out.append(
            ("duplicate", [*rules[: i + 1], rule, *rules[i + 1 :]], text, RuleProblem.UNEXPECTED)
        )
        altered = Rule(rule.chain, (*rule.spec[:-1], rule.spec[-1] + "9"))
        out.append(("alter", [*rules[:i], altered, *rules[i + 1 :]], text, RuleProblem.MISSING))
        nxt = i + 1
        if nxt < len(rules) and rules[nxt].chain == rule.chain:
            swapped = [*rules[:i], rules[nxt], rule, *rules[nxt + 1 :]]
            # Either of the two swapped rules may be the one reported as moved.
            both = f"{text}\n{render_rule(rules[nxt])}"
            out.append(("reorder", swapped, both, RuleProblem.OUT_OF_ORDER))
    return [(label, Table(table.name, table.chains, tuple(r)), t, p) for label, r, t, p in out]


class TestMutations:
    @pytest.mark.parametrize("path", sorted(LINKERD.glob("*.iptables-save.txt")), ids=str)
    def test_every_single_change_is_named(self, path: Path) -> None:
        """Removing, duplicating, altering or reordering any owned rule is a named mismatch."""
        table = nat(path)
        cases = _mutations(table)
        assert len(cases) >= 3 * 7
        for label, mutated, text, problem in cases:
            diff = diff_tables(table, mutated)
            assert not diff.ok, label
            named = {d.text for d in diff.rules if d.problem is problem}
            assert named & set(text.split("\n")), label
            report = format_diff(diff)
            assert all(t in report for t in text.split("\n")), label


# ------------------------------------------------------------------------------ reports


class TestReports:
    def test_format_diff_is_a_unified_diff(self) -> None:
        """Lines start with ' ', '-' or '+', notes say why, and a summary closes it."""
        table = default_nft()
        rules = [r for r in table.rules if "ignore-loopback" not in " ".join(r.spec)]
        report = format_diff(diff_tables(table, Table(table.name, table.chains, tuple(rules))))
        lines = report.splitlines()
        assert lines[0].startswith("--- expected nat")
        assert lines[1] == "+++ actual nat"
        assert "@@ nat PROXY_INIT_OUTPUT @@" in lines
        assert any(
            line.startswith("- -A PROXY_INIT_OUTPUT -o lo") and "# missing, line 12" in line
            for line in lines
        )
        assert (
            lines[-1]
            == "nat: MISMATCH: 1 missing, 0 unexpected, 0 out of order, 0 chain problem(s)"
        )

    def test_long_chains_show_context_only(self) -> None:
        """Unchanged rules far from a change are elided as `...` (3 lines of context)."""
        rules = tuple(
            Rule("PROXY_INIT_X", ("-s", f"10.0.0.{i}/32", "-j", "RETURN")) for i in range(20)
        )
        table = Table("nat", (Chain("PROXY_INIT_X"),), rules)
        changed = Table("nat", table.chains, rules[:10] + rules[11:])
        lines = format_diff(diff_tables(table, changed)).splitlines()
        body = lines[lines.index("@@ nat PROXY_INIT_X @@") + 1 : -1]
        assert body[0] == "  ..."
        assert body[-1] == "  ..."
        assert [line[:2] for line in body[1:-1]] == ["  "] * 3 + ["- "] + ["  "] * 3
        assert "10.0.0.10/32" in body[4]

    def test_json_document(self) -> None:
        """diff_to_json is JSON-serialisable and lists each delta with its positions."""
        table = default_nft()
        reordered = list(table.rules)
        reordered[2], reordered[3] = reordered[3], reordered[2]
        diff = diff_tables(table, Table(table.name, table.chains, tuple(reordered)))
        doc = json.loads(json.dumps(diff_to_json(diff)))
        assert doc["schema"] == "cnibox.iptables-verify.diff/v1"
        assert doc["match"] is False
        (delta,) = doc["rules"]
        assert delta["problem"] == "out-of-order"
        assert delta["chain"] == "PROXY_INIT_OUTPUT"
        assert {delta["expected_position"], delta["actual_position"]} == {1, 2}
        assert delta["rule"].startswith("-A PROXY_INIT_OUTPUT")


# ------------------------------------------------------------------------------ properties

_MATCHES = [
    ("-m", "owner", "--uid-owner", "7"),
    ("-m", "comment", "--comment", "x y"),
    ("-m", "mark", "--mark", "0x1"),
    ("-m", "addrtype", "--dst-type", "LOCAL"),
    ("-p", "tcp", "-m", "tcp", "--dport", "80"),
    ("-o", "lo"),
    ("!", "-d", "127.0.0.1/32"),
]


class TestProperties:
    @settings(max_examples=100, deadline=None)
    @given(st.permutations(_MATCHES), st.integers(1, len(_MATCHES)))
    def test_order_of_stateless_matches_is_irrelevant(
        self, parts: list[tuple[str, ...]], size: int
    ) -> None:
        """Any permutation of stateless matches gives the same canonical rule."""
        chosen = parts[:size]
        spec = [t for part in chosen for t in part] + ["-j", "RETURN"]
        reference = [t for part in _MATCHES if part in chosen for t in part] + ["-j", "RETURN"]
        assert canonical(spec) == canonical(reference)

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.sampled_from(_MATCHES), min_size=1, max_size=4))
    def test_a_table_always_matches_itself(self, parts: list[tuple[str, ...]]) -> None:
        """diff(t, t) is empty whatever the rules."""
        rules = tuple(Rule("PROXY_INIT_OUTPUT", (*p, "-j", "RETURN")) for p in parts)
        table = Table("nat", (Chain("PROXY_INIT_OUTPUT"),), rules)
        assert diff_tables(table, table).ok


_VOCAB = st.sampled_from(
    [
        *("!", "-p", "-s", "-d", "-i", "-o", "-f", "-m", "-j", "-g", "-c", "-4", "--match"),
        *("--protocol", "--source", "--dport", "--sport", "--to-port", "--comment", "--syn"),
        *("--ctstate", "--uid-owner", "--set", "--limit", "--dports", "--destination-port"),
        *("tcp", "udp", "all", "0", "6", "300", "comment", "multiport", "owner", "limit"),
        *("recent", "REDIRECT", "RETURN", "PROXY_INIT_X", "10.0.0.1", "::1", "1.2.3.4/33"),
        *("a,b", "-1", "", "x y", "--", "-", "255.0.0.0", "1:2", "NEW,ESTABLISHED"),
        *("9" * 5000, "10.0.0.0/" + "9" * 5000, "²", "0x1/0xffffffff"),
    ]
)


@st.composite
def grammar_specs(draw: st.DrawFn) -> tuple[str, ...]:
    """Specs as iptables would accept them: base options, matches with options, a target."""
    out: list[str] = []
    if draw(st.booleans()):
        out += ["-p", draw(st.sampled_from(["tcp", "udp", "6", "all", "TCP"]))]
    for flag, value in (("-s", "10.1.2.3/8"), ("-d", "::1"), ("-o", "lo"), ("-i", "eth+")):
        if draw(st.booleans()):
            out += [*(["!"] if draw(st.booleans()) else []), flag, value]
    for module, options in draw(st.lists(st.sampled_from(_MODULES), max_size=3)):
        out += ["-m", module]
        for option in options:
            out += [*(["!"] if draw(st.booleans()) else []), *option]
    if draw(st.booleans()):
        out += draw(st.sampled_from([["-j", "RETURN"], ["-j", "REDIRECT", "--to-port", "1"]]))
    return tuple(out)


_MODULES: list[tuple[str, list[tuple[str, ...]]]] = [
    ("owner", [("--uid-owner", "7")]),
    ("comment", [("--comment", "a b")]),
    ("multiport", [("--dports", "1,2")]),
    ("limit", [("--limit", "1/s"), ("--limit-burst", "3")]),
    ("recent", [("--set",), ("--name", "x")]),
    ("conntrack", [("--ctstate", "NEW,ESTABLISHED")]),
    ("tcp", [("--dport", "80"), ("--tcp-flags", "SYN,ACK", "SYN")]),
]


class TestCanonicalLaws:
    @settings(max_examples=300, deadline=None)
    @given(st.lists(_VOCAB, max_size=12))
    def test_never_raises(self, spec: list[str]) -> None:
        """Any token list has a canonical form, and diffing tables of such rules works."""
        key = canonical(spec)
        table = Table("nat", (Chain("PROXY_INIT_X"),), (Rule("PROXY_INIT_X", tuple(spec)),))
        assert diff_tables(table, table).ok
        assert isinstance(key.spec, tuple)

    @settings(max_examples=300, deadline=None)
    @given(grammar_specs())
    def test_canonical_form_is_a_fixed_point(self, spec: tuple[str, ...]) -> None:
        """Canonicalising the canonical form's spec changes nothing."""
        key = canonical(spec)
        assert canonical(key.spec) == key
