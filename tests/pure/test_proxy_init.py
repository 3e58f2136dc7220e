"""The pure PROXY_INIT model against upstream's unit cases and the derived fixtures."""

from __future__ import annotations

import pytest

from multicall.core.firewall.model import (
    OUTPUT_CHAIN,
    REDIRECT_CHAIN,
    Family,
    Mode,
    ProxyInitOptions,
    TableChange,
)
from multicall.core.firewall.ports import PortRange, Syntax, parse_port_range
from multicall.core.firewall.proxy_init import (
    apply_change,
    binaries,
    build_argv,
    build_rules,
    build_run_argv,
    empty_table,
    expected_table,
    group_ports,
    invalid_ports,
    plan_change,
    subnets_of_family,
)
from multicall.core.firewall.ruleset import Chain, Rule, Table, render_table
from multicall.errors import FirewallError
from tests.support.rulesets import render_restore
from tests.support.scenarios import (
    ERROR_NAMES,
    EXISTING,
    FILTERED_BY_FAMILY,
    NAMES,
    OK_NAMES,
    fixture_argv,
    fixture_body,
    fixture_error,
    parse_existing,
    scenario_family,
    scenario_mode,
    scenario_options,
    times_applied,
)

# ---------------------------------------------------------------- ports


class TestParsePortRange:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("23-23", PortRange(23, 23)),
            ("25-27", PortRange(25, 27)),
            ("0-65535", PortRange(0, 65535)),
            ("33", PortRange(33, 33)),
            ("+5-+6", PortRange(5, 6)),
        ],
    )
    def test_valid(self, text: str, expected: PortRange) -> None:
        """upstream TestParsePortRange."""
        assert parse_port_range(text, Syntax.LINKERD) == expected

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("", "not a valid lower-bound"),
            ("notanumber", "not a valid lower-bound"),
            ("not-number", "not a valid lower-bound"),
            ("-23-25", "ranges expected as"),
            ("-23", "not a valid lower-bound"),
            ("25-23", "upper-bound must be greater than or equal to"),
            ("65536-65539", "not a valid lower-bound"),
            ("23-notanumber", "not a valid upper-bound"),
            ("23-", "not a valid upper-bound"),
            (" 587", "not a valid lower-bound"),
        ],
    )
    def test_invalid(self, text: str, message: str) -> None:
        """upstream TestParsePortRange_Errors, plus the unsplit-space case
        (docs/upstream-behaviour.md §3)."""
        with pytest.raises(ValueError, match=message):
            parse_port_range(text, Syntax.LINKERD)

    def test_item_is_quoted_as_upstream_prints_it(self) -> None:
        """upstream's texts are `fmt.Errorf("\\"%s\\" ...")`: the item between plain quotes,
        a DEL or a quote inside it printed as it is (not strconv.Quote's `\\x7f`)."""
        with pytest.raises(ValueError, match="is not a valid lower-bound") as info:
            parse_port_range('8\x7f"', Syntax.LINKERD)
        assert str(info.value) == '"8\x7f"" is not a valid lower-bound'

    def test_render(self) -> None:
        """Ranges render with a colon, singles (also N-N) as the bare port."""
        assert [PortRange(1, 1).render(), PortRange(1, 2).render()] == ["1", "1:2"]


class TestMultiportGrouping:
    @pytest.mark.parametrize(
        ("items", "groups"),
        [
            ((), ()),
            (("22", "25-27", "33"), (("22", "25:27", "33"),)),
            (("22-22", "25-27", "33"), (("22", "25:27", "33"),)),
            (("22", "25-27", "not-a-number", "33"), (("22", "25:27", "33"),)),
            (("22", "25-27", "notanumber", "33"), (("22", "25:27", "33"),)),
            (
                ("22-23", "25-27", "33-34", "35-35", "37-38", "50-54", "56-57", "60-63"),
                (("22:23", "25:27", "33:34", "35", "37:38", "50:54", "56:57", "60:63"),),
            ),
            (
                (
                    "22-23",
                    "25-27",
                    "33-34",
                    "35-35",
                    "37-38",
                    "50-54",
                    "56",
                    "58",
                    "60",
                    "63",
                    "70-72",
                ),
                (
                    ("22:23", "25:27", "33:34", "35", "37:38", "50:54", "56", "58", "60", "63"),
                    ("70:72",),
                ),
            ),
            (("abc",), ((),)),
        ],
    )
    def test_groups(self, items: tuple[str, ...], groups: tuple[tuple[str, ...], ...]) -> None:
        """upstream TestMakeMultiportDestinations(_Split), and the all-invalid quirk."""
        assert group_ports(items).groups == groups

    def test_fifteen_singles_then_split(self) -> None:
        """Fifteen single ports fill one group; the sixteenth opens the next."""
        items = tuple(str(p) for p in range(1, 17))
        assert [len(g) for g in group_ports(items).groups] == [15, 1]

    def test_invalid_reported(self) -> None:
        """Dropped items come back with upstream's log line."""
        options = ProxyInitOptions(outbound_ports_to_ignore=("25", " 587"))
        (bad,) = invalid_ports(options)
        assert (
            bad.message()
            == 'invalid port configuration of " 587": " 587" is not a valid lower-bound'
        )


