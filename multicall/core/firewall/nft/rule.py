"""A `RuleSpec` <-> nf_tables expressions: iptables-nft's encoder (nft_ipv4_add /
nft_ipv6_add) and its decoder (nft_rule_to_iptables_command_state)."""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Sequence
from typing import NamedTuple

from multicall.core.firewall.model import Family
from multicall.core.firewall.nft import xt
from multicall.core.firewall.nft.expr import (
    NFT_CMP_EQ,
    NFT_CMP_NEQ,
    NFT_GOTO,
    NFT_JUMP,
    NFT_META_IIFNAME,
    NFT_META_L4PROTO,
    NFT_META_OIFNAME,
    NFT_PAYLOAD_NETWORK_HEADER,
    NFT_PAYLOAD_TRANSPORT_HEADER,
    NFT_RANGE_EQ,
    NFT_RANGE_NEQ,
    NFT_REG_VERDICT,
    VERDICT_CODES,
    VERDICT_NAMES,
    Bitwise,
    Cmp,
    Counter,
    Expr,
    Immediate,
    Meta,
    Payload,
    Range,
    Unknown,
    XtMatch,
    XtTarget,
    text_of,
    undecodable,
)
from multicall.core.firewall.nft.rulespec import (
    IFNAMSIZ,
    PROTO_NAMES,
    Address,
    Iface,
    MatchSpec,
    PortMatch,
    Proto,
    RuleSpec,
    TargetSpec,
    Verdict,
    assemble,
    canonical_spec,
    proto_name,
    render_spec_tokens,
)
from multicall.core.firewall.nft.xt import Comment, Multiport, Notrack, Owner, Redirect
from multicall.core.firewall.ports import PortRange
from multicall.errors import FirewallError

# --- RuleSpec -> expressions (iptables-nft's nft_ipv4_add / nft_ipv6_add) ----------------------

_ADDR_OFFSETS = {Family.IPV4: (12, 16, 4), Family.IPV6: (8, 24, 16)}


class EncodedRule(NamedTuple):
    exprs: tuple[Expr, ...]
    compat_proto: int = 0
    compat_invert: bool = False


def encode_spec(spec: RuleSpec, family: Family) -> EncodedRule:
    exprs: list[Expr] = []
    for key, iface in ((NFT_META_IIFNAME, spec.in_iface), (NFT_META_OIFNAME, spec.out_iface)):
        if iface is not None:
            exprs += _iface_exprs(key, iface)
    if spec.proto is not None:
        exprs += [Meta(NFT_META_L4PROTO), Cmp(_op(spec.proto.invert), bytes([spec.proto.number]))]
    src_off, dst_off, _ = _ADDR_OFFSETS[family]
    for offset, address in ((src_off, spec.source), (dst_off, spec.destination)):
        if address is not None:
            exprs += _address_exprs(offset, address, family)
    for match in spec.matches:
        exprs += _match_exprs(match, family)
    exprs.append(Counter())
    if spec.target is not None:
        exprs.append(_target_expr(spec.target, family))
    proto = spec.proto or Proto(0)
    return EncodedRule(tuple(exprs), proto.number, proto.invert)


def _op(invert: bool) -> int:
    return NFT_CMP_NEQ if invert else NFT_CMP_EQ


def _iface_exprs(key: int, iface: Iface) -> list[Expr]:
    raw = iface.name.encode()
    data = raw[:-1] if raw.endswith(b"+") else raw + b"\0"
    return [Meta(key), Cmp(_op(iface.invert), data)]


def _address_exprs(offset: int, address: Address, family: Family) -> list[Expr]:
    net = address.network
    if (net.version == 4) != (family is Family.IPV4):
        raise FirewallError(f"host/network `{net.network_address}' not found")
    if net.prefixlen == 0:
        raise FirewallError(f"a /0 network matches everything: {net}")
    addr, mask = net.network_address.packed, net.netmask.packed
    if net.prefixlen % 8 == 0:
        length = net.prefixlen // 8
        return [
            Payload(NFT_PAYLOAD_NETWORK_HEADER, offset, length),
            Cmp(_op(address.invert), addr[:length]),
        ]
    return [
        Payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len(addr)),
        Bitwise(mask, bytes(len(mask))),
        Cmp(_op(address.invert), addr),
    ]


