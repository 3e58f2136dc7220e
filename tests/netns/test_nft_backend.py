"""NftBackend in throwaway netns, with Debian's iptables-nft-save as the oracle.

Every test programs only namespaces made by the rig. The oracle is the real
`iptables-nft-save` / `ip6tables-nft-save`; the reverse direction uses the real
`iptables-nft-restore` as the writer and our dump as the reader.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from multicall.core.firewall.model import Family, FirewallBackend, ProxyInitOptions, TableChange
from multicall.core.firewall.nft import dump as nft_dump
from multicall.core.firewall.nft import expr as nft_expr
from multicall.core.firewall.nft import rule as nft_rule
from multicall.core.firewall.nft import rulespec as nft_spec
from multicall.core.firewall.proxy_init import (
    empty_table,
    expected_table,
    plan_change,
    strip_counters,
)
from multicall.core.firewall.ruleset import Rule, Table, render_table
from multicall.effects.firewall.nft import NftBackend, read_rules
from multicall.effects.ns import entered_netns
from multicall.errors import FirewallError
from tests.support import FIXTURES, REPO, require_root, require_tool
from tests.support.nft import family_of, read_chains, rule_specs, save_rules, typed
from tests.support.rig import Netns, Rig
from tests.support.scenarios import (
    OK_NAMES,
    fixture_body,
    scenario_family,
    scenario_options,
    times_applied,
)

pytestmark = pytest.mark.netns

SCENARIOS = FIXTURES / "derived" / "linkerd-iptables"
CANON = FIXTURES / "derived" / "iptables-canonicalization"
V4, V6 = Family.IPV4, Family.IPV6
SAVE = {V4: "iptables-nft-save", V6: "ip6tables-nft-save"}
RESTORE = {V4: "iptables-nft-restore", V6: "ip6tables-nft-restore"}
BACKEND = NftBackend()
AS_PROTOCOL: FirewallBackend = BACKEND  # mypy checks NftBackend against the seam


def oracle(ns: Netns, family: Family) -> list[str]:
    """The `*nat` block the real iptables-nft-save prints, without `#` lines."""
    text = ns.exec([require_tool(SAVE[family]), "-t", "nat"])
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def apply(ns: Netns, family: Family, change: TableChange) -> None:
    with entered_netns(ns.path, allow_own=False):
        BACKEND.apply(family, change)


def dump(ns: Netns, family: Family) -> Table:
    with entered_netns(ns.path, allow_own=False):
        return BACKEND.dump(family)


def run_scenario(ns: Netns, options: ProxyInitOptions, family: Family) -> None:
    """One upstream run: plan against the live dump, then apply it."""
    apply(ns, family, plan_change(dump(ns, family), options, family, backend="nft"))


def lines(table: Table) -> list[str]:
    return render_table(table).splitlines()


class TestScenarios:
    @pytest.mark.parametrize("name", OK_NAMES)
    def test_oracle_prints_the_fixture(self, rig: Rig, name: str) -> None:
        """Applied (as often as the scenario says), iptables-nft-save prints the fixture."""
        ns, family, options = rig.netns(), scenario_family(name), scenario_options(name)
        for _ in range(times_applied(name)):
            run_scenario(ns, options, family)
        assert oracle(ns, family) == fixture_body(name)
        expected = expected_table(options, family, backend="nft")
        assert strip_counters(dump(ns, family)) == strip_counters(expected)

    def test_a_then_b_replaces_the_chains(self, rig: Rig) -> None:
        """New options replace the chains' contents and keep one jump each."""
        ns = rig.netns()
        run_scenario(ns, scenario_options("default-nft"), V4)
        before = dump(ns, V4)
        options_b = scenario_options("control-plane-nft")
        run_scenario(ns, options_b, V4)
        after = expected_table(options_b, V4, before, backend="nft")
        assert oracle(ns, V4) == lines(after)
        assert oracle(ns, V4) == fixture_body("control-plane-nft")

    def test_flush_and_refill_twice(self, rig: Rig) -> None:
        """The same flush+append change applied twice leaves one copy of each rule."""
        ns = rig.netns()
        rules = tuple(save_rules(SCENARIOS / "full-legacy-wait.iptables-save.txt"))
        chains = ("PROXY_INIT_OUTPUT", "PROXY_INIT_REDIRECT")
        user_rules = tuple(r for r in rules if r.chain in chains)
        apply(ns, V4, TableChange("nat", chains, (), rules))
        first = oracle(ns, V4)
        apply(ns, V4, TableChange("nat", (), chains, user_rules))
        assert oracle(ns, V4) == first
        assert dump(ns, V4).rules == rules


