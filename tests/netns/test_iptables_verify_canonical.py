"""The canonical form against the kernel: rules written in many spellings and orders are loaded
by the real `iptables-*-restore` and dumped by `iptables-*-save`. Each written rule must equal
its save line; rules the kernel holds identically must be equal; rules found equal may differ
only in the order of their matches (which the kernel keeps, but which means nothing for
stateless matches)."""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multicall.core.firewall.canonical import canonical
from multicall.core.firewall.diff import diff_tables
from multicall.core.firewall.iptables_save import parse_save
from multicall.core.firewall.report import format_diff
from tests.support import FIXTURES, require_tool
from tests.support.rig import Netns, Rig
from tests.support.rulesets import last_table
from tests.support.scenarios import payload

pytestmark = pytest.mark.netns

CHAIN = "PROXY_INIT_T"
# Spellings of the same thing, and different things, that iptables accepts in nat OUTPUT.
CORPUS = [
    "-p tcp --dport 80 -j RETURN",
    "-p tcp -m tcp --dport 80 -j RETURN",
    "--protocol tcp --destination-port 80 --jump RETURN",
    "-p 6 --dport 80 -j RETURN",
    "-p tcp ! --dport 80 -j RETURN",
    "-p tcp --sport 1:2 -j RETURN",
    "-p tcp --match multiport --dports 4191,4190 -j RETURN",
    "-p tcp -m multiport --destination-ports 4191,4190 -j RETURN",
    "-p tcp -m multiport --dports 4190,4191 -j RETURN",
    "-p tcp -j REDIRECT --to-port 4140",
    "-p tcp -j REDIRECT --to-ports 4140",
    "-p tcp -j REDIRECT --to-ports 4143",
    "-j RETURN -m comment --comment proxy-init/x",
    '-m comment --comment "proxy-init/x" -j RETURN',
    '-m comment --comment "proxy-init/y z" -j RETURN',
    "-o lo ! -d 127.0.0.1 -j RETURN",
    "! -d 127.0.0.1/32 -o lo -j RETURN",
    "-o lo -d 127.0.0.1 -j RETURN",
    "-s 10.1.2.3/8 -j RETURN",
    "-s 10.0.0.0/255.0.0.0 -j RETURN",
    "-s 10.0.0.0/16 -j RETURN",
    "-p all -s 10.0.0.0/8 -j RETURN",
    "-m owner --uid-owner 2102 -j RETURN",
    "-m owner ! --uid-owner 2102 -j RETURN",
    "-m owner --gid-owner 2102 -j RETURN",
    "-m owner --uid-owner 2102 -m comment --comment c -j RETURN",
    "-m comment --comment c -m owner --uid-owner 2102 -j RETURN",
    "-m conntrack --ctstate NEW,ESTABLISHED -j RETURN",
    "-m conntrack --ctstate ESTABLISHED,NEW -j RETURN",
    "-p tcp --syn -j RETURN",
    "-p tcp --tcp-flags FIN,SYN,RST,ACK SYN -j RETURN",
    "-p tcp --tcp-flags ACK,RST,SYN,FIN SYN -j RETURN",
    "-p tcp --tcp-flags ALL NONE -j RETURN",
    "-p tcp --tcp-flags ALL FIN,URG,PSH -j RETURN",
    "-m limit --limit 1/sec -m comment --comment c -j RETURN",
    "-m comment --comment c -m limit --limit 1/sec -j RETURN",
    "-m limit --limit 1/s -m comment --comment c -j RETURN",
    "-m limit --limit 60/m --limit-burst 5 -m comment --comment c -j RETURN",
    "-m limit --limit 7/hour --limit-burst 9 -j RETURN",
    "-m limit --limit 2/d -j RETURN",
    "-m limit --limit 48/day -j RETURN",
    "-m limit --limit 1000/second -j RETURN",
    "-m limit -j RETURN",
    "-m limit --limit 3/h -j RETURN",
    "-m limit --limit 1/s -m limit --limit 2/s -j RETURN",
    "-m limit --limit 2/s -m limit --limit 1/s -j RETURN",
    "-j RETURN",
    "-j ACCEPT",
]


