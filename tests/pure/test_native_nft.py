"""The nftables mode's pure parts: the tables planned from every derived scenario, the one
batch that programs them (decoded back through the codec: native expressions only), the
refusals shared with the iptables mode, the text form, CHECK's comparison and the hint an
iptables-nft refusal gives on a kernel without x_tables."""

from __future__ import annotations

import errno
import itertools

import pytest

from multicall.core.cni.netconf import mode_of, parse_netconf
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.firewall.nft import netlink
from multicall.core.firewall.nft.batch import Batch
from multicall.core.firewall.nft.expr import Lookup, XtMatch, XtTarget, decode_exprs
from multicall.core.firewall.nft.native import (
    COMMENT_MAX,
    ELEMENTS_PER_MESSAGE,
    TABLE,
    Interval,
    NativeSet,
    build_native_batch,
    compat_expressions,
    diff_text,
    elements_per_message,
    extract_table,
    items_from_elements,
    list_comment,
    merged,
    native_table,
    render,
    set_elements,
)
from multicall.core.firewall.ports import PortRange
from multicall.core.firewall.proxy_init import build_rules
from multicall.effects.firewall.nft import COMPAT_HINT, _refusal
from multicall.effects.ns import NetnsRef
from multicall.errors import FirewallError
from multicall.plugin.commands import drifted_families, readable
from tests.support.fakes import MemoryFirewall
from tests.support.scenarios import (
    ERROR_NAMES,
    FILTERED_BY_FAMILY,
    NAMES,
    OK_NAMES,
    scenario_family,
    scenario_options,
)

V4, V6 = Family.IPV4, Family.IPV6


def messages(batch: Batch) -> list[netlink.Message]:
    return [m for m in netlink.parse_messages(batch.data) if isinstance(m, netlink.Message)]


@pytest.mark.parametrize("name", [*OK_NAMES, FILTERED_BY_FAMILY])
@pytest.mark.parametrize("family", [V4, V6])
def test_every_batch_holds_native_expressions_only(name: str, family: Family) -> None:
    options = scenario_options(name)  # IPv4 skip subnets: left out of the IPv6 pass (#696)
    tables = (native_table(options, V4), native_table(options, family))
    batch = build_native_batch(tables, 100)
    rules = [m for m in messages(batch) if m.msg_type == netlink.nft_type(netlink.NFT_MSG_NEWRULE)]
    assert len(rules) == sum(len(t.rules) for t in tables)
    decoded = [
        e
        for m in rules
        for e in decode_exprs(netlink.attr_map(m.body)[netlink.NFTA_RULE_EXPRESSIONS])
    ]
    assert decoded  # the check below looks at something
    assert [e for e in decoded if isinstance(e, XtMatch | XtTarget)] == []
    assert compat_expressions(tables) == []
    # each table is added, deleted and added again before its chains: idempotent, atomic
    types = [m.msg_type & 0xFF for m in messages(batch)]
    assert types[1:4] == [netlink.NFT_MSG_NEWTABLE, 2, netlink.NFT_MSG_NEWTABLE]


def test_the_text_form_is_nft_s() -> None:
    options = scenario_options("full-legacy-wait")
    text = render(native_table(options, V4), V4)
    assert text[:3] == [
        f"table ip {TABLE} {{",
        "\tchain prerouting {",
        "\t\ttype nat hook prerouting priority dstnat; policy accept;",
    ]
    ports = "tcp dport { 25, 587-590, 4190-4191 } return"
    assert f'\t\t{ports} comment "proxy-init/ignore-port-4191,4190,25,587-590"' in text
    redirect = "tcp dport { 8080, 9090 } redirect to :4143"
    assert f'\t\t{redirect} comment "proxy-init/redirect-port-8080,9090-to-proxy-port"' in text
    subnets = "ip saddr { 10.0.0.0/8, 192.168.0.0/16 } return"
    assert f'\t\t{subnets} comment "proxy-init/ignore-subnet-10.0.0.0/8,192.168.0.0/16"' in text
    assert '\t\tmeta skgid 2102 return comment "proxy-init/ignore-proxy-group-id"' in text
    assert "\t\ttype nat hook output priority -100; policy accept;" in text
    ruleset = ["table ip other {", "}", *text, *render(native_table(options, V4), V4)]
    assert extract_table(ruleset, V4) == text
    assert extract_table(ruleset, V6) == render(None, V6)