class TestAtomicity:
    def test_kernel_refusal_leaves_the_table(self, rig: Rig) -> None:
        """A jump to a missing chain fails the batch; the earlier flush is rolled back."""
        ns = rig.netns()
        run_scenario(ns, scenario_options("default-nft"), V4)
        before = oracle(ns, V4)
        bad = Rule("PROXY_INIT_OUTPUT", ("-j", "NO_SUCH_CHAIN"))
        change = TableChange("nat", ("NEW_CHAIN",), ("PROXY_INIT_OUTPUT",), (bad,))
        with pytest.raises(FirewallError, match="-A PROXY_INIT_OUTPUT -j NO_SUCH_CHAIN") as err:
            apply(ns, V4, change)
        assert err.value.errno is not None
        assert oracle(ns, V4) == before

    def test_failure_in_a_fresh_netns_creates_nothing(self, rig: Rig) -> None:
        """The table, base chain and user chain made earlier in a refused batch vanish too."""
        ns = rig.netns()
        rules = (Rule("OUTPUT", ("-j", "A")), Rule("A", ("-j", "NO_SUCH_CHAIN")))
        with pytest.raises(FirewallError, match="-A A -j NO_SUCH_CHAIN"):
            apply(ns, V4, TableChange("nat", ("A",), (), rules))
        with entered_netns(ns.path, allow_own=False):
            assert read_chains(V4) == []

    def test_hook_validation_rolls_back_earlier_messages(self, rig: Rig) -> None:
        """A REDIRECT chain jumped to from nat INPUT is refused; the chain made before goes too."""
        ns = rig.netns()
        run_scenario(ns, scenario_options("default-nft"), V4)
        before = oracle(ns, V4)
        redirect = Rule("U", ("-p", "tcp", "-j", "REDIRECT", "--to-ports", "1"))
        change = TableChange("nat", ("U",), (), (redirect, Rule("INPUT", ("-j", "U"))))
        with pytest.raises(FirewallError, match="nf_tables refused -A INPUT -j U: Invalid"):
            apply(ns, V4, change)
        assert oracle(ns, V4) == before

    def test_unencodable_rule_sends_nothing(self, rig: Rig) -> None:
        """Upstream's empty --dports fails with iptables' message before the kernel is asked."""
        ns = rig.netns()
        run_scenario(ns, scenario_options("default-nft"), V4)
        before = oracle(ns, V4)
        empty = ("-p", "tcp", "-m", "multiport", "--dports", "", "-j", "RETURN")
        change = TableChange("nat", (), ("PROXY_INIT_OUTPUT",), (Rule("PROXY_INIT_OUTPUT", empty),))
        with pytest.raises(FirewallError, match="invalid port/service `' specified"):
            apply(ns, V4, change)
        assert oracle(ns, V4) == before

    def test_ipv4_subnet_in_ipv6(self, rig: Rig) -> None:
        """An IPv4 CIDR fails the IPv6 pass with ip6tables' message; nothing is created."""
        ns = rig.netns()
        rule = Rule("PROXY_INIT_REDIRECT", ("-s", "10.0.0.0/8", "-j", "RETURN"))
        with pytest.raises(FirewallError, match=r"host/network `10\.0\.0\.0' not found"):
            apply(ns, V6, TableChange("nat", ("PROXY_INIT_REDIRECT",), (), (rule,)))
        with entered_netns(ns.path, allow_own=False):
            assert not BACKEND.has_rules(V6)
        assert "PROXY_INIT_REDIRECT" not in render_table(dump(ns, V6))


def restore_files() -> list[Path]:
    named = sorted(SCENARIOS.glob("*.iptables-save.txt"))
    return [p for p in named if "twice" not in p.name] + sorted(CANON.glob("save-*.nft.txt"))


