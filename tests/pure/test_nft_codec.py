"""The pure nf_tables codec: tokens <-> RuleSpec <-> expressions <-> netlink bytes.

Golden expression lists below were read from `strace -e write=4 iptables-nft-restore` of
Debian's iptables 1.8.9 (the sendmsg batch), so the encoding is pinned to what iptables-nft
itself sends; tests/netns/test_nft_backend.py checks the same against the live kernel.
"""

from __future__ import annotations

import ipaddress
import shlex
import socket
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicall.core.firewall.canonical import canonical
from multicall.core.firewall.model import Family, TableChange
from multicall.core.firewall.nft import batch as nft_batch
from multicall.core.firewall.nft import dump as nft_dump
from multicall.core.firewall.nft import expr as nft_expr
from multicall.core.firewall.nft import netlink as nl
from multicall.core.firewall.nft import rule as nft_rule
from multicall.core.firewall.nft import rulespec as nft_spec
from multicall.core.firewall.nft import xt
from multicall.core.firewall.ruleset import Rule, format_ipv6
from multicall.errors import FirewallError
from tests.support import FIXTURES
from tests.support.nft import family_of, rule_specs, save_rules, typed

SCENARIOS = FIXTURES / "derived" / "linkerd-iptables"
CANON = FIXTURES / "derived" / "iptables-canonicalization"
SAVE_FILES = sorted(SCENARIOS.glob("*.iptables-save.txt")) + sorted(CANON.glob("save-*.txt"))

V4, V6 = Family.IPV4, Family.IPV6
COMMENT = "proxy-init/ignore-proxy-user-id"


def tokens(text: str) -> tuple[str, ...]:
    return tuple(shlex.split(text))


def comment(text: str) -> nft_expr.XtMatch:
    return nft_expr.XtMatch("comment", 0, text.encode().ljust(256, b"\0"))