# ---------------------------------------------------------------- argv and rules vs fixtures


class TestFixtures:
    def test_binaries(self) -> None:
        """The table of binaries per mode and family (docs/upstream-behaviour.md §4.1)."""
        assert binaries(Mode.LEGACY, Family.IPV6) == ("ip6tables-legacy", "ip6tables-legacy-save")
        assert binaries(Mode.NFT, Family.IPV4) == ("iptables-nft", "iptables-nft-save")
        assert binaries(Mode.PLAIN, Family.IPV6) == ("ip6tables", "ip6tables-save")

    @pytest.mark.parametrize("name", [n for n in NAMES if n != FILTERED_BY_FAMILY])
    def test_argv_golden(self, name: str) -> None:
        """The argv list equals upstream's replay, for every run of the scenario (the one
        #696's filter changes is checked below)."""
        options, family, mode = scenario_options(name), scenario_family(name), scenario_mode(name)
        table, argv = empty_table(), list[tuple[str, ...]]()
        for _ in range(times_applied(name)):
            argv += build_argv(options, family, mode=mode, existing=table)
            if not name.startswith("error-"):
                table = expected_table(options, family, table)
        expected = fixture_argv(name)
        if name.startswith("error-"):
            argv = argv[: len(expected)]  # the real run stopped at the failing command
        assert argv == expected

    @pytest.mark.parametrize("name", OK_NAMES)
    def test_expected_table_golden(self, name: str) -> None:
        """The model's table renders exactly as the oracle's save body."""
        options, family = scenario_options(name), scenario_family(name)
        table = empty_table()
        for _ in range(times_applied(name)):
            table = expected_table(options, family, table)
        assert render_table(table).splitlines() == fixture_body(name)

    @pytest.mark.parametrize("name", ERROR_NAMES)
    @pytest.mark.parametrize("backend", ["nft", "legacy"])
    def test_error_message(self, name: str, backend: str) -> None:
        """Error scenarios raise iptables' own first line (flavoured per backend)."""
        options, family = scenario_options(name), scenario_family(name)
        with pytest.raises(FirewallError) as info:
            build_rules(options, family, backend=backend)
        expected = fixture_error(name)
        if backend == "legacy":
            expected = expected.replace("(nf_tables)", "(legacy)")
        assert str(info.value) == expected
        assert "--help" in info.value.details

    def test_other_family_subnet_is_skipped_not_fatal(self) -> None:
        """Upstream's run fails at the IPv4 subnet in ip6tables (the fixture); with #696's
        filter the same commands are run without that one, and the pass succeeds."""
        name = FILTERED_BY_FAMILY
        options, family, mode = scenario_options(name), scenario_family(name), scenario_mode(name)
        upstream = fixture_argv(name)
        assert "10.0.0.0/8" in upstream[-1]  # upstream's failing command
        ours = build_argv(options, family, mode=mode)
        assert ours[: len(upstream) - 1] == tuple(upstream[:-1])
        assert not any("10.0.0.0/8" in " ".join(argv) for argv in ours)
        rules = build_rules(options, family)[REDIRECT_CHAIN]
        assert not any("ignore-subnet" in " ".join(r.spec) for r in rules)

    @pytest.mark.parametrize(
        ("family", "kept"),
        [
            (Family.IPV4, ("172.16.0.0/12", "10.0.0.0/8")),
            (Family.IPV6, ("fd00::/8", "2001:db8::/32")),
        ],
    )
    def test_subnets_filtered_by_family_as_in_696(
        self, family: Family, kept: tuple[str, ...]
    ) -> None:
        """linkerd2-proxy-init#696's root_test.go cases: mixed subnets, each pass keeps its
        own family's, in order; IPv4-only subnets give the IPv6 pass none, without error."""
        mixed = ("172.16.0.0/12", "fd00::/8", "10.0.0.0/8", "2001:db8::/32")
        assert subnets_of_family(mixed, family) == kept
        assert subnets_of_family(("172.16.0.0/12",), Family.IPV6) == ()
        rules = build_rules(ProxyInitOptions(subnets_to_ignore=mixed), family)[REDIRECT_CHAIN]
        comments = [r.spec[r.spec.index("--comment") + 1] for r in rules if "RETURN" in r.spec]
        assert [c for c in comments if "ignore-subnet" in c] == [
            f"proxy-init/ignore-subnet-{s}" for s in kept
        ]

    def test_ipv4_mapped_network_stays_with_ipv6(self) -> None:
        """`::ffff:10.0.0.0/104` is IPv6 notation only ip6tables accepts: the IPv6 pass keeps
        it (#696's `To4()` would hand it to iptables, which rejects it), the IPv4 pass skips it."""
        mapped = ("::ffff:10.0.0.0/104",)
        assert subnets_of_family(mapped, Family.IPV4) == ()
        assert subnets_of_family(mapped, Family.IPV6) == mapped
        build_rules(ProxyInitOptions(subnets_to_ignore=mapped), Family.IPV4)  # no error

    def test_run_argv(self) -> None:
        """A whole run is nsenter-wrapped and framed by two save commands."""
        run = build_run_argv(ProxyInitOptions(), Family.IPV4, mode=Mode.NFT, netns="/run/netns/x")
        assert run[0] == ("nsenter", "--net=/run/netns/x", "--", "iptables-nft-save", "-t", "nat")
        assert run[-1] == run[0]
        assert run[1][3:] == ("iptables-nft", "-t", "nat", "-N", REDIRECT_CHAIN)


