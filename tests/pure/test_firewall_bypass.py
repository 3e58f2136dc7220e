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

from multicall.core.firewall.diff import RuleProblem, bypasses, diff_tables
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