class TestGoldenEncoding:
    """What iptables-nft 1.8.9 sends, expression by expression."""

    def test_owner_uid_and_comment(self) -> None:
        """owner rev 1 is a 24-byte xt_owner_match_info; the comment a 256-byte match."""
        spec = tokens(f"-m owner --uid-owner 2102 -m comment --comment {COMMENT} -j RETURN")
        owner = bytes.fromhex("360800003608000000000000000000000100000000000000")
        encoded = nft_rule.encode_rule_tokens(spec, V4)
        assert typed(encoded.exprs) == typed(
            (
                nft_expr.XtMatch("owner", 1, owner),
                comment(COMMENT),
                nft_expr.Counter(),
                nft_expr.Immediate(-5),
            )
        )
        assert (encoded.compat_proto, encoded.compat_invert) == (0, False)

    def test_loopback(self) -> None:
        """-o lo is meta oifname compared with the NUL-terminated name."""
        encoded = nft_rule.encode_rule_tokens(tokens("-o lo -j RETURN"), V4)
        assert encoded.exprs[:2] == (nft_expr.Meta(7), nft_expr.Cmp(0, b"lo\0"))

    def test_multiport_with_range(self) -> None:
        """multiport rev 1: flags, count, 15 ports, 15 range flags, invert (48 bytes)."""
        spec = tokens("-p tcp -m multiport --dports 443,6443,3306:3307 -j RETURN")
        encoded = nft_rule.encode_rule_tokens(spec, V4)
        info = bytes.fromhex("0104bb012b19ea0ceb0c") + bytes(22) + b"\0\0\x01" + bytes(13)
        expected = (
            nft_expr.Meta(16),
            nft_expr.Cmp(0, b"\x06"),
            nft_expr.XtMatch("multiport", 1, info),
        )
        assert typed(encoded.exprs) == typed(
            (*expected, nft_expr.Counter(), nft_expr.Immediate(-5))
        )
        assert (encoded.compat_proto, encoded.compat_invert) == (6, False)

    def test_redirect_ipv4(self) -> None:
        """REDIRECT rev 0 on ip: nf_nat_ipv4_multi_range_compat, ports big-endian."""
        encoded = nft_rule.encode_rule_tokens(tokens("-p tcp -j REDIRECT --to-ports 4140"), V4)
        info = bytes.fromhex("01000000020000000000000000000000102c102c00000000")
        assert encoded.exprs[-1] == nft_expr.XtTarget("REDIRECT", 0, info)

    def test_redirect_ipv6(self) -> None:
        """REDIRECT rev 0 on ip6: a 40-byte nf_nat_range."""
        encoded = nft_rule.encode_rule_tokens(tokens("-p tcp -j REDIRECT --to-ports 4140"), V6)
        info = bytes.fromhex("02000000") + bytes(32) + bytes.fromhex("102c102c")
        assert encoded.exprs[-1] == nft_expr.XtTarget("REDIRECT", 0, info)

    def test_subnets(self) -> None:
        """Byte-aligned prefixes load only their bytes; others add a bitwise mask."""
        assert nft_rule.encode_rule_tokens(tokens("-s 10.0.0.0/8 -j RETURN"), V4).exprs[:2] == (
            nft_expr.Payload(1, 12, 1),
            nft_expr.Cmp(0, b"\x0a"),
        )
        assert nft_rule.encode_rule_tokens(tokens("-s 10.16.0.0/12 -j RETURN"), V4).exprs[:3] == (
            nft_expr.Payload(1, 12, 4),
            nft_expr.Bitwise(bytes.fromhex("fff00000"), bytes(4)),
            nft_expr.Cmp(0, bytes.fromhex("0a100000")),
        )
        assert nft_rule.encode_rule_tokens(tokens("! -d ::1/128 -j RETURN"), V6).exprs[:2] == (
            nft_expr.Payload(1, 24, 16),
            nft_expr.Cmp(1, bytes(15) + b"\x01"),
        )

    def test_tcp_ports(self) -> None:
        """--dport is a transport payload; equal sport+dport share one 4-byte compare."""
        assert nft_rule.encode_rule_tokens(
            tokens("-p tcp -m tcp --dport 8080 -j RETURN"), V4
        ).exprs[2:4] == (nft_expr.Payload(2, 2, 2), nft_expr.Cmp(0, b"\x1f\x90"))
        pair = nft_rule.encode_rule_tokens(
            tokens("-p tcp -m tcp --sport 1 --dport 2 -j ACCEPT"), V4
        )
        assert pair.exprs[2:4] == (
            nft_expr.Payload(2, 0, 4),
            nft_expr.Cmp(0, bytes.fromhex("00010002")),
        )
        ranged = nft_rule.encode_rule_tokens(tokens("-p tcp -m tcp --dport 2:65535 -j ACCEPT"), V4)
        assert ranged.exprs[3] == nft_expr.Range(0, b"\x00\x02", b"\xff\xff")

    def test_jump_and_goto(self) -> None:
        """-j CHAIN is an immediate jump, -g CHAIN a goto, both naming the chain."""
        jump = nft_rule.encode_rule_tokens(tokens("-j X"), V4).exprs
        assert typed(jump) == typed((nft_expr.Counter(), nft_expr.Immediate(-3, "X")))
        assert nft_rule.encode_rule_tokens(tokens("-g X"), V4).exprs[-1] == nft_expr.Immediate(
            -4, "X"
        )

    def test_expression_bytes(self) -> None:
        """The netlink form of an immediate jump, byte for byte as traced from iptables-nft."""
        assert nft_expr.encode_expr(nft_expr.Immediate(-3, "PROXY_INIT_OUTPUT")) == bytes.fromhex(
            "48000180"  # list element
            "0e000100696d6d656469617465000000"  # NFTA_EXPR_NAME "immediate"
            "34000280"  # NFTA_EXPR_DATA
            "0800010000000000"  # dreg 0 (verdict)
            "28000280"
            "24000280"  # NFTA_IMMEDIATE_DATA / NFTA_DATA_VERDICT
            "08000100fffffffd"  # NFTA_VERDICT_CODE NFT_JUMP
            "1600020050524f58595f494e49545f4f5554505554000000"  # NFTA_VERDICT_CHAIN
        )