@pytest.mark.parametrize("name", ERROR_NAMES)
def test_the_same_options_are_refused_with_the_same_error(name: str) -> None:
    options, family = scenario_options(name), scenario_family(name)
    with pytest.raises(FirewallError) as iptables:
        build_rules(options, family, backend="nft")
    with pytest.raises(FirewallError) as native:
        native_table(options, family)
    assert native.value.message == iptables.value.message


def test_invalid_port_items_are_dropped_as_in_the_iptables_mode() -> None:
    options = ProxyInitOptions(inbound_ports_to_ignore=("22", "x", "70000", "30-31"))
    text = "\n".join(render(native_table(options, V4), V4))
    assert 'tcp dport { 22, 30-31 } return comment "proxy-init/ignore-port-22,30-31"' in text
    assert "70000" not in text


def test_the_config_selects_the_mode() -> None:
    conf = parse_netconf(b'{"cniVersion":"1.0.0","linkerd":{"iptables-mode":"nftables"}}')
    assert mode_of(conf) is Mode.NFTABLES


def test_check_compares_the_native_tables() -> None:
    firewall = MemoryFirewall()
    netns = NetnsRef("/var/run/netns/pod")
    options = scenario_options("full-legacy-wait")
    log: list[str] = []
    firewall.apply(netns, options, mode=Mode.NFTABLES, families=(V4,), log=log.append)

    def check(wanted: ProxyInitOptions) -> list[str]:
        return readable(
            drifted_families(
                firewall, netns, wanted, mode=Mode.NFTABLES, families=(V4,), log=log.append
            )
        )

    assert check(options) == []
    problems = check(ProxyInitOptions())
    assert len(problems) == 1
    assert '+\t\tmeta skgid 2102 return comment "proxy-init/ignore-proxy-group-id"' in (problems[0])
    firewall.native.clear()
    (missing,) = check(options)
    assert f"+# no table ip {TABLE}" in missing
    assert diff_text(["a"], ["a"]) == ""


@pytest.mark.parametrize(("code", "hinted"), [(errno.ENOENT, True), (errno.EOPNOTSUPP, True),
                                              (errno.EINVAL, False)])  # fmt: skip
def test_a_missing_compat_extension_names_the_native_mode(code: int, hinted: bool) -> None:
    """What a kernel without nft_compat/xt_* answers to an iptables-nft rule batch."""
    batch = Batch(b"", {1: "batch", 2: "table nat", 3: "-A PROXY_INIT_OUTPUT -m owner"}, 4)
    error = _refusal(batch, (netlink.NetlinkError(code, 3),))
    assert "-A PROXY_INIT_OUTPUT" in error.message
    assert (error.hint == COMPAT_HINT) is hinted
    assert (error.details == COMPAT_HINT) is hinted  # what the plugin's CNI error carries
    assert '"nftables"' in COMPAT_HINT
    not_a_rule = _refusal(batch, (netlink.NetlinkError(code, 2),))
    assert not_a_rule.hint is None


def test_every_scenario_has_a_native_twin() -> None:
    """The scenarios the traffic proof covers: all of them (tests/netns/...equivalence)."""
    assert set(OK_NAMES) | set(ERROR_NAMES) | {FILTERED_BY_FAMILY} == set(NAMES)


# ---- port lists as sets ---------------------------------------------------------------------


def of_type(batch: Batch, msg: int) -> list[netlink.Message]:
    return [m for m in messages(batch) if m.msg_type == netlink.nft_type(msg)]


def elements_of(batch: Batch) -> list[tuple[bytes, int]]:
    out = []
    for m in of_type(batch, netlink.NFT_MSG_NEWSETELEM):
        listed = netlink.attr_map(m.body)[netlink.NFTA_SET_ELEM_LIST_ELEMENTS]
        assert len(listed) < 1 << 16  # one attribute: its length is 16 bits
        for _, elem in netlink.iter_attrs(listed):
            e = netlink.attr_map(elem)
            key = netlink.attr_map(e[netlink.NFTA_SET_ELEM_KEY])[netlink.NFTA_DATA_VALUE]
            flags = (
                netlink.u32(e[netlink.NFTA_SET_ELEM_FLAGS])
                if netlink.NFTA_SET_ELEM_FLAGS in e
                else 0
            )
            out.append((key, flags))
    return out