def _match_exprs(match: MatchSpec, family: Family) -> list[Expr]:
    match match:
        case PortMatch():
            return _port_exprs(match)
        case Multiport() | Owner() | Comment():
            return [xt.encode_match(match)]
    raise FirewallError(f"cannot encode match {match!r}")


def _port_exprs(match: PortMatch) -> list[Expr]:
    s, d = match.sport, match.dport
    if s and d and s[0] == s[1] and d[0] == d[1] and match.sport_invert == match.dport_invert:
        data = struct.pack(">HH", s[0], d[0])
        return [Payload(NFT_PAYLOAD_TRANSPORT_HEADER, 0, 4), Cmp(_op(match.sport_invert), data)]
    out: list[Expr] = []
    for offset, rng, invert in ((0, s, match.sport_invert), (2, d, match.dport_invert)):
        if rng is None:
            continue
        out.append(Payload(NFT_PAYLOAD_TRANSPORT_HEADER, offset, 2))
        low, high = struct.pack(">H", rng[0]), struct.pack(">H", rng[1])
        out.append(Cmp(_op(invert), low) if low == high else Range(_op(invert), low, high))
    return out


def _target_expr(target: TargetSpec, family: Family) -> Expr:
    if isinstance(target, Redirect):
        return xt.encode_target(target, family)
    if isinstance(target, Notrack):
        raise FirewallError("the nft codec reads CT --notrack but never writes it")
    if target.name in VERDICT_CODES and not target.goto:
        return Immediate(VERDICT_CODES[target.name])
    return Immediate(NFT_GOTO if target.goto else NFT_JUMP, target.name)


# --- expressions -> RuleSpec (iptables-nft's nft_rule_to_iptables_command_state) ---------------


class _Decoder:
    __slots__ = ("basics", "exprs", "family", "matches", "pos", "target")

    def __init__(self, family: Family, exprs: tuple[Expr, ...]) -> None:
        self.family = family
        self.exprs = exprs
        self.pos = 0
        self.basics: dict[str, Address | Iface | Proto] = {}
        self.matches: list[MatchSpec] = []
        self.target: TargetSpec | None = None

    def take(self) -> Expr | None:
        self.pos += 1
        return self.exprs[self.pos - 1] if self.pos <= len(self.exprs) else None

    def fail(self, what: str) -> FirewallError:
        return undecodable(what)


def decode_spec(exprs: Sequence[Expr], family: Family, comment: str | None = None) -> RuleSpec:
    """The RuleSpec iptables-nft-save would print for these expressions.

    `comment` is a userdata comment (nft's `comment "..."`): iptables-nft-save prints it
    as a comment match after all others.
    """
    dec = _Decoder(family, tuple(exprs))
    while (expr := dec.take()) is not None:
        if dec.target is not None:
            raise dec.fail(f"expression {_expr_name(expr)} after the verdict")
        _decode_one(dec, expr)
    if comment is not None:
        dec.matches.append(Comment(comment))
    return assemble(dict(dec.basics), tuple(dec.matches), dec.target)


def _expr_name(expr: Expr) -> str:
    return expr.name if isinstance(expr, Unknown) else type(expr).__name__.lower()