class TestCanonicalForms:
    @pytest.mark.parametrize("path", SAVE_FILES, ids=lambda p: p.name)
    def test_fixture_rules_round_trip(self, path: Path) -> None:
        """Every fixture rule parses, encodes, decodes and prints back to itself."""
        for rule in save_rules(path):
            encoded = nft_rule.encode_rule_tokens(rule.spec, family_of(path))
            wire = b"".join(nft_expr.encode_expr(e) for e in encoded.exprs)
            assert (
                nft_rule.decode_rule_tokens(nft_expr.decode_exprs(wire), family_of(path))
                == rule.spec
            )

    def test_p_all_is_accepted_and_vanishes(self) -> None:
        """-p all matches everything: accepted, and printed as nothing (as iptables-save does)."""
        spec = tokens("-p all -s 10.0.0.0/8 -j RETURN")
        exprs = nft_rule.encode_rule_tokens(spec, V4).exprs
        assert nft_rule.decode_rule_tokens(exprs, V4) == tokens("-s 10.0.0.0/8 -j RETURN")

    @pytest.mark.parametrize(
        ("spec", "printed"),
        [
            ("-j RETURN -p tcp", "-p tcp -j RETURN"),
            ("-p tcp -j REDIRECT --to-port 1", None),
            ("-p tcp --dport 1 -j RETURN", None),
            ("-o lo ! -d 127.0.0.1 -j RETURN", "! -d 127.0.0.1/32 -o lo -j RETURN"),
            ("-s 10.1.2.3/8 -j RETURN", "-s 10.0.0.0/8 -j RETURN"),
            ("-m multiport --dports 1 -p tcp -j RETURN", None),
        ],
    )
    def test_non_canonical_is_refused(self, spec: str, printed: str | None) -> None:
        """Tokens iptables-save would print differently are refused, naming the fix."""
        with pytest.raises(FirewallError) as err:
            nft_rule.encode_rule_tokens(tokens(spec), V4)
        if printed is not None:
            assert f"would be saved as {printed!r}" in err.value.message

    def test_upstream_error_messages(self) -> None:
        """The two upstream failure cases fail with iptables' own words."""
        with pytest.raises(FirewallError, match="invalid port/service `' specified"):
            nft_rule.encode_rule_tokens(("-p", "tcp", "-m", "multiport", "--dports", ""), V4)
        with pytest.raises(FirewallError, match=r"host/network `10\.0\.0\.0' not found"):
            nft_rule.encode_rule_tokens(tokens("-s 10.0.0.0/8 -j RETURN"), V6)

    def test_limits(self) -> None:
        """Over 15 multiport slots, a 256-byte comment and a 16-byte ifname are refused."""
        ports = ",".join(f"{p}:{p + 1}" for p in range(100, 116, 2))
        with pytest.raises(FirewallError, match="too many ports"):
            nft_rule.encode_rule_tokens(
                tokens(f"-p tcp -m multiport --dports {ports} -j RETURN"), V4
            )
        with pytest.raises(FirewallError, match="COMMENT"):
            nft_rule.encode_rule_tokens(("-m", "comment", "--comment", "x" * 256), V4)
        with pytest.raises(FirewallError, match="NUL"):
            nft_rule.encode_rule_tokens(("-m", "comment", "--comment", "a\0b"), V4)
        with pytest.raises(FirewallError, match="interface"):
            nft_rule.encode_rule_tokens(("-o", "x" * 16, "-j", "RETURN"), V4)


class TestStrictDecoding:
    def test_unknown_expression_is_named(self) -> None:
        """An expression iptables-nft would not write fails naming it, never a wrong rule."""
        elem = nl.nested(
            nl.NFTA_LIST_ELEM, nl.attr_str(nl.NFTA_EXPR_NAME, "ct"), nl.nested(nl.NFTA_EXPR_DATA)
        )
        with pytest.raises(FirewallError, match="unsupported expression ct"):
            nft_rule.decode_rule_tokens((*nft_expr.decode_exprs(elem), nft_expr.Immediate(-5)), V4)

    def test_unknown_match_is_named(self) -> None:
        """An xt match outside the supported set fails naming match and revision."""
        with pytest.raises(FirewallError, match="unsupported match mark revision 1"):
            nft_rule.decode_rule_tokens((nft_expr.XtMatch("mark", 1, bytes(8)),), V4)

    def test_non_contiguous_mask(self) -> None:
        """A mask iptables-save would print in dotted form is refused."""
        exprs = (nft_expr.Payload(1, 12, 4), nft_expr.Bitwise(bytes.fromhex("ff00ff00"), bytes(4)))
        with pytest.raises(FirewallError, match="non-contiguous"):
            nft_rule.decode_rule_tokens((*exprs, nft_expr.Cmp(0, bytes(4))), V4)

    def test_register_mismatch(self) -> None:
        """A compare on another register than the load is not an iptables match."""
        with pytest.raises(FirewallError, match="register"):
            nft_rule.decode_rule_tokens((nft_expr.Meta(7, 1), nft_expr.Cmp(0, b"lo\0", 2)), V4)

    def test_merged_port_checks(self) -> None:
        """Port checks anywhere in the rule merge into one -m tcp, as iptables-nft-save does."""
        exprs = nft_rule.encode_rule_tokens(tokens("-p tcp -m tcp --dport 2 -j ACCEPT"), V4).exprs
        extra = (nft_expr.Payload(2, 0, 2), nft_expr.Cmp(0, b"\x00\x01"))
        assert nft_rule.decode_rule_tokens((*exprs[:4], *extra, *exprs[4:]), V4) == tokens(
            "-p tcp -m tcp --sport 1 --dport 2 -j ACCEPT"
        )