def port(p: int) -> bytes:
    return p.to_bytes(2, "big")


END = netlink.NFT_SET_ELEM_INTERVAL_END


@pytest.mark.parametrize(
    ("items", "flags", "elements", "text"),
    [
        # single ports: a plain set (nft's choice for `{ 4191, 4190 }`), sorted, deduplicated
        (("4191", "4190", "4191"), 3, [(port(4190), 0), (port(4191), 0)], "{ 4190, 4191 }"),
        # a range among them: an interval set, overlapping and adjacent items merged, led by
        # an end at 0, each range closed by the port after it (flagged), none past 65535
        (("22", "23", "587-590", "589-600", "65000-65535"), 7,
         [(port(0), END), (port(22), 0), (port(24), END), (port(587), 0), (port(601), END),
          (port(65000), 0)],
         "{ 22-23, 587-600, 65000-65535 }"),
    ],
)  # fmt: skip
def test_a_port_list_is_one_rule_looking_up_one_set(
    items: tuple[str, ...], flags: int, elements: list[tuple[bytes, int]], text: str
) -> None:
    options = ProxyInitOptions(inbound_ports_to_ignore=items)
    table = native_table(options, V4)
    (rule,) = [r for r in table.rules if r.comment and "ignore-port" in r.comment]
    (lookup,) = [e for e in rule.exprs if isinstance(e, Lookup)]
    (port_set,) = rule.sets
    assert lookup.set_id == port_set.set_id
    batch = build_native_batch((table,), 1)
    (new_set,) = of_type(batch, netlink.NFT_MSG_NEWSET)
    attrs = netlink.attr_map(new_set.body)
    assert netlink.u32(attrs[netlink.NFTA_SET_FLAGS]) == flags
    assert netlink.u32(attrs[netlink.NFTA_SET_ID]) == lookup.set_id
    assert elements_of(batch) == elements
    assert items_from_elements(elements, bool(flags & netlink.NFT_SET_INTERVAL)) == port_set.items
    line = f'tcp dport {text} return comment "proxy-init/ignore-port-{",".join(items)}"'
    assert f"\t\t{line}" in render(table, V4)
    # the set comes before the rule that binds it (a bound constant set takes no elements)
    kinds = [m.msg_type & 0xFF for m in messages(batch)]
    assert kinds.index(netlink.NFT_MSG_NEWSETELEM) < kinds.index(netlink.NFT_MSG_NEWRULE)


def test_a_list_of_one_port_or_range_is_a_plain_compare() -> None:
    for items, text in (
        (("80", "80"), "tcp dport 80 return"),
        (("1-10", "5-20"), "tcp dport 1-20 return"),
    ):
        table = native_table(ProxyInitOptions(inbound_ports_to_ignore=items), V4)
        assert all(not r.sets for r in table.rules)
        assert any(line.startswith(f"\t\t{text} comment") for line in render(table, V4))


def test_dual_stack_sets_have_ids_of_their_own() -> None:
    options = scenario_options("full-legacy-wait")
    ids = [s.set_id for fam in (V4, V6) for r in native_table(options, fam).rules for s in r.sets]
    assert len(ids) == 7  # the IPv4 subnets' set only in the ip table
    assert len(set(ids)) == 7