def _decode_one(dec: _Decoder, expr: Expr) -> None:
    match expr:
        case Meta():
            _decode_meta_cmp(dec, expr)
        case Payload() if expr.base == NFT_PAYLOAD_NETWORK_HEADER:
            _decode_address(dec, expr)
        case Payload() if expr.base == NFT_PAYLOAD_TRANSPORT_HEADER:
            _decode_ports(dec, expr)
        case Counter():
            pass
        case XtMatch():
            dec.matches.append(xt.decode_match(expr))
        case Immediate():
            dec.target = _decode_verdict(expr, dec)
        case XtTarget():
            dec.target = xt.decode_target(expr, dec.family)
        case _:
            raise dec.fail(f"unsupported expression {_expr_name(expr)} ({expr!r})")


def _next_cmp(dec: _Decoder, after: str, reg: int) -> Cmp:
    nxt = dec.take()
    if not isinstance(nxt, Cmp) or nxt.op not in (NFT_CMP_EQ, NFT_CMP_NEQ) or nxt.sreg != reg:
        raise dec.fail(f"{after} not followed by an eq/neq cmp on its register (got {nxt!r})")
    return nxt


def _decode_meta_cmp(dec: _Decoder, meta: Meta) -> None:
    keys = {NFT_META_IIFNAME: "-i", NFT_META_OIFNAME: "-o", NFT_META_L4PROTO: "-p"}
    if meta.key not in keys:
        raise dec.fail(f"unsupported meta key {meta.key}")
    cmp = _next_cmp(dec, f"meta key {meta.key}", meta.dreg)
    opt, invert = keys[meta.key], cmp.op == NFT_CMP_NEQ
    if opt in dec.basics:
        raise dec.fail(f"two {opt} conditions")
    if opt == "-p":
        if len(cmp.data) != 1:
            raise dec.fail(f"l4proto compared with {len(cmp.data)} bytes")
        proto_name(cmp.data[0])
        dec.basics[opt] = Proto(cmp.data[0], invert)
        return
    dec.basics[opt] = Iface(_iface_name(dec, cmp.data), invert)


def _iface_name(dec: _Decoder, data: bytes) -> str:
    """A NUL-terminated (or NUL-padded, as nft writes it) name is exact; no NUL is a prefix."""
    head, nul, tail = data.partition(b"\0")
    name = head if nul else head + b"+"
    if tail.strip(b"\0") or head in (b"", b"+") or len(name) >= IFNAMSIZ:
        raise dec.fail(f"interface name {data!r}")
    return text_of(name)


def _decode_address(dec: _Decoder, payload: Payload) -> None:
    src_off, dst_off, size = _ADDR_OFFSETS[dec.family]
    opt = {src_off: "-s", dst_off: "-d"}.get(payload.offset)
    if opt is None or not 0 < payload.length <= size or opt in dec.basics:
        raise dec.fail(f"network header payload at offset {payload.offset}")
    nxt = dec.take()
    prefix = payload.length * 8
    if isinstance(nxt, Bitwise) and nxt.sreg == nxt.dreg == payload.dreg:
        prefix = _prefix_of(dec, nxt, payload.length)
        nxt = dec.take()
    if (
        not isinstance(nxt, Cmp)
        or nxt.op not in (NFT_CMP_EQ, NFT_CMP_NEQ)
        or (nxt.sreg != payload.dreg)
    ):
        raise dec.fail(f"address payload not followed by a cmp (got {nxt!r})")
    if len(nxt.data) != payload.length:
        raise dec.fail("address compared with the wrong length")
    raw = nxt.data.ljust(size, b"\0")
    ip = ipaddress.ip_address(raw)
    network = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
    if network.network_address != ip:
        raise dec.fail(f"address {ip} has bits outside its /{prefix} mask")
    dec.basics[opt] = Address(network, nxt.op == NFT_CMP_NEQ)


def _prefix_of(dec: _Decoder, bitwise: Bitwise, length: int) -> int:
    if len(bitwise.mask) != length or any(bitwise.xor):
        raise dec.fail("bitwise with xor or length mismatch on an address")
    bits = int.from_bytes(bitwise.mask, "big")
    prefix = bin(bits).count("1")
    if bits != ((1 << prefix) - 1) << (length * 8 - prefix):
        raise dec.fail(f"non-contiguous address mask {bitwise.mask.hex()}")
    return prefix