# ------------------------------------------------------------------ property: spec round trip


class TestProperties:
    @settings(max_examples=25, deadline=None)
    @given(rule_specs())
    def test_spec_round_trips_through_the_wire(
        self, case: tuple[Family, nft_spec.RuleSpec]
    ) -> None:
        """tokens -> spec -> expressions -> bytes -> expressions -> spec -> tokens is identity."""
        family, spec = case
        printed = nft_spec.render_spec_tokens(spec)
        assert nft_spec.canonical_spec(printed, family) == spec
        encoded = nft_rule.encode_spec(spec, family)
        wire = b"".join(nft_expr.encode_expr(e) for e in encoded.exprs)
        assert typed(nft_expr.decode_exprs(wire)) == typed(encoded.exprs)
        assert nft_rule.decode_spec(nft_expr.decode_exprs(wire), family) == spec

    @settings(max_examples=50, deadline=None)
    @given(rule_specs())
    def test_the_authoritative_reader_agrees(self, case: tuple[Family, nft_spec.RuleSpec]) -> None:
        """Every rule the codec accepts, `canonical` (the reader every comparison uses) reads
        with the same meaning: each option owned by a known match or target, the same
        matches, target and base options (docs/architecture.md on the two parsers)."""
        _, spec = case
        key = canonical(nft_spec.render_spec_tokens(spec))
        assert "" not in [m.module for m in key.matches]  # nothing left unattributed
        modules = [
            m.proto if isinstance(m, nft_spec.PortMatch) else _MODULES[type(m)]
            for m in spec.matches
        ]
        assert sorted(m.module for m in key.matches) == sorted(modules)
        base = sorted((o.name, o.negated) for o in key.base)
        wanted = [
            (opt, part.invert)
            for opt, part in (
                ("-s", spec.source),
                ("-d", spec.destination),
                ("-i", spec.in_iface),
                ("-o", spec.out_iface),
                ("-p", spec.proto),
            )
            if part
        ]
        assert base == sorted(wanted)
        target = spec.target
        if target is None:
            assert key.verdict == ""
        elif isinstance(target, xt.Redirect):
            assert (key.verdict, key.target) == ("-j", "REDIRECT")
        elif isinstance(target, xt.Notrack):
            assert (key.verdict, key.target) == ("-j", "CT")
        else:
            assert (key.verdict, key.target) == ("-g" if target.goto else "-j", target.name)


_MODULES = {xt.Multiport: "multiport", xt.Owner: "owner", xt.Comment: "comment"}


# ------------------------------------------------------------------ messages


def _messages(data: bytes) -> list[nl.Message]:
    return [m for m in nl.parse_messages(data) if isinstance(m, nl.Message)]


