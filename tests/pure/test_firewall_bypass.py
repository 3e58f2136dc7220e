"""A rule ahead of the jump into PROXY_INIT_* that ends the walk is drift (issue 29 class 5).

The judgement is core/firewall/diff.py's `bypasses`; CHECK (through the seam) and
iptables-verify (reading a save) use it.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicall.core.firewall.diff import RuleProblem, bypasses, diff_tables, untracked
from multicall.core.firewall.iptables_save import parse_save
from multicall.core.firewall.model import Family
from multicall.core.firewall.ruleset import Chain, Rule, Table
from tests.pure.test_iptables_verify import LINKERD, run_inproc, write_json
from tests.pure.test_plugin_seam import NETNS, Node, fixture_table
from tests.support.fuzzing import fuzz
from tests.support.rulesets import last_table
from tests.support.scenarios import netconf


def inserted(
    table: Table, chain: str, spec: tuple[str, ...], *, chains: tuple[str, ...] = ()
) -> Table:
    """`iptables -t nat -I CHAIN 1 SPEC` (and `-N` for each of `chains`)."""
    first = next(i for i, r in enumerate(table.rules) if r.chain == chain)
    rules = (*table.rules[:first], Rule(chain, spec), *table.rules[first:])
    declared = (*table.chains, *(Chain(name, None) for name in chains))
    return replace(table, chains=declared, rules=rules)


BYPASSES = [
    ("OUTPUT", ("-j", "ACCEPT")),
    ("PREROUTING", ("-p", "tcp", "-j", "RETURN")),
    ("OUTPUT", ("-d", "10.0.0.0/8", "-j", "DROP")),
    ("OUTPUT", ("-p", "tcp", "-j", "REJECT")),
    ("OUTPUT", ("-p", "tcp", "-j", "DNAT", "--to-destination", "10.0.0.1")),
    ("PREROUTING", ("!", "-p", "udp", "-j", "ACCEPT")),
    ("OUTPUT", ("-g", "KUBE-X")),
]
HARMLESS = [
    ("OUTPUT", ("-p", "udp", "-j", "ACCEPT")),
    ("PREROUTING", ("!", "-p", "tcp", "-j", "RETURN")),
    ("OUTPUT", ("-o", "lo", "-j", "ACCEPT")),
    ("OUTPUT", ("-j", "LOG")),
    ("OUTPUT", ("-j", "KUBE-X")),  # an empty chain
    ("PREROUTING", ("-p", "tcp", "-j", "MARK", "--set-xmark", "0x1/0xffffffff")),
]


@pytest.mark.parametrize(("chain", "spec"), BYPASSES)
def test_check_fails_on_a_bypass(chain: str, spec: tuple[str, ...]) -> None:
    """CHECK after ADD passes; with the rule inserted ahead of the jump it fails, naming it."""
    node = Node()
    assert node.run("ADD").exit_code == 0
    assert node.run("CHECK").exit_code == 0
    key = (NETNS, Family.IPV4)
    node.firewall.tables[key] = inserted(node.firewall.tables[key], chain, spec, chains=("KUBE-X",))
    result = node.run("CHECK")
    assert result.exit_code == 1
    msg = json.loads(result.stdout)
    assert "bypass: ends the walk before the jump" in msg["details"], msg


@pytest.mark.parametrize(("chain", "spec"), HARMLESS)
def test_rules_that_cannot_stop_the_redirect(chain: str, spec: tuple[str, ...]) -> None:
    """UDP-only, loopback output, logging, an empty chain: the redirect still happens."""
    table = inserted(fixture_table("default-nft"), chain, spec, chains=("KUBE-X",))
    assert diff_tables(fixture_table("default-nft"), table).ok


def test_a_jump_into_a_chain_that_accepts() -> None:
    """A jump is judged through the chain it enters: an ACCEPT there ends the walk, a RETURN
    there does not; after the jump nothing matters."""
    base = fixture_table("default-nft")
    table = inserted(base, "OUTPUT", ("-j", "KUBE-X"), chains=("KUBE-X",))
    returns = replace(table, rules=(*table.rules, Rule("KUBE-X", ("-j", "RETURN"))))
    accepts = replace(table, rules=(*table.rules, Rule("KUBE-X", ("-p", "tcp", "-j", "ACCEPT"))))
    assert diff_tables(base, returns).ok
    (delta,) = diff_tables(base, accepts).bypasses
    assert (delta.chain, delta.actual_position, delta.problem) == ("OUTPUT", 1, RuleProblem.BYPASS)
    after = replace(base, rules=(*base.rules, Rule("OUTPUT", ("-j", "ACCEPT"))))
    assert diff_tables(base, after).ok


def test_deeply_nested_chains_are_bounded() -> None:
    """10,000 chains each jumping into the next: judged (as ending) without a deep stack."""
    base = fixture_table("default-nft")
    names = [f"C{i}" for i in range(10_000)]
    table = inserted(base, "OUTPUT", ("-j", names[0]), chains=tuple(names))
    chained = tuple(Rule(a, ("-j", b)) for a, b in itertools.pairwise(names))
    table = replace(table, rules=(*table.rules, *chained))
    assert len(diff_tables(base, table).bypasses) == 1


TARGETS = st.sampled_from(["ACCEPT", "RETURN", "DROP", "LOG", "REJECT", "KUBE-X", "MARK"])
PROTOCOLS = st.sampled_from([(), ("-p", "tcp"), ("-p", "udp"), ("!", "-p", "tcp"), ("-p", "6")])


@fuzz(200)
@given(st.sampled_from(["PREROUTING", "OUTPUT"]), PROTOCOLS, TARGETS)
def test_bypass_judgement(chain: str, proto: tuple[str, ...], target: str) -> None:
    """A reference judgement: a TCP-capable rule whose target ends the walk (not LOG, MARK,
    or the empty chain KUBE-X) is one bypass; anything else is none."""
    spec = (*proto, "-j", target)
    if target == "MARK":
        spec += ("--set-xmark", "0x1/0xffffffff")
    table = inserted(fixture_table("default-nft"), chain, spec, chains=("KUBE-X",))
    tcp = proto in ((), ("-p", "tcp"), ("-p", "6"))
    ends = target in ("ACCEPT", "RETURN", "DROP", "REJECT")
    assert len(bypasses(table).get(chain, [])) == int(tcp and ends)


def test_iptables_verify_reports_a_bypass(tmp_path: Path) -> None:
    """iptables-verify --input: exit 1, the bypass named; a streamed read judges a jump into
    another chain as possibly ending (it keeps no other chain's rules)."""
    text = (LINKERD / "default-nft.iptables-save.txt").read_text()
    config = write_json(tmp_path, "conf.json", netconf("default-nft"))
    assert run_inproc(["--config", config, "--input", "-"], text.encode())[0] == 0
    for inserted_rule in ("-A OUTPUT -j ACCEPT", "-A OUTPUT -j KUBE-X"):
        save = text.replace("-A OUTPUT ", f"{inserted_rule}\n-A OUTPUT ", 1)
        save = save.replace(":POSTROUTING", ":KUBE-X - [0:0]\n:POSTROUTING", 1)
        assert last_table(parse_save(save), "nat") is not None
        code, out, _ = run_inproc(["--config", config, "--input", "-"], save.encode())
        assert code == 1, out
        assert "bypass: ends the walk before the jump" in out
        assert f"+ {inserted_rule}" in out


RAW_HEAD = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"

# Each raw table with whether the judgement finds untracking of a pod's TCP.
RAW_CASES = [
    ("-A PREROUTING -j NOTRACK", True),
    ("-A PREROUTING -p tcp -j NOTRACK", True),
    ("-A OUTPUT -j CT --notrack", True),
    ("-A OUTPUT -p tcp -m tcp --dport 80 -j CT --notrack", True),
    ("-A PREROUTING -s 10.0.0.0/8 -j NOTRACK", True),  # may match the pod's traffic
    (":mine - [0:0]\n-A PREROUTING -j mine\n-A mine -j NOTRACK", True),
    (":mine - [0:0]\n-A OUTPUT -g mine\n-A mine -p tcp -j CT --notrack", True),
    (":a - [0:0]\n:b - [0:0]\n-A PREROUTING -j a\n-A a -j b\n-A b -j NOTRACK", True),
    ("-A PREROUTING -p udp -j NOTRACK", False),  # never a TCP packet
    ("-A PREROUTING ! -p tcp -j NOTRACK", False),
    ("-A OUTPUT -o lo -j NOTRACK", False),  # PROXY_INIT_OUTPUT returns loopback anyway
    ("-A PREROUTING -p tcp -j CT --zone 1", False),  # tracked, in another zone
    ("-A PREROUTING -p tcp -j ACCEPT", False),  # ends raw only: nat still runs
    ("-A PREROUTING -p tcp -j DROP", False),  # the packet is dropped, not let past the proxy
    ("-A PREROUTING -p tcp -j MARK --set-xmark 0x1/0xffffffff", False),
    (":mine - [0:0]\n-A PREROUTING -j mine\n-A mine -j RETURN", False),
    (":mine - [0:0]\n-A PREROUTING -p udp -j mine\n-A mine -j NOTRACK", False),
    (":mine - [0:0]\n-A mine -j NOTRACK", False),  # a chain nothing jumps to
    ("-A PREROUTING -j cali-PREROUTING", False),  # a chain whose rules are not here
    ("", False),
]


@pytest.mark.parametrize(("rules", "untracks"), RAW_CASES, ids=lambda v: str(v)[:40])
def test_raw_untracking_is_a_bypass(rules: str, untracks: bool) -> None:
    """Issue 29 class 5's other tables: a packet made untracked in raw (NOTRACK, CT
    --notrack) skips nat, so the redirect never happens whatever nat holds; mangle and
    filter cannot make it skip nat (their ACCEPT ends their own chain; a DROP drops)."""
    raw = last_table(parse_save(RAW_HEAD + (rules + "\n" if rules else "") + "COMMIT\n"), "raw")
    assert raw is not None
    found = untracked(raw)
    assert bool(found) is untracks, found
    nat = fixture_table("default-nft")
    diff = diff_tables(nat, nat, raw=raw)
    assert diff.ok is not untracks
    assert diff_tables(nat, nat).ok  # without the raw table, nothing is judged


def test_raw_chains_nested_deeper_than_judged_are_bounded() -> None:
    chains = [f"c{i}" for i in range(5000)]
    lines = [f":{c} - [0:0]" for c in chains] + ["-A PREROUTING -j c0"]
    lines += [f"-A {a} -j {b}" for a, b in itertools.pairwise(chains)] + ["-A c4999 -j ACCEPT"]
    raw = last_table(parse_save(RAW_HEAD + "\n".join(lines) + "\nCOMMIT\n"), "raw")
    assert raw is not None
    assert "PREROUTING" in untracked(raw)  # deeper than MAX_DEPTH counts as untracking


@pytest.mark.parametrize("strict", [False, True])
def test_iptables_verify_reads_the_raw_table_of_a_save(tmp_path: Path, strict: bool) -> None:
    """iptables-verify --input: the save's raw table is judged with its nat table (streamed:
    only the raw rules `may_matter_raw` keeps)."""
    text = (LINKERD / "default-nft.iptables-save.txt").read_text()
    config = write_json(tmp_path, "conf.json", netconf("default-nft"))
    args = ["--config", config, "--input", "-", *(["--strict"] if strict else [])]
    clean = RAW_HEAD + ":mine - [0:0]\n-A PREROUTING -p udp -j NOTRACK\nCOMMIT\n"
    expected_clean = 0 if not strict else run_inproc(args, text.encode())[0]
    assert run_inproc(args, (clean + text).encode())[0] == expected_clean
    bad = RAW_HEAD + ":mine - [0:0]\n-A OUTPUT -j mine\n-A mine -j CT --notrack\nCOMMIT\n"
    for save in (bad + text, text + bad):  # before or after nat in the file
        code, out, _ = run_inproc(args, save.encode())
        assert code == 1, out
        assert "untracked in the raw table" in out
        assert "+ -A OUTPUT -j mine" in out


@pytest.mark.parametrize(("rules", "untracks"), RAW_CASES[:3] + RAW_CASES[8:14])
def test_check_judges_the_raw_table(rules: str, untracks: bool) -> None:
    """CHECK reads the pod's raw table through the Firewall port (`dump_raw`) and fails
    when it untracks the pod's TCP (the live backends: tests/netns/test_raw_bypass.py)."""
    node = Node()
    assert node.run("ADD").exit_code == 0
    raw = last_table(parse_save(RAW_HEAD + rules + "\nCOMMIT\n"), "raw")
    assert raw is not None
    node.firewall.raw[(NETNS, Family.IPV4)] = raw
    result = node.run("CHECK")
    assert result.exit_code == (1 if untracks else 0), result.stdout
    if untracks:
        assert "untracked in the raw table" in json.loads(result.stdout)["details"]