# ---------------------------------------------------------------- validation


class TestValidation:
    @pytest.mark.parametrize("subnet", ["0.0.0.0", "10.0.0.0/33", "10.0.0.0/255.0.0.0", "x/8"])
    def test_bad_subnet(self, subnet: str) -> None:
        """Go's ParseCIDR rejects these; upstream says `<s> is not a valid CIDR address`."""
        with pytest.raises(FirewallError, match="is not a valid CIDR address"):
            build_rules(ProxyInitOptions(subnets_to_ignore=(subnet,)), Family.IPV4)

    def test_subnet_trimmed_and_masked(self) -> None:
        """A trailing space is accepted; iptables masks host bits; the comment keeps them."""
        rules = build_rules(ProxyInitOptions(subnets_to_ignore=("10.1.2.3/8 ",)), Family.IPV4)
        rule = rules[REDIRECT_CHAIN][0]
        assert rule.spec[:2] == ("-s", "10.0.0.0/8")
        assert "proxy-init/ignore-subnet-10.1.2.3/8" in rule.spec

    def test_zero_prefix_has_no_source(self) -> None:
        """iptables-save omits `-s 0.0.0.0/0`."""
        rules = build_rules(ProxyInitOptions(subnets_to_ignore=("0.0.0.0/0",)), Family.IPV4)
        assert rules[REDIRECT_CHAIN][0].spec[0] == "-m"

    def test_ipv6_subnet(self) -> None:
        """IPv6 networks print compressed with their prefix."""
        rules = build_rules(ProxyInitOptions(subnets_to_ignore=("fd00:0::1/64",)), Family.IPV6)
        assert rules[REDIRECT_CHAIN][0].spec[:2] == ("-s", "fd00::/64")

    @pytest.mark.parametrize(
        ("subnet", "shown"),
        [
            ("::ffff:10.0.0.0/104", "::ffff:10.0.0.0/104"),
            ("::1.2.3.4/128", "::1.2.3.4/128"),
            ("::1/128", "::1/128"),
            ("::ffff:0:0/96", "::ffff:0.0.0.0/96"),
            ("1:0:0:1::/64", "1:0:0:1::/64"),
        ],
    )
    def test_ipv6_like_inet_ntop(self, subnet: str, shown: str) -> None:
        """IPv4-mapped and -compatible addresses print as glibc's inet_ntop writes them."""
        rules = build_rules(ProxyInitOptions(subnets_to_ignore=(subnet,)), Family.IPV6)
        assert rules[REDIRECT_CHAIN][0].spec[:2] == ("-s", shown)

    @pytest.mark.parametrize(
        ("field", "flag"), [("incoming", "incoming"), ("outgoing", "outgoing")]
    )
    def test_proxy_ports(self, field: str, flag: str) -> None:
        """Proxy ports outside 0..65535 fail with upstream's text."""
        options = ProxyInitOptions(**{f"{field}_proxy_port": 65536})  # type: ignore[arg-type]
        with pytest.raises(FirewallError, match=f"--{flag}-proxy-port must be a valid TCP port"):
            build_rules(options, Family.IPV4)

    def test_redirect_port_out_of_range(self) -> None:
        """A ports-to-redirect entry iptables cannot parse fails like iptables."""
        with pytest.raises(FirewallError, match="invalid port/service `70000' specified"):
            build_rules(ProxyInitOptions(ports_to_redirect=(70000,)), Family.IPV4)

    def test_uid_zero_means_no_rule(self) -> None:
        """uid/gid 0 (or negative) add no owner rule."""
        rules = build_rules(ProxyInitOptions(proxy_uid=0, proxy_gid=-1), Family.IPV4)
        assert all("owner" not in r.spec for r in rules[OUTPUT_CHAIN])