class TestBatch:
    RULE = Rule("PROXY_INIT_OUTPUT", tokens("-o lo -j RETURN"))

    def change(self) -> TableChange:
        return TableChange("nat", ("PROXY_INIT_OUTPUT",), ("PROXY_INIT_REDIRECT",), (self.RULE,))

    def test_fresh_netns(self) -> None:
        """Empty netns: table, the base chain used, the chains to create/flush, then rules."""
        jump = Rule("OUTPUT", ("-j", "PROXY_INIT_OUTPUT"))
        change = TableChange("nat", ("PROXY_INIT_OUTPUT",), (), (self.RULE, jump))
        batch = nft_batch.build_batch(change, frozenset(), V4, genid=7, seq=100)
        msgs = _messages(batch.data)
        kinds = [m.msg_type & 0xFF for m in msgs]
        assert kinds == [0x10, 0, 3, 3, 6, 6, 0x11]
        begin = nl.attr_map(msgs[0].body)
        assert nl.u32(begin[nl.NFNL_BATCH_GENID]) == 7
        assert [m.seq for m in msgs] == list(range(100, 107))
        base = nft_dump.parse_chain(msgs[2])
        assert (base.name, base.hook, base.priority, base.policy, base.kind) == (
            "OUTPUT",
            3,
            -100,
            1,
            "nat",
        )
        assert batch.requests[104] == "-A PROXY_INIT_OUTPUT -o lo -j RETURN"
        assert all(m.flags & nl.NLM_F_ACK for m in msgs[1:-1])

    def test_existing_chains(self) -> None:
        """Existing base chains are left alone; an existing chain to flush is flushed."""
        existing = frozenset({"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"})
        existing |= {"PROXY_INIT_OUTPUT", "PROXY_INIT_REDIRECT"}
        ops = nft_batch.plan_batch_ops(self.change(), existing, V4)
        assert [(op[0], op[3]) for op in ops] == [
            (nl.NFT_MSG_NEWTABLE, "table nat"),
            (nl.NFT_MSG_DELRULE, "-F PROXY_INIT_REDIRECT"),
            (nl.NFT_MSG_NEWRULE, "-A PROXY_INIT_OUTPUT -o lo -j RETURN"),
        ]
        flush = nl.attr_map(ops[1][2])
        assert flush == {nl.NFTA_RULE_TABLE: b"nat\0", nl.NFTA_RULE_CHAIN: b"PROXY_INIT_REDIRECT\0"}

    def test_rule_message_round_trips(self) -> None:
        """A NEWRULE message parses back to its table, chain and expressions."""
        batch = nft_batch.build_batch(self.change(), frozenset(), V4, genid=0, seq=1)
        rule = nft_dump.parse_rule(_messages(batch.data)[-2])
        assert (rule.table, rule.chain) == ("nat", "PROXY_INIT_OUTPUT")
        assert nft_rule.decode_rule_tokens(rule.exprs, V4) == self.RULE.spec

    def test_other_tables_are_refused(self) -> None:
        """Only tables whose base chains we know can be created."""
        with pytest.raises(FirewallError, match="cannot create table mangle"):
            nft_batch.plan_batch_ops(TableChange("mangle", (), (), ()), frozenset(), V4)


class TestReplies:
    def test_error_with_extack(self) -> None:
        """An NLMSG_ERROR yields errno, the request's seq and the kernel's message."""
        orig = struct.pack("=IHHII", 20, 0x0A06, 5, 42, 0)
        tlv = nl.attr(nl.NLMSGERR_ATTR_MSG, b"Chain not found\0")
        body = struct.pack("=i", -2) + orig + tlv
        msg = struct.pack("=IHHII", 16 + len(body), nl.NLMSG_ERROR, 0x300, 42, 0) + body
        (err,) = nl.parse_messages(msg)
        assert err == nl.NetlinkError(2, 42, "Chain not found")
        assert isinstance(err, nl.NetlinkError)
        assert err.name == "ENOENT"

    def test_build_table_orders_and_names(self) -> None:
        """Chains in save order; rules grouped by chain; decode errors name chain and handle."""
        chains = [
            nft_dump.ChainInfo("nat", "Z"),
            nft_dump.ChainInfo("nat", "OUTPUT", hook=3, priority=-100, policy=0, kind="nat"),
            nft_dump.ChainInfo("filter", "INPUT", hook=1, policy=0),
        ]
        rules = [
            nft_dump.RuleInfo("nat", "Z", 4, (nft_expr.Counter(), nft_expr.Immediate(-5))),
            nft_dump.RuleInfo(
                "nat", "OUTPUT", 5, (nft_expr.Counter(), nft_expr.Immediate(-3, "Z"))
            ),
        ]
        table = nft_dump.build_table("nat", chains, rules, V4)
        assert [(ch.name, ch.policy) for ch in table.chains] == [
            ("PREROUTING", "ACCEPT"),  # absent built-ins are listed, as iptables-nft-save does
            ("INPUT", "ACCEPT"),
            ("OUTPUT", "DROP"),
            ("POSTROUTING", "ACCEPT"),
            ("Z", None),
        ]
        assert [r.chain for r in table.rules] == ["OUTPUT", "Z"]
        bad = [nft_dump.RuleInfo("nat", "Z", 9, (nft_expr.Unknown("lookup"),))]
        with pytest.raises(FirewallError, match=r"lookup.*chain Z, rule handle 9"):
            nft_dump.build_table("nat", chains, bad, V4)

    @pytest.mark.parametrize(
        "chain",
        [
            nft_dump.ChainInfo("nat", "OUTPUT", hook=3, priority=0, kind="nat"),
            nft_dump.ChainInfo("nat", "sneaky", hook=0, priority=-100, kind="nat"),
            nft_dump.ChainInfo("nat", "PREROUTING"),
        ],
        ids=["wrong-priority", "extra-base-chain", "builtin-name-unhooked"],
    )
    def test_foreign_base_chains_fail(self, chain: nft_dump.ChainInfo) -> None:
        """A base chain iptables-nft would not create fails the dump, naming it."""
        with pytest.raises(FirewallError, match=f"holds chain {chain.name} "):
            nft_dump.build_table("nat", [chain], [], V4)

    def test_userdata_comment(self) -> None:
        """nft's rule comment (userdata TLV 0) prints as the last comment match."""
        udata = bytes([0, 9]) + b"hi there\0"
        body = nl.attr_str(nl.NFTA_RULE_TABLE, "nat") + nl.attr_str(nl.NFTA_RULE_CHAIN, "X")
        body += nl.nested(nl.NFTA_RULE_EXPRESSIONS, nft_expr.encode_expr(nft_expr.Immediate(-5)))
        body += nl.attr(nl.NFTA_RULE_USERDATA, udata)
        info = nft_dump.parse_rule(nl.Message(0, 0, 0, 2, body))
        assert info.comment == "hi there"
        table = nft_dump.build_table("nat", [nft_dump.ChainInfo("nat", "X")], [info], V4)
        assert table.rules == (
            Rule("X", ("-m", "comment", "--comment", "hi there", "-j", "RETURN")),
        )

    def test_nul_padded_interface(self) -> None:
        """nft pads interface names with NULs to 16 bytes; still an exact name."""
        exprs = (nft_expr.Meta(7), nft_expr.Cmp(0, b"lo".ljust(16, b"\0")), nft_expr.Immediate(-5))
        assert nft_rule.decode_rule_tokens(exprs, V4) == ("-o", "lo", "-j", "RETURN")
        with pytest.raises(FirewallError, match="interface name"):
            nft_rule.decode_rule_tokens(
                (nft_expr.Meta(7), nft_expr.Cmp(0, b"l\0o\0"), nft_expr.Immediate(-5)), V4
            )