class TestReadingIptablesNft:
    @pytest.mark.parametrize("path", restore_files(), ids=lambda p: p.name)
    def test_dump_of_real_iptables_nft(self, rig: Rig, path: Path) -> None:
        """Rules written by iptables-nft-restore dump to the fixture's rules, expression-exact."""
        ns, family = rig.netns(), family_of(path)
        body = "\n".join(line for line in path.read_text().splitlines() if line[:1] != "#")
        ns.exec([require_tool(RESTORE[family])], input_=body + "\n")
        table = dump(ns, family)
        assert table.rules == tuple(save_rules(path))
        assert lines(table) == oracle(ns, family)
        with entered_netns(ns.path, allow_own=False):
            raw = read_rules(family, "nat")
        for info, rule in zip(raw, table.rules, strict=True):
            assert typed(info.exprs) == typed(nft_rule.encode_rule_tokens(rule.spec, family).exprs)

    @pytest.mark.parametrize("times", [1, 2])
    def test_noflush_restore_of_the_canonicalization_input(self, rig: Rig, times: int) -> None:
        """Non-canonical restore input, read back as iptables-nft-save canonicalises it."""
        ns = rig.netns()
        text = (CANON / "input.restore.txt").read_text()
        for _ in range(times):
            ns.exec([require_tool(RESTORE[V4]), "--noflush"], input_=text)
        expected = CANON / f"save-after-{'one-restore' if times == 1 else 'two-restores'}.nft.txt"
        assert dump(ns, V4).rules == tuple(save_rules(expected))
        assert lines(dump(ns, V4)) == oracle(ns, V4)

    def test_foreign_expressions_are_named(self, rig: Rig) -> None:
        """A nat rule iptables-nft would never write is refused by name, not misprinted."""
        ns = rig.netns()
        script = (
            "add table ip nat\n"
            "add chain ip nat OUTPUT { type nat hook output priority -100; }\n"
            "add rule ip nat OUTPUT ct state established accept\n"
        )
        ns.exec([require_tool("nft"), "-f", "-"], input_=script)
        with pytest.raises(FirewallError, match=r"unsupported expression ct .*chain OUTPUT"):
            dump(ns, V4)

    def test_rules_written_by_nft(self, rig: Rig) -> None:
        """nft's padded interface names and userdata comments read as iptables-nft-save has them."""
        ns = rig.netns()
        script = (
            "add table ip nat\n"
            "add chain ip nat X\n"
            'add rule ip nat X oifname "lo" counter return comment "hi there"\n'
            "add rule ip nat X meta l4proto tcp tcp dport 80 counter return\n"
        )
        ns.exec([require_tool("nft"), "-f", "-"], input_=script)
        assert lines(dump(ns, V4)) == oracle(ns, V4)
        assert dump(ns, V4).rules_of("X")[0].spec[-4:] == ("--comment", "hi there", "-j", "RETURN")


def replay_upstream(ns: Netns, name: str, family: Family) -> None:
    """Run upstream's argv list (fixture) with the nft flavour of its binary."""
    for line in (SCENARIOS / f"{name}.argv.jsonl").read_text().splitlines():
        argv = [a for a in json.loads(line) if a != "-w"]
        tool = "ip6tables-nft" if argv[0].startswith("ip6") else "iptables-nft"
        ns.exec([require_tool(tool), *argv[1:]])


KernelRule = tuple[str, list[tuple[str, nft_expr.Expr]]]


def kernel_state(ns: Netns, family: Family) -> tuple[list[nft_dump.ChainInfo], list[KernelRule]]:
    """Chains by name; rules by chain, in kernel order within each (handles differ)."""
    with entered_netns(ns.path, allow_own=False):
        chains = sorted(read_chains(family), key=lambda ch: ch.name)
        rules = [(r.chain, typed(r.exprs)) for r in read_rules(family)]
    return chains, sorted(rules, key=lambda r: r[0])


class TestSameKernelStateAsUpstream:
    @pytest.mark.parametrize("name", [n for n in OK_NAMES if "twice" not in n])
    def test_chains_and_expressions(self, rig: Rig, name: str) -> None:
        """cnibox leaves the kernel exactly as upstream's iptables-nft commands do: the same
        chains (hooks, priorities, policies, counters) and, per chain, the same expressions."""
        ours, theirs, family = rig.netns(), rig.netns(), scenario_family(name)
        run_scenario(ours, scenario_options(name), family)
        replay_upstream(theirs, name, family)
        assert kernel_state(ours, family) == kernel_state(theirs, family)