def load_and_save(ns: Netns, flavour: str, specs: Sequence[str]) -> list[tuple[str, ...]]:
    """Restore `specs` into a fresh chain hooked from OUTPUT; the save lines, in order."""
    lines = ["*nat", f":{CHAIN} - [0:0]", f"-A OUTPUT -j {CHAIN}"]
    lines += [f"-A {CHAIN} {spec}" for spec in specs]
    ns.exec([require_tool(f"iptables-{flavour}-restore")], input_="\n".join([*lines, "COMMIT", ""]))
    saved = ns.exec([require_tool(f"iptables-{flavour}-save"), "-t", "nat"])
    table = last_table(parse_save(saved), "nat")
    assert table is not None
    rules = table.rules_of(CHAIN)
    assert len(rules) == len(specs)
    return [r.spec for r in rules]


def assert_agrees(specs: Sequence[str], saved: Sequence[tuple[str, ...]]) -> None:
    keys = [canonical(shlex.split(s)) for s in specs]
    rows = list(zip(specs, keys, saved, strict=True))
    for spec, key, line in rows:
        assert key == canonical(line), (spec, line)
    for (a, ka, la), (b, kb, lb) in itertools.combinations(rows, 2):
        if la == lb:  # the kernel holds the same rule
            assert ka == kb, (a, b, la)
        if ka == kb:  # at most the order of (stateless) matches differs
            assert sorted(la) == sorted(lb), (a, b, la, lb)


@pytest.mark.parametrize("flavour", ["nft", "legacy"])
def test_corpus_agrees_with_iptables(rig: Rig, flavour: str) -> None:
    """Each spelling equals its save line; equal save lines mean equal canonical forms."""
    ns = rig.netns()
    assert_agrees(CORPUS, load_and_save(ns, flavour, CORPUS))


_ATOMS = [
    "--dport 80",
    "! --sport 53",
    "-m multiport --dports 1,2",
    "-m owner --uid-owner 7",
    "-m owner ! --gid-owner 8",
    '-m comment --comment "a b"',
    "-m conntrack --ctstate NEW",
    "-o lo",
    "! -d 127.0.0.1",
    "-s 10.1.2.3/255.255.0.0",
    "-m limit --limit 5/s",
    "-m mark --mark 0x1",
]
_TARGETS = ["-j RETURN", "-j REDIRECT --to-port 4143", "-j ACCEPT", ""]


@st.composite
def written(draw: st.DrawFn) -> str:
    atoms = draw(st.lists(st.sampled_from(_ATOMS), max_size=4, unique=True))
    atoms = draw(st.permutations([*atoms, draw(st.sampled_from(_TARGETS))]))
    # Once multiport is loaded, getopt reads `--dport`/`--sport` as its `--dports`/`--sports`
    # (and iptables refuses the rule), so implicit tcp options come first, as users write them.
    if "-m multiport --dports 1,2" in atoms:
        atoms.sort(key=lambda atom: not atom.lstrip("! ").startswith("--"))
    return " ".join(["-p", draw(st.sampled_from(["tcp", "TCP", "6"])), *atoms]).strip()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.lists(written(), min_size=2, max_size=6))
def test_generated_rules_agree_with_iptables(rig: Rig, specs: list[str]) -> None:
    """Generated rules (random match order and spellings) agree with iptables-nft-save."""
    ns = rig.netns()
    try:
        assert_agrees(specs, load_and_save(ns, "nft", specs))
    finally:
        rig.remove(ns)


ISTIO = sorted((FIXTURES / "upstream/istio/istio-iptables-golden").glob("*golden"))


@pytest.mark.parametrize("flavour", ["nft", "legacy"])
@pytest.mark.parametrize("golden", ISTIO, ids=lambda p: p.name)
def test_istio_restore_payload_equals_its_save(rig: Rig, golden: Path, flavour: str) -> None:
    """Istio's restore payloads (written their way: `-p tcp --dport`, `! -d` after `-o`, no
    /32, interleaved chains) compare equal to what iptables-save prints after restoring them,
    with the ISTIO_ prefix as the owned one and in strict mode."""
    ns = rig.netns()
    text = payload(golden)
    ns.exec([require_tool(f"iptables-{flavour}-restore")], input_=text)
    saved = ns.exec([require_tool(f"iptables-{flavour}-save"), "-t", "nat"])
    written_nat = last_table(parse_save(text), "nat")
    saved_nat = last_table(parse_save(saved), "nat")
    assert written_nat is not None
    assert saved_nat is not None
    for strict in (False, True):
        diff = diff_tables(written_nat, saved_nat, strict=strict, prefix="ISTIO_")
        assert diff.ok, format_diff(diff)
    assert diff.compared_rules == len(written_nat.rules)