class TestAddressText:
    @settings(max_examples=50, deadline=None)
    @given(st.lists(st.sampled_from([0, 0, 1, 0xFFFF, 0x1234]), min_size=8, max_size=8))
    def test_ipv6_like_glibc(self, words: list[int]) -> None:
        """IPv6 addresses print as glibc's inet_ntop prints them (iptables uses it)."""
        addr = ipaddress.IPv6Address(struct.pack(">8H", *words))
        assert format_ipv6(addr) == socket.inet_ntop(socket.AF_INET6, addr.packed)

    def test_embedded_ipv4_round_trips(self) -> None:
        """::4:0/110 prints (and parses back) as ::0.4.0.0/110, as ip6tables-save has it."""
        spec = ("-s", "::0.4.0.0/110", "-j", "RETURN")
        assert nft_rule.decode_rule_tokens(nft_rule.encode_rule_tokens(spec, V6).exprs, V6) == spec


@pytest.mark.parametrize("rev", [1, 2])
def test_ct_notrack_is_read_never_written(rev: int) -> None:
    """CT with XT_CT_NOTRACK (iptables-nft's form of `-j NOTRACK` and `-j CT --notrack`,
    xt_ct_target_info_v1: flags, zone, events, helper, timeout) reads as `-j CT --notrack`
    for the raw table's judgement; CT without it (a zone, a helper) stays undecodable, and
    the codec never writes it."""
    info = struct.pack("<HHII16s32sQ", 1, 0, 0, 0, b"", b"", 0)
    target = xt.decode_target(nft_expr.XtTarget("CT", rev, info), Family.IPV4)
    assert nft_spec.render_spec_tokens(nft_spec.RuleSpec(target=target)) == (
        "-j",
        "CT",
        "--notrack",
    )
    zone = struct.pack("<HHII16s32sQ", 0, 1, 0, 0, b"", b"", 0)
    with pytest.raises(FirewallError, match="unsupported target CT"):
        xt.decode_target(nft_expr.XtTarget("CT", rev, zone), Family.IPV4)
    with pytest.raises(FirewallError, match="never writes"):
        nft_rule._target_expr(target, Family.IPV4)
