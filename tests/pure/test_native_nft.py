"""The nftables mode's pure parts: the tables planned from every derived scenario, the one
batch that programs them (decoded back through the codec: native expressions only), the
refusals shared with the iptables mode, the text form, CHECK's comparison and the hint an
iptables-nft refusal gives on a kernel without x_tables."""

from __future__ import annotations

import errno

import pytest

from multicall.core.cni.netconf import mode_of, parse_netconf
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.firewall.nft import netlink
from multicall.core.firewall.nft.batch import Batch
from multicall.core.firewall.nft.expr import XtMatch, XtTarget, decode_exprs
from multicall.core.firewall.nft.native import (
    TABLE,
    build_native_batch,
    compat_expressions,
    diff_text,
    extract_table,
    native_table,
    render,
)
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
    assert '\t\ttcp dport 587-590 return comment "proxy-init/ignore-port-587-590"' in text
    assert '\t\tip saddr 10.0.0.0/8 return comment "proxy-init/ignore-subnet-10.0.0.0/8"' in text
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
    assert "tcp dport 22 return" in text
    assert "tcp dport 30-31 return" in text
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