# ---------------------------------------------------------------- fresh vs existing chains


class TestPlan:
    def test_fresh(self) -> None:
        """No chains: create both and add both jumps (upstream 'no existing rules')."""
        change = plan_change(empty_table(), ProxyInitOptions(), Family.IPV4)
        assert change.create_chains == (REDIRECT_CHAIN, OUTPUT_CHAIN)
        assert change.flush_chains == ()
        assert [r.chain for r in change.append].count("PREROUTING") == 1
        assert [r.chain for r in change.append].count("OUTPUT") == 1

    def test_existing_rules(self) -> None:
        """upstream's existingRules dump: flush both, re-add no jump."""
        existing = parse_existing(EXISTING)
        options = ProxyInitOptions(inbound_ports_to_ignore=("1234",), outgoing_proxy_port=1234)
        change = plan_change(existing, options, Family.IPV4)
        assert change.create_chains == ()
        assert change.flush_chains == (REDIRECT_CHAIN, OUTPUT_CHAIN)
        assert {r.chain for r in change.append} == {REDIRECT_CHAIN, OUTPUT_CHAIN}

    def test_existing_argv(self) -> None:
        """The argv for the existing dump are upstream's `-F` lists without jumps."""
        existing = parse_existing(EXISTING)
        options = ProxyInitOptions(
            inbound_ports_to_ignore=("1234",), outgoing_proxy_port=1234, proxy_uid=0
        )
        argv = build_argv(options, Family.IPV4, existing=existing)
        assert [a[3:5] for a in argv if a[3] in ("-N", "-F")] == [
            ("-F", REDIRECT_CHAIN),
            ("-F", OUTPUT_CHAIN),
        ]
        assert all(a[4] not in ("PREROUTING", "OUTPUT") for a in argv)
        assert argv[1][5:] == (
            "-p", "tcp", "--match", "multiport", "--dports", "1234", "-j", "RETURN",
            "-m", "comment", "--comment", "proxy-init/ignore-port-1234",
        )  # fmt: skip

    def test_apply_twice_is_stable(self) -> None:
        """Applying twice yields the same table: no duplicate jumps."""
        once = expected_table(ProxyInitOptions(), Family.IPV4)
        assert expected_table(ProxyInitOptions(), Family.IPV4, once) == once

    def test_a_then_b_replaces(self) -> None:
        """B after A equals B alone: chains' contents replaced, jumps kept once."""
        a = ProxyInitOptions(inbound_ports_to_ignore=("1", "2"), proxy_gid=5)
        b = ProxyInitOptions(outbound_ports_to_ignore=("443",), ports_to_redirect=(80,))
        after_a = expected_table(a, Family.IPV4)
        assert expected_table(b, Family.IPV4, after_a) == expected_table(b, Family.IPV4)

    def test_foreign_rules_survive(self) -> None:
        """Rules of other chains stay, in save order."""
        base = empty_table()
        foreign = Rule("POSTROUTING", ("-j", "MASQUERADE"))
        base = Table("nat", (*base.chains, Chain("AAA")), (foreign,))
        table = expected_table(ProxyInitOptions(), Family.IPV4, base)
        assert foreign in table.rules
        assert [c.name for c in table.chains][-3:] == ["AAA", OUTPUT_CHAIN, REDIRECT_CHAIN]

    def test_apply_change_orders_rules(self) -> None:
        """apply_change groups appended rules by chain in save order."""
        change = TableChange("nat", ("X",), (), (Rule("X", ("-j", "RETURN")), Rule("OUTPUT", ())))
        table = apply_change(empty_table(), change)
        assert [r.chain for r in table.rules] == ["OUTPUT", "X"]


class TestRestoreText:
    def test_fresh(self) -> None:
        """Declares both chains, appends jumps once, quotes comments like save."""
        text = render_restore(plan_change(empty_table(), ProxyInitOptions(), Family.IPV4))
        lines = text.splitlines()
        assert lines[:3] == ["*nat", f":{REDIRECT_CHAIN} - [0:0]", f":{OUTPUT_CHAIN} - [0:0]"]
        assert lines[-1] == "COMMIT"
        assert (
            '-A PREROUTING -m comment --comment "proxy-init/install-proxy-init-prerouting"'
            " -j PROXY_INIT_REDIRECT" in lines
        )

    def test_reapply_has_no_jumps(self) -> None:
        """Planned against an applied table, the text holds no built-in chain rule."""
        applied = expected_table(ProxyInitOptions(), Family.IPV4)
        text = render_restore(plan_change(applied, ProxyInitOptions(), Family.IPV4))
        assert "-A PREROUTING" not in text
        assert "-A OUTPUT " not in text