@pytest.mark.parametrize(
    ("subnets", "v4", "v6"),
    [
        # one subnet of the family: a prefix compare; the other family's left out (#696)
        (("10.0.0.0/8", "fd00::/8"), "ip saddr 10.0.0.0/8", "ip6 saddr fd00::/8"),
        # several: one interval set, merged, printed as nft does (prefixes, hosts, ranges)
        (("11.0.0.0/8", "10.0.0.0/8", "172.16.0.1/32", "fd00::/8", "fd00:1::/64", "::/0"),
         "ip saddr { 10.0.0.0/7, 172.16.0.1 }", "ip6 saddr { ::/0 }"),
        (("10.0.0.0/8", "11.0.0.0/8", "12.0.0.0/8"), "ip saddr { 10.0.0.0-12.255.255.255 }", ""),
    ],
)  # fmt: skip
def test_skipped_subnets_are_one_rule_of_the_family_s_own(
    subnets: tuple[str, ...], v4: str, v6: str
) -> None:
    options = ProxyInitOptions(subnets_to_ignore=subnets)
    for family, want in ((V4, v4), (V6, v6)):
        table = native_table(options, family)
        lines = [line for line in render(table, family) if "ignore-subnet" in line]
        assert [line.split(" return ")[0].strip() for line in lines] == ([want] if want else [])
        batch = build_native_batch((table,), 1)
        for r in table.rules:
            for s in r.sets:
                interval = bool(s.interval)
                assert items_from_elements(set_elements(s), interval, s.key_len) == s.items
        assert len(of_type(batch, netlink.NFT_MSG_NEWSET)) == (1 if "{" in want else 0)


def test_merged_items_and_elements_round_trip() -> None:
    lists = [
        [PortRange(0, 0), PortRange(2, 2)],
        [PortRange(1, 65535)],
        [PortRange(5, 9), PortRange(1, 4), PortRange(11, 12), PortRange(65535, 65535)],
        [PortRange(p, p) for p in range(1, 65536, 2)],
    ]
    for ranges in lists:
        items = merged(ranges)
        assert all(a.upper + 1 < b.lower for a, b in itertools.pairwise(items))
        interval = NativeSet("__set%d", 1, True, items)
        assert items_from_elements(set_elements(interval), True) == items
        plain = NativeSet("__set%d", 1, False, tuple(sorted({Interval(*r) for r in ranges})))
        if all(r.lower == r.upper for r in ranges):
            assert items_from_elements(set_elements(plain), False) == plain.items


@pytest.mark.parametrize("every", [1, 2])
def test_a_65535_port_list_stays_one_rule_in_a_bounded_batch(every: int) -> None:
    """Every port (a plain set of 65,535) or every other one: one rule, elements in messages
    of at most ELEMENTS_PER_MESSAGE, the batch about 16 bytes a port."""
    ports = tuple(str(p) for p in range(1, 65536, every))
    table = native_table(ProxyInitOptions(outbound_ports_to_ignore=ports), V4)
    listed = [r for r in table.rules if r.sets]
    assert len(listed) == 1
    batch = build_native_batch((table,), 1)
    assert len(elements_of(batch)) == len(ports)
    assert len(of_type(batch, netlink.NFT_MSG_NEWSETELEM)) == -(-len(ports) // ELEMENTS_PER_MESSAGE)
    assert len(batch.data) < 20 * len(ports) + 4096
    assert len(listed[0].comment or "") <= COMMENT_MAX


def test_a_long_list_comment_is_cut_on_an_item() -> None:
    items = [str(p) for p in range(1000, 1100)]
    text = "proxy-init/" + list_comment("ignore-port-", items)
    assert len(text) <= COMMENT_MAX
    assert text.startswith("proxy-init/ignore-port-1000,1001,")
    assert text.endswith(",...")
    assert list_comment("ignore-port-", ["1", "2"]) == "ignore-port-1,2"
    tail = list_comment("redirect-port-", items, "-to-proxy-port")
    assert tail.endswith(",...-to-proxy-port")
    assert len("proxy-init/" + tail) <= COMMENT_MAX


def test_an_ipv6_subnet_set_keeps_each_element_list_under_64_kib() -> None:
    """36 bytes an element: fewer per message than a port set's 2,048 (elements_of checks
    every list attribute's length)."""
    subnets = tuple(f"fd00::{i:x}:0/112" for i in range(0, 2 * 4000, 2))  # none adjacent
    table = native_table(ProxyInitOptions(subnets_to_ignore=subnets), V6)
    batch = build_native_batch((table,), 1)
    ((address_set,),) = [r.sets for r in table.rules if r.sets]
    assert len(address_set.items) == 4000
    assert len(elements_of(batch)) == 8001  # an end at 0, then a start and an end each
    assert elements_per_message(16) < ELEMENTS_PER_MESSAGE
    assert len(of_type(batch, netlink.NFT_MSG_NEWSETELEM)) == -(-8001 // elements_per_message(16))