class TestDetection:
    def test_has_rules(self, rig: Rig) -> None:
        """has_rules sees rules per family, and nothing in a fresh netns."""
        ns = rig.netns()
        with entered_netns(ns.path, allow_own=False):
            assert BACKEND.available()
            assert not BACKEND.has_rules(V4)
            BACKEND.apply(V4, TableChange("nat", ("X",), (), (Rule("X", ("-j", "RETURN")),)))
            assert BACKEND.has_rules(V4)
            assert not BACKEND.has_rules(V6)

    def test_dump_of_missing_table(self, rig: Rig) -> None:
        """No nat table: the built-in chains iptables-nft-save lists anyway, no rules."""
        ns = rig.netns()
        assert lines(dump(ns, V6)) == oracle(ns, V6)
        assert strip_counters(dump(ns, V6)) == empty_table()


class TestNoHostBinaries:
    def test_apply_with_empty_path(self, rig: Rig) -> None:
        """The backend needs no executable: it applies with PATH pointing at an empty dir."""
        ns = rig.netns()
        script = (
            "import sys\n"
            "from multicall.core.firewall.model import Family, TableChange\n"
            "from multicall.core.firewall.ruleset import Rule\n"
            "from multicall.effects.ns import entered_netns\n"
            "from multicall.effects.firewall.nft import NftBackend\n"
            "rule = Rule('PREROUTING', ('-p', 'tcp', '-j', 'REDIRECT', '--to-ports', '4143'))\n"
            "with entered_netns(sys.argv[1]):\n"
            "    NftBackend().apply(Family.IPV4, TableChange('nat', (), (), (rule,)))\n"
        )
        with tempfile.TemporaryDirectory() as empty:
            env = {"PATH": empty, "PYTHONPATH": str(REPO)}
            subprocess.run([sys.executable, "-c", script, ns.path], env=env, check=True)
            assert os.listdir(empty) == []
        assert "-A PREROUTING -p tcp -j REDIRECT --to-ports 4143" in oracle(ns, V4)


class TestRoundTrip:
    @settings(
        max_examples=15,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(case=rule_specs())
    def test_apply_dump_and_oracle_agree(self, case: tuple[Family, nft_spec.RuleSpec]) -> None:
        """Random rules: dump(apply(x)) == x, and iptables-nft-save prints x."""
        require_root()
        family, spec = case
        rule = Rule("T", nft_spec.render_spec_tokens(spec))
        rig = Rig()
        try:
            ns = rig.netns()
            apply(ns, family, TableChange("nat", ("T", "X"), (), (rule,)))
            assert dump(ns, family).rules_of("T") == (rule,)
            assert [line for line in oracle(ns, family) if line.split(" ")[:2] == ["-A", "T"]] == [
                lines(Table("nat", (), (rule,)))[1]
            ]
        finally:
            rig.cleanup()


def test_a_new_netns_with_a_freed_netns_inode_is_not_taken_for_the_old_one() -> None:
    """One long-lived backend (a node agent's, a repair controller's) programs pod after pod.

    The kernel gives a freed netns's inode number to the next netns, so an identity made of
    (dev, inode) took the new pod's netns for the previous one (same generation 1 when read,
    a table the previous commit did not touch) and planned the batch against the previous
    netns's generation: a false FirewallConflict (seen in CI). The netns cookie is never
    reused. Families alternate, one table change per netns; inode reuse waits for the
    kernel's asynchronous netns cleanup (a pause between rounds lets it run), so rounds
    continue until it was seen twice."""
    require_root()
    backend = NftBackend()
    rule = Rule("T", ("-j", "RETURN"))
    inodes: list[int] = []
    for round_ in range(40):
        family = (V4, V6)[round_ % 2]
        rig = Rig()
        try:
            ns = rig.netns()
            inodes.append(os.stat(ns.path).st_ino)
            with entered_netns(ns.path, allow_own=False):
                backend.apply(family, TableChange("nat", ("T",), (), (rule,)))
                assert backend.dump(family).rules_of("T") == (rule,)
        finally:
            rig.cleanup()
        if sum(a == b for a, b in itertools.pairwise(inodes)) >= 2:
            break
        time.sleep(0.3)