def _decode_ports(dec: _Decoder, payload: Payload) -> None:
    proto = dec.basics.get("-p")
    name = PROTO_NAMES.get(proto.number) if isinstance(proto, Proto) else None
    if name not in ("tcp", "udp") or (isinstance(proto, Proto) and proto.invert):
        raise dec.fail("transport header match without -p tcp/udp")
    current = _port_match(dec, str(name))
    if (payload.offset, payload.length) == (0, 4):
        cmp = _next_cmp(dec, "port pair payload", payload.dreg)
        sport, dport = struct.unpack(">HH", cmp.data)
        inv = cmp.op == NFT_CMP_NEQ
        _store_ports(dec, current, "sport", PortRange(sport, sport), inv)
        _store_ports(dec, current, "dport", PortRange(dport, dport), inv)
        return
    if payload.length != 2 or payload.offset not in (0, 2):
        raise dec.fail(f"transport header payload at offset {payload.offset}")
    rng, inv = _port_condition(dec, payload.dreg)
    _store_ports(dec, current, "sport" if payload.offset == 0 else "dport", rng, inv)


def _port_condition(dec: _Decoder, reg: int) -> tuple[PortRange, bool]:
    nxt = dec.take()
    if isinstance(nxt, Cmp) and nxt.op in (NFT_CMP_EQ, NFT_CMP_NEQ) and len(nxt.data) == 2:
        if nxt.sreg != reg:
            raise dec.fail("port compared on another register")
        port = int.from_bytes(nxt.data, "big")
        return PortRange(port, port), nxt.op == NFT_CMP_NEQ
    if isinstance(nxt, Range) and nxt.op in (NFT_RANGE_EQ, NFT_RANGE_NEQ) and nxt.sreg == reg:
        low, high = int.from_bytes(nxt.low, "big"), int.from_bytes(nxt.high, "big")
        return PortRange(low, high), nxt.op == NFT_RANGE_NEQ
    raise dec.fail(f"port payload not followed by a cmp/range (got {nxt!r})")


def _port_match(dec: _Decoder, name: str) -> int:
    """Index of the rule's one tcp/udp match; iptables-nft merges all port checks into it."""
    for i, match in enumerate(dec.matches):
        if isinstance(match, PortMatch):
            return i
    dec.matches.append(PortMatch(name))
    return len(dec.matches) - 1


def _store_ports(dec: _Decoder, index: int, which: str, rng: PortRange, invert: bool) -> None:
    current = dec.matches[index]
    assert isinstance(current, PortMatch)
    if getattr(current, which) is not None:
        raise dec.fail(f"two --{which} conditions")
    if which == "sport":
        updated = PortMatch(current.proto, rng, invert, current.dport, current.dport_invert)
    else:
        updated = PortMatch(current.proto, current.sport, current.sport_invert, rng, invert)
    dec.matches[index] = updated


def _decode_verdict(expr: Immediate, dec: _Decoder) -> Verdict:
    if expr.dreg != NFT_REG_VERDICT:
        raise dec.fail("immediate into a data register")
    if expr.code in (NFT_JUMP, NFT_GOTO) and expr.chain:
        return Verdict(expr.chain, goto=expr.code == NFT_GOTO)
    if expr.code in VERDICT_NAMES:
        return Verdict(VERDICT_NAMES[expr.code])
    raise dec.fail(f"verdict code {expr.code}")


# --- Whole rules -------------------------------------------------------------------------------


def encode_rule_tokens(tokens: Sequence[str], family: Family) -> EncodedRule:
    return encode_spec(canonical_spec(tokens, family), family)


def decode_rule_tokens(
    exprs: Sequence[Expr], family: Family, comment: str | None = None
) -> tuple[str, ...]:
    return render_spec_tokens(decode_spec(exprs, family, comment))
