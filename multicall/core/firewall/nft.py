"""nf_tables netlink messages for iptables rules, encoded the way iptables-nft 1.8.9 does.

Rules of this module:
1. Pure: bytes and dataclasses in, bytes and dataclasses out. The socket lives in
   `multicall.effects.firewall.nft`.
2. A rule goes three ways: canonical `iptables-save` tokens <-> `RuleSpec` <-> expressions
   <-> netlink attributes. Each step is a function pair and each pair round-trips, so
   `dump(apply(x)) == x` holds by construction and is tested against the real
   `iptables-nft-save`.
3. The encoding copies iptables-nft (xtables-compat), learned by tracing its sendmsg:
   interfaces, protocol, addresses and tcp/udp ports are native `meta`/`payload`/`cmp`/
   `bitwise`/`range` expressions on register 1; multiport, owner and comment are `match`
   expressions carrying the xt structs; REDIRECT is a `target` expression; verdicts are
   `immediate`; a `counter` sits before the verdict; the rule carries NFTA_RULE_COMPAT.
4. Decoding is strict: an expression or option outside what is listed here raises
   `FirewallError` naming it. A rule we cannot print exactly is never printed wrongly.
5. Integers inside nf_tables attributes are big-endian; xt structs are host-endian
   (little-endian on every platform cnibox ships for), as the kernel reads them.
6. Values are `NamedTuple`s, not frozen dataclasses: this module defines about thirty of them
   and a frozen dataclass costs milliseconds of import time each. They are immutable and
   slotted all the same; equality is by value, so tests that care compare types too.
"""

from __future__ import annotations

import errno as errno_mod
import ipaddress
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

from multicall.core.firewall.model import Family, TableChange
from multicall.core.firewall.ruleset import (
    Chain,
    Counters,
    Rule,
    Table,
    format_network,
    render_rule,
    save_order,
)
from multicall.errors import FirewallError

# --- netlink / nfnetlink -------------------------------------------------------------------
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_CREATE = 0x400
NLM_F_APPEND = 0x800
NLM_F_CAPPED = 0x100
NLM_F_ACK_TLVS = 0x200
NLMSGERR_ATTR_MSG = 1
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFNL_BATCH_GENID = 1
NFNL_SUBSYS_NFTABLES = 10
_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct(">BBH")
_NLA = struct.Struct("=HH")
HEADER_LEN = _NLMSGHDR.size + _NFGENMSG.size

# --- nf_tables message types and attributes -------------------------------------------------
NFT_MSG_NEWTABLE = 0
NFT_MSG_NEWCHAIN = 3
NFT_MSG_GETCHAIN = 4
NFT_MSG_NEWRULE = 6
NFT_MSG_GETRULE = 7
NFT_MSG_DELRULE = 8
NFT_MSG_NEWGEN = 15
NFT_MSG_GETGEN = 16
NFTA_TABLE_NAME = 1
NFTA_CHAIN_TABLE = 1
NFTA_CHAIN_NAME = 3
NFTA_CHAIN_HOOK = 4
NFTA_CHAIN_POLICY = 5
NFTA_CHAIN_TYPE = 7
NFTA_CHAIN_COUNTERS = 8
NFTA_HOOK_HOOKNUM = 1
NFTA_HOOK_PRIORITY = 2
NFTA_COUNTER_BYTES = 1
NFTA_COUNTER_PACKETS = 2
NFTA_RULE_TABLE = 1
NFTA_RULE_CHAIN = 2
NFTA_RULE_HANDLE = 3
NFTA_RULE_EXPRESSIONS = 4
NFTA_RULE_COMPAT = 5
NFTA_RULE_USERDATA = 7
NFTNL_UDATA_RULE_COMMENT = 0
NFTA_RULE_COMPAT_PROTO = 1
NFTA_RULE_COMPAT_FLAGS = 2
NFT_RULE_COMPAT_F_INV = 1 << 1
NFTA_LIST_ELEM = 1
NFTA_EXPR_NAME = 1
NFTA_EXPR_DATA = 2
NFTA_DATA_VALUE = 1
NFTA_DATA_VERDICT = 2
NFTA_VERDICT_CODE = 1
NFTA_VERDICT_CHAIN = 2
NFTA_GEN_ID = 1

NFT_REG_VERDICT = 0
NFT_REG_1 = 1
NFT_PAYLOAD_NETWORK_HEADER = 1
NFT_PAYLOAD_TRANSPORT_HEADER = 2
NFT_META_IIFNAME = 6
NFT_META_OIFNAME = 7
NFT_META_L4PROTO = 16
NFT_CMP_EQ = 0
NFT_CMP_NEQ = 1
NFT_RANGE_EQ = 0
NFT_RANGE_NEQ = 1

NF_DROP = 0
NF_ACCEPT = 1
NFT_JUMP = -3
NFT_GOTO = -4
NFT_RETURN = -5
VERDICT_NAMES = {NF_DROP: "DROP", NF_ACCEPT: "ACCEPT", NFT_RETURN: "RETURN"}
VERDICT_CODES = {name: code for code, name in VERDICT_NAMES.items()}

NFPROTO = {Family.IPV4: 2, Family.IPV6: 10}
NF_POLICY = {0: "DROP", 1: "ACCEPT"}

# Base chains iptables-nft creates per table: (name, hook number, priority, chain type).
BASE_CHAINS: dict[str, tuple[tuple[str, int, int, str], ...]] = {
    "nat": (
        ("PREROUTING", 0, -100, "nat"),
        ("INPUT", 1, 100, "nat"),
        ("OUTPUT", 3, -100, "nat"),
        ("POSTROUTING", 4, 100, "nat"),
    ),
    "filter": (("INPUT", 1, 0, "filter"), ("FORWARD", 2, 0, "filter"), ("OUTPUT", 3, 0, "filter")),
    "mangle": (
        ("PREROUTING", 0, -150, "filter"),
        ("INPUT", 1, -150, "filter"),
        ("FORWARD", 2, -150, "filter"),
        ("OUTPUT", 3, -150, "route"),
        ("POSTROUTING", 4, -150, "filter"),
    ),
    "raw": (("PREROUTING", 0, -300, "filter"), ("OUTPUT", 3, -300, "filter")),
}
# Tables `apply` may create; the others are only read (their layout checked on dump).
WRITABLE_TABLES = frozenset({"nat"})

# Protocol names as Debian's iptables-save prints them (/etc/protocols spelling).
PROTO_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 58: "ipv6-icmp", 132: "sctp"}
PROTO_NUMBERS = {name: num for num, name in PROTO_NAMES.items()} | {"icmpv6": 58}

# xt structs (linux/netfilter/*.h), host-endian, sizes already XT_ALIGNed.
COMMENT_LEN = 256
MULTIPORT_MAX = 15
_MULTIPORT_V1 = struct.Struct(f"<BB{MULTIPORT_MAX}H{MULTIPORT_MAX}BB")  # 48 bytes
_OWNER = struct.Struct("<IIIIBB6x")  # 18 bytes + XT_ALIGN padding = 24
_NAT_IPV4_MULTI_RANGE = struct.Struct("<II4s4s2s2s4x")  # 20 + XT_ALIGN padding
_NAT_RANGE = struct.Struct("<I16s16s2s2s")  # nf_nat_range, 40 bytes
MULTIPORT_FLAGS = {"--sports": 0, "--dports": 1, "--ports": 2}
XT_OWNER_UID = 1
XT_OWNER_GID = 2
XT_OWNER_SOCKET = 4
NF_NAT_RANGE_PROTO_SPECIFIED = 2
NF_NAT_RANGE_PROTO_RANDOM = 4
IFNAMSIZ = 16


# ============================================================================================
# Expressions
# ============================================================================================


class Meta(NamedTuple):
    key: int
    dreg: int = NFT_REG_1


class Payload(NamedTuple):
    base: int
    offset: int
    length: int
    dreg: int = NFT_REG_1


class Cmp(NamedTuple):
    op: int
    data: bytes
    sreg: int = NFT_REG_1


class Bitwise(NamedTuple):
    mask: bytes
    xor: bytes
    sreg: int = NFT_REG_1
    dreg: int = NFT_REG_1


class Range(NamedTuple):
    op: int
    low: bytes
    high: bytes
    sreg: int = NFT_REG_1


class Counter(NamedTuple):
    packets: int = 0
    bytes: int = 0


class Immediate(NamedTuple):
    """A verdict: NF_ACCEPT/NF_DROP/NFT_RETURN, or NFT_JUMP/NFT_GOTO with a chain."""

    code: int
    chain: str | None = None
    dreg: int = NFT_REG_VERDICT


class XtMatch(NamedTuple):
    name: str
    rev: int
    info: bytes


class XtTarget(NamedTuple):
    name: str
    rev: int
    info: bytes


class Unknown(NamedTuple):
    """An expression this codec does not speak; decoding a rule holding one fails."""

    name: str


Expr = Meta | Payload | Cmp | Bitwise | Range | Counter | Immediate | XtMatch | XtTarget | Unknown


# ============================================================================================
# Netlink attributes
# ============================================================================================


def attr(kind: int, payload: bytes) -> bytes:
    length = _NLA.size + len(payload)
    return _NLA.pack(length, kind) + payload + b"\0" * (-length % 4)


def nested(kind: int, *parts: bytes) -> bytes:
    return attr(kind | NLA_F_NESTED, b"".join(parts))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack(">I", value & 0xFFFFFFFF))


def attr_u64(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack(">Q", value))


def attr_str(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def iter_attrs(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type without flags, payload) for each attribute; stops at a truncated one."""
    pos = 0
    while pos + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, pos)
        if length < _NLA.size or pos + length > len(data):
            return
        yield kind & NLA_TYPE_MASK, data[pos + _NLA.size : pos + length]
        pos += (length + 3) & ~3


def attr_map(data: bytes) -> dict[int, bytes]:
    return dict(iter_attrs(data))


def u32(data: bytes) -> int:
    return int(struct.unpack(">I", data[:4])[0])


def s32(data: bytes) -> int:
    return int(struct.unpack(">i", data[:4])[0])


def u64(data: bytes) -> int:
    return int(struct.unpack(">Q", data[:8])[0])


def cstr(data: bytes) -> str:
    return data.split(b"\0", 1)[0].decode(errors="replace")


# --- expression <-> attributes ---------------------------------------------------------------


def _data_value(kind: int, value: bytes) -> bytes:
    return nested(kind, attr(NFTA_DATA_VALUE, value))


def _expr_data(expr: Expr) -> tuple[str, bytes]:  # noqa: PLR0911 - one arm per expression type
    match expr:
        case Meta(key, dreg):
            return "meta", attr_u32(2, key) + attr_u32(1, dreg)
        case Payload(base, offset, length, dreg):
            return "payload", attr_u32(1, dreg) + attr_u32(2, base) + attr_u32(3, offset) + (
                attr_u32(4, length)
            )
        case Cmp(op, data, sreg):
            return "cmp", attr_u32(1, sreg) + attr_u32(2, op) + _data_value(3, data)
        case Bitwise(mask, xor, sreg, dreg):
            head = attr_u32(1, sreg) + attr_u32(2, dreg) + attr_u32(3, len(mask))
            return "bitwise", head + _data_value(4, mask) + _data_value(5, xor)
        case Range(op, low, high, sreg):
            body = attr_u32(1, sreg) + attr_u32(2, op) + _data_value(3, low)
            return "range", body + _data_value(4, high)
        case Counter(packets, nbytes):
            return "counter", attr_u64(1, nbytes) + attr_u64(2, packets)
        case Immediate(code, chain, dreg):
            verdict = attr_u32(NFTA_VERDICT_CODE, code)
            if chain is not None:
                verdict += attr_str(NFTA_VERDICT_CHAIN, chain)
            return "immediate", attr_u32(1, dreg) + nested(2, nested(NFTA_DATA_VERDICT, verdict))
        case XtMatch(name, rev, info):
            return "match", attr_str(1, name) + attr_u32(2, rev) + attr(3, info)
        case XtTarget(name, rev, info):
            return "target", attr_str(1, name) + attr_u32(2, rev) + attr(3, info)
    raise FirewallError(f"cannot encode nf_tables expression {expr!r}")


def encode_expr(expr: Expr) -> bytes:
    name, data = _expr_data(expr)
    return nested(NFTA_LIST_ELEM, attr_str(NFTA_EXPR_NAME, name), nested(NFTA_EXPR_DATA, data))


def _value(data: bytes) -> bytes:
    return attr_map(data).get(NFTA_DATA_VALUE, b"")


def _decode_immediate(a: dict[int, bytes]) -> Expr:
    verdict = attr_map(attr_map(a.get(2, b"")).get(NFTA_DATA_VERDICT, b""))
    if NFTA_VERDICT_CODE not in verdict:
        return Unknown("immediate (data, not verdict)")
    chain = cstr(verdict[NFTA_VERDICT_CHAIN]) if NFTA_VERDICT_CHAIN in verdict else None
    return Immediate(s32(verdict[NFTA_VERDICT_CODE]), chain, u32(a.get(1, b"\0" * 4)))


def _decode_bitwise(a: dict[int, bytes]) -> Expr:
    if 6 in a and u32(a[6]) != 0:  # NFTA_BITWISE_OP other than mask-and-xor (shifts)
        return Unknown("bitwise (shift)")
    return Bitwise(_value(a.get(4, b"")), _value(a.get(5, b"")), u32(a[1]), u32(a[2]))


def _decode_payload(a: dict[int, bytes]) -> Expr:
    if 1 not in a or 5 in a:  # a payload write (mangling) has SREG instead of DREG
        return Unknown("payload (write)")
    return Payload(u32(a[2]), u32(a[3]), u32(a[4]), u32(a[1]))


def _decode_meta(a: dict[int, bytes]) -> Expr:
    return Meta(u32(a[2]), u32(a[1])) if 1 in a else Unknown("meta (set)")


def decode_expr(elem: bytes) -> Expr:  # noqa: PLR0911 - one arm per expression type
    outer = attr_map(elem)
    name = cstr(outer.get(NFTA_EXPR_NAME, b""))
    a = attr_map(outer.get(NFTA_EXPR_DATA, b""))
    try:
        match name:
            case "meta":
                return _decode_meta(a)
            case "payload":
                return _decode_payload(a)
            case "cmp":
                return Cmp(u32(a[2]), _value(a[3]), u32(a[1]))
            case "bitwise":
                return _decode_bitwise(a)
            case "range":
                return Range(u32(a[2]), _value(a[3]), _value(a[4]), u32(a[1]))
            case "counter":
                return Counter(u64(a.get(2, b"\0" * 8)), u64(a.get(1, b"\0" * 8)))
            case "immediate":
                return _decode_immediate(a)
            case "match":
                return XtMatch(cstr(a[1]), u32(a[2]), a.get(3, b""))
            case "target":
                return XtTarget(cstr(a[1]), u32(a[2]), a.get(3, b""))
    except (KeyError, struct.error):
        return Unknown(f"{name} (malformed)")
    return Unknown(name)


def decode_exprs(data: bytes) -> tuple[Expr, ...]:
    return tuple(decode_expr(elem) for kind, elem in iter_attrs(data) if kind == NFTA_LIST_ELEM)


# ============================================================================================
# RuleSpec: one rule as iptables sees it
# ============================================================================================


class Address(NamedTuple):
    network: ipaddress.IPv4Network | ipaddress.IPv6Network
    invert: bool = False


class Iface(NamedTuple):
    name: str  # "eth+" is the wildcard form
    invert: bool = False


class Proto(NamedTuple):
    number: int
    invert: bool = False


PortRange = tuple[int, int]


class PortMatch(NamedTuple):
    """`-m tcp` / `-m udp` with --sport/--dport (encoded natively by iptables-nft)."""

    proto: str
    sport: PortRange | None = None
    sport_invert: bool = False
    dport: PortRange | None = None
    dport_invert: bool = False


class Multiport(NamedTuple):
    option: str  # --sports / --dports / --ports
    ports: tuple[PortRange, ...]
    invert: bool = False


class Owner(NamedTuple):
    uid: PortRange | None = None  # (min, max) id range, reusing the pair type
    uid_invert: bool = False
    gid: PortRange | None = None
    gid_invert: bool = False
    socket_exists: bool = False
    socket_invert: bool = False


class Comment(NamedTuple):
    text: str


MatchSpec = PortMatch | Multiport | Owner | Comment


class Verdict(NamedTuple):
    """-j ACCEPT/DROP/RETURN, -j CHAIN (jump), -g CHAIN (goto)."""

    name: str
    goto: bool = False


class Redirect(NamedTuple):
    ports: PortRange | None = None
    random: bool = False


TargetSpec = Verdict | Redirect


class RuleSpec(NamedTuple):
    source: Address | None = None
    destination: Address | None = None
    in_iface: Iface | None = None
    out_iface: Iface | None = None
    proto: Proto | None = None
    matches: tuple[MatchSpec, ...] = ()
    target: TargetSpec | None = None


# --- tokens -> RuleSpec ----------------------------------------------------------------------


class _Tokens:
    __slots__ = ("items", "pos")

    def __init__(self, items: Sequence[str]) -> None:
        self.items = items
        self.pos = 0

    def peek(self) -> str | None:
        return self.items[self.pos] if self.pos < len(self.items) else None

    def take(self, what: str) -> str:
        if self.pos >= len(self.items):
            raise FirewallError(f"option {what} requires a value")
        self.pos += 1
        return self.items[self.pos - 1]

    def take_invert(self) -> bool:
        inv = False
        while self.peek() == "!":
            self.pos += 1
            inv = not inv
        return inv


def parse_spec(tokens: Sequence[str], family: Family) -> RuleSpec:
    """Parse a rule's tokens (after `-A CHAIN`); raises FirewallError on anything unsupported."""
    fields: dict[str, object] = {}
    matches: list[MatchSpec] = []
    target: TargetSpec | None = None
    toks = _Tokens(tokens)
    while (tok := toks.peek()) is not None:
        invert = toks.take_invert()
        tok = toks.take("rule")
        if tok in ("-s", "-d", "-i", "-o", "-p"):
            fields[tok] = _parse_basic(tok, toks.take(tok), invert, family)
        elif tok == "-m" and not invert:
            matches.append(_parse_match(toks.take("-m"), toks, fields.get("-p")))
        elif tok in ("-j", "-g") and not invert and target is None:
            target = _parse_target(tok, toks.take(tok), toks)
        else:
            raise FirewallError(f"unsupported rule option {'! ' if invert else ''}{tok}")
    return _assemble(fields, tuple(matches), target)


def _assemble(
    fields: Mapping[str, object], matches: tuple[MatchSpec, ...], target: TargetSpec | None
) -> RuleSpec:
    src, dst = fields.get("-s"), fields.get("-d")
    iin, iout, proto = fields.get("-i"), fields.get("-o"), fields.get("-p")
    return RuleSpec(
        source=src if isinstance(src, Address) else None,
        destination=dst if isinstance(dst, Address) else None,
        in_iface=iin if isinstance(iin, Iface) else None,
        out_iface=iout if isinstance(iout, Iface) else None,
        proto=proto if isinstance(proto, Proto) and proto.number else None,
        matches=matches,
        target=target,
    )


def _parse_basic(opt: str, value: str, invert: bool, family: Family) -> Address | Iface | Proto:
    if opt in ("-s", "-d"):
        return Address(parse_network(value, family), invert)
    if opt in ("-i", "-o"):
        if not value or value == "+" or len(value) >= IFNAMSIZ:
            raise FirewallError(f"invalid interface name `{value}'")
        return Iface(value, invert)
    return Proto(parse_proto(value), invert)


def parse_network(value: str, family: Family) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A CIDR (or bare host address) of the family, host bits cleared as iptables does."""
    cls = ipaddress.IPv4Network if family is Family.IPV4 else ipaddress.IPv6Network
    try:
        return cls(value, strict=False)
    except ValueError as exc:
        host = value.split("/", 1)[0]
        raise FirewallError(f"host/network `{host}' not found") from exc


def parse_proto(value: str) -> int:
    if value in ("all", "0"):
        return 0
    if value.isdigit() and 0 < int(value) < 256:
        return int(value)
    if value in PROTO_NUMBERS:
        return PROTO_NUMBERS[value]
    raise FirewallError(f'unknown protocol "{value}" specified')


def parse_port(text: str) -> int:
    if not text.isdigit() or int(text) > 0xFFFF:
        raise FirewallError(f"invalid port/service `{text}' specified")
    return int(text)


def parse_port_range(text: str) -> PortRange:
    low, sep, high = text.partition(":")
    first = parse_port(low) if low or not sep else 0
    last = (parse_port(high) if high else 0xFFFF) if sep else first
    if first > last:
        raise FirewallError(f"invalid portrange ({text}) specified")
    return (first, last)


def _option_block(toks: _Tokens) -> Iterator[tuple[str, bool]]:
    """Yield (option, inverted) until the next -m/-j/-g; values are taken by the caller."""
    while True:
        start = toks.pos
        invert = toks.take_invert()
        tok = toks.peek()
        if tok is None or tok in ("-m", "-j", "-g", "-s", "-d", "-i", "-o", "-p"):
            toks.pos = start  # the caller's loop re-reads any "!" with the option it negates
            return
        toks.pos += 1
        yield tok, invert


def _parse_match(name: str, toks: _Tokens, proto: object) -> MatchSpec:
    if name in ("tcp", "udp"):
        if not isinstance(proto, Proto) or proto.invert or PROTO_NAMES.get(proto.number) != name:
            raise FirewallError(f"-m {name} needs `-p {name}' before it")
        return _parse_ports(name, toks)
    if name == "multiport":
        return _parse_multiport(toks)
    if name == "owner":
        return _parse_owner(toks)
    if name == "comment":
        return _parse_comment(toks)
    raise FirewallError(f"unsupported match -m {name}")


def _parse_ports(name: str, toks: _Tokens) -> PortMatch:
    found: dict[str, tuple[PortRange, bool]] = {}
    for opt, invert in _option_block(toks):
        if opt not in ("--sport", "--dport") or opt in found:
            raise FirewallError(f"unsupported option {opt} for -m {name}")
        found[opt] = (parse_port_range(toks.take(opt)), invert)
    if not found:  # iptables-nft writes nothing for it, so it could never be read back
        raise FirewallError(f"-m {name} without --sport or --dport")
    sport, sinv = found.get("--sport", (None, False))
    dport, dinv = found.get("--dport", (None, False))
    return PortMatch(name, sport, sinv, dport, dinv)


def _parse_multiport(toks: _Tokens) -> Multiport:
    found: list[Multiport] = []
    for opt, invert in _option_block(toks):
        if opt not in MULTIPORT_FLAGS or found:
            raise FirewallError(f"unsupported option {opt} for -m multiport")
        items = toks.take(opt).split(",")
        ports = tuple(parse_port_range(item) for item in items)
        if sum(1 if lo == hi else 2 for lo, hi in ports) > MULTIPORT_MAX:
            raise FirewallError("too many ports specified")
        found.append(Multiport(opt, ports, invert))
    if not found:
        raise FirewallError("multiport needs one of --sports, --dports or --ports")
    return found[0]


def _parse_id_range(text: str) -> PortRange:
    low, sep, high = text.partition("-")
    if not low.isdigit() or (sep and not high.isdigit()):
        raise FirewallError(f'Bad owner id "{text}"')
    first, last = int(low), int(high) if sep else int(low)
    if last > 0xFFFFFFFE or first > last:
        raise FirewallError(f'Bad owner id "{text}"')
    return (first, last)


def _parse_owner(toks: _Tokens) -> Owner:
    ids: dict[str, tuple[PortRange, bool]] = {}
    socket: list[bool] = []
    for opt, invert in _option_block(toks):
        if opt in ("--uid-owner", "--gid-owner") and opt not in ids:
            ids[opt] = (_parse_id_range(toks.take(opt)), invert)
        elif opt == "--socket-exists" and not socket:
            socket.append(invert)
        else:
            raise FirewallError(f"unsupported option {opt} for -m owner")
    if not ids and not socket:
        raise FirewallError("owner: at least one of --uid-owner, --gid-owner, --socket-exists")
    uid, uinv = ids.get("--uid-owner", (None, False))
    gid, ginv = ids.get("--gid-owner", (None, False))
    return Owner(uid, uinv, gid, ginv, bool(socket), bool(socket and socket[0]))


def _parse_comment(toks: _Tokens) -> Comment:
    found: list[str] = []
    for opt, invert in _option_block(toks):
        if opt != "--comment" or invert or found:
            raise FirewallError(f"unsupported option {opt} for -m comment")
        found.append(toks.take(opt))
    if not found:
        raise FirewallError("comment: --comment is required")
    if len(found[0].encode()) >= COMMENT_LEN:
        raise FirewallError("COMMENT must be shorter than 256 characters")
    if "\0" in found[0]:  # the kernel would keep only the text before it
        raise FirewallError("a comment cannot contain a NUL character")
    return Comment(found[0])


def _parse_target(flag: str, name: str, toks: _Tokens) -> TargetSpec:
    if flag == "-j" and name == "REDIRECT":
        return _parse_redirect(toks)
    if not name or (flag == "-g" and name in VERDICT_CODES) or len(name) > 28:
        raise FirewallError(f"invalid target {flag} {name}")
    return Verdict(name, goto=flag == "-g")


def _parse_redirect(toks: _Tokens) -> Redirect:
    ports: PortRange | None = None
    random = False
    for opt, invert in _option_block(toks):
        if opt == "--to-ports" and ports is None and not invert:
            low, sep, high = toks.take(opt).partition("-")
            ports = (parse_port(low), parse_port(high) if sep else parse_port(low))
        elif opt == "--random" and not random and not invert:
            random = True
        else:
            raise FirewallError(f"unsupported option {opt} for -j REDIRECT")
    return Redirect(ports, random)


# --- RuleSpec -> tokens (what iptables-nft-save prints) --------------------------------------


def render_spec_tokens(spec: RuleSpec) -> tuple[str, ...]:
    out: list[str] = []
    for opt, address in (("-s", spec.source), ("-d", spec.destination)):
        if address is not None:
            out += [*_bang(address.invert), opt, format_network(address.network)]
    for opt, iface in (("-i", spec.in_iface), ("-o", spec.out_iface)):
        if iface is not None:
            out += [*_bang(iface.invert), opt, iface.name]
    if spec.proto is not None:
        out += [*_bang(spec.proto.invert), "-p", proto_name(spec.proto.number)]
    for match in spec.matches:
        out += _render_match(match)
    if spec.target is not None:
        out += _render_target(spec.target)
    return tuple(out)


def _bang(invert: bool) -> list[str]:
    return ["!"] if invert else []


def proto_name(number: int) -> str:
    if number not in PROTO_NAMES:
        raise FirewallError(f"protocol {number} is not supported by the nft codec")
    return PROTO_NAMES[number]


def _render_range(rng: PortRange, sep: str) -> str:
    return str(rng[0]) if rng[0] == rng[1] else f"{rng[0]}{sep}{rng[1]}"


def _render_match(match: MatchSpec) -> list[str]:
    match match:
        case PortMatch(proto, sport, sinv, dport, dinv):
            out = ["-m", proto]
            if sport is not None:
                out += [*_bang(sinv), "--sport", _render_range(sport, ":")]
            if dport is not None:
                out += [*_bang(dinv), "--dport", _render_range(dport, ":")]
            return out
        case Multiport(option, ports, invert):
            text = ",".join(_render_range(p, ":") for p in ports)
            return ["-m", "multiport", *_bang(invert), option, text]
        case Owner():
            return ["-m", "owner", *_render_owner(match)]
        case Comment(text):
            return ["-m", "comment", "--comment", text]
    raise FirewallError(f"cannot render match {match!r}")


def _render_owner(owner: Owner) -> list[str]:
    out: list[str] = []
    if owner.socket_exists:
        out += [*_bang(owner.socket_invert), "--socket-exists"]
    if owner.uid is not None:
        out += [*_bang(owner.uid_invert), "--uid-owner", _render_range(owner.uid, "-")]
    if owner.gid is not None:
        out += [*_bang(owner.gid_invert), "--gid-owner", _render_range(owner.gid, "-")]
    return out


def _render_target(target: TargetSpec) -> list[str]:
    if isinstance(target, Verdict):
        return ["-g" if target.goto else "-j", target.name]
    out = ["-j", "REDIRECT"]
    if target.ports is not None:
        out += ["--to-ports", _render_range(target.ports, "-")]
    if target.random:
        out.append("--random")
    return out


def canonical_spec(tokens: Sequence[str], family: Family) -> RuleSpec:
    """parse_spec, insisting that the tokens are already what iptables-nft-save prints.

    `-p all` is the one accepted non-canonical form (it matches everything and prints as
    nothing). Anything else that would print differently is refused, so a rule model never
    disagrees with the dump of what it wrote.
    """
    spec = parse_spec(tokens, family)
    wanted = tuple(_without_p_all(tokens))
    printed = render_spec_tokens(spec)
    if printed != wanted:
        raise FirewallError(
            f"rule is not in iptables-save canonical form: {' '.join(tokens)!r} "
            f"would be saved as {' '.join(printed)!r}"
        )
    return spec


def _without_p_all(tokens: Sequence[str]) -> Iterator[str]:
    it = iter(range(len(tokens)))
    for i in it:
        if tokens[i] == "-p" and i + 1 < len(tokens) and tokens[i + 1] in ("all", "0"):
            next(it, None)
            continue
        yield tokens[i]


# ============================================================================================
# RuleSpec -> expressions (iptables-nft's nft_ipv4_add / nft_ipv6_add)
# ============================================================================================

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
        case Multiport(option, ports, invert):
            return [XtMatch("multiport", 1, encode_multiport(option, ports, invert))]
        case Owner():
            return [XtMatch("owner", 1, encode_owner(match))]
        case Comment(text):
            return [XtMatch("comment", 0, text.encode().ljust(COMMENT_LEN, b"\0"))]
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


def encode_multiport(option: str, ports: tuple[PortRange, ...], invert: bool) -> bytes:
    flat: list[int] = []
    pflags: list[int] = []
    for low, high in ports:
        flat.append(low)
        pflags.append(0 if low == high else 1)
        if low != high:
            flat.append(high)
            pflags.append(0)
    if not flat:
        raise FirewallError("invalid port/service `' specified")
    if len(flat) > MULTIPORT_MAX:
        raise FirewallError("too many ports specified")
    pad = [0] * (MULTIPORT_MAX - len(flat))
    count = len(flat)
    return _MULTIPORT_V1.pack(
        MULTIPORT_FLAGS[option], count, *flat, *pad, *pflags, *pad, int(invert)
    )


def encode_owner(owner: Owner) -> bytes:
    match_flags = invert_flags = 0
    uid, gid = owner.uid or (0, 0), owner.gid or (0, 0)
    for flag, present, inv in (
        (XT_OWNER_UID, owner.uid is not None, owner.uid_invert),
        (XT_OWNER_GID, owner.gid is not None, owner.gid_invert),
        (XT_OWNER_SOCKET, owner.socket_exists, owner.socket_invert),
    ):
        match_flags |= flag if present else 0
        invert_flags |= flag if present and inv else 0
    return _OWNER.pack(uid[0], uid[1], gid[0], gid[1], match_flags, invert_flags)


def _target_expr(target: TargetSpec, family: Family) -> Expr:
    if isinstance(target, Redirect):
        return XtTarget("REDIRECT", 0, encode_redirect(target, family))
    if target.name in VERDICT_CODES and not target.goto:
        return Immediate(VERDICT_CODES[target.name])
    return Immediate(NFT_GOTO if target.goto else NFT_JUMP, target.name)


def encode_redirect(target: Redirect, family: Family) -> bytes:
    flags = NF_NAT_RANGE_PROTO_RANDOM if target.random else 0
    low = high = b"\0\0"
    if target.ports is not None:
        flags |= NF_NAT_RANGE_PROTO_SPECIFIED
        low, high = struct.pack(">H", target.ports[0]), struct.pack(">H", target.ports[1])
    if family is Family.IPV4:
        return _NAT_IPV4_MULTI_RANGE.pack(1, flags, bytes(4), bytes(4), low, high)
    return _NAT_RANGE.pack(flags, bytes(16), bytes(16), low, high)


# ============================================================================================
# expressions -> RuleSpec (iptables-nft's nft_rule_to_iptables_command_state)
# ============================================================================================


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
        return FirewallError(f"cannot decode nf_tables rule: {what}")


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
    return _assemble(dict(dec.basics), tuple(dec.matches), dec.target)


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
            dec.matches.append(decode_xt_match(expr, dec))
        case Immediate():
            dec.target = _decode_verdict(expr, dec)
        case XtTarget():
            dec.target = decode_xt_target(expr, dec.family, dec)
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
    return _text(dec, name)


def _text(dec: _Decoder, raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise dec.fail(f"undecodable text {raw!r}") from exc


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
        _store_ports(dec, current, "sport", (sport, sport), inv)
        _store_ports(dec, current, "dport", (dport, dport), inv)
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
        return (port, port), nxt.op == NFT_CMP_NEQ
    if isinstance(nxt, Range) and nxt.op in (NFT_RANGE_EQ, NFT_RANGE_NEQ) and nxt.sreg == reg:
        low, high = int.from_bytes(nxt.low, "big"), int.from_bytes(nxt.high, "big")
        return (low, high), nxt.op == NFT_RANGE_NEQ
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


def decode_xt_match(expr: XtMatch, dec: _Decoder) -> MatchSpec:
    info = expr.info
    if (expr.name, expr.rev) == ("comment", 0) and len(info) >= COMMENT_LEN:
        return Comment(_text(dec, info[:COMMENT_LEN].split(b"\0", 1)[0]))
    if (expr.name, expr.rev) == ("multiport", 1) and len(info) >= _MULTIPORT_V1.size:
        return _decode_multiport(info, dec)
    if (expr.name, expr.rev) == ("owner", 1) and len(info) >= _OWNER.size:
        return _decode_owner(info, dec)
    raise dec.fail(f"unsupported match {expr.name} revision {expr.rev} ({len(info)} bytes)")


def _decode_multiport(info: bytes, dec: _Decoder) -> Multiport:
    values = _MULTIPORT_V1.unpack_from(info)
    flags, count = values[0], values[1]
    ports, pflags, invert = values[2:17], values[17:32], values[32]
    options = {v: k for k, v in MULTIPORT_FLAGS.items()}
    if flags not in options or not 0 < count <= MULTIPORT_MAX or invert > 1:
        raise dec.fail(f"multiport flags={flags} count={count}")
    out: list[PortRange] = []
    i = 0
    while i < count:
        if pflags[i]:
            if i + 1 >= count:
                raise dec.fail("multiport range without an end")
            out.append((ports[i], ports[i + 1]))
            i += 2
        else:
            out.append((ports[i], ports[i]))
            i += 1
    return Multiport(options[flags], tuple(out), bool(invert))


def _decode_owner(info: bytes, dec: _Decoder) -> Owner:
    uid_min, uid_max, gid_min, gid_max, flags, invert = _OWNER.unpack_from(info)
    known = XT_OWNER_UID | XT_OWNER_GID | XT_OWNER_SOCKET
    if flags & ~known or invert & ~flags or not flags:
        raise dec.fail(f"owner match flags {flags:#x} invert {invert:#x}")
    return Owner(
        (uid_min, uid_max) if flags & XT_OWNER_UID else None,
        bool(invert & XT_OWNER_UID),
        (gid_min, gid_max) if flags & XT_OWNER_GID else None,
        bool(invert & XT_OWNER_GID),
        bool(flags & XT_OWNER_SOCKET),
        bool(invert & XT_OWNER_SOCKET),
    )


def decode_xt_target(expr: XtTarget, family: Family, dec: _Decoder) -> Redirect:
    if (expr.name, expr.rev) != ("REDIRECT", 0):
        raise dec.fail(f"unsupported target {expr.name} revision {expr.rev}")
    if family is Family.IPV4 and len(expr.info) >= _NAT_IPV4_MULTI_RANGE.size:
        size, flags, _, _, low, high = _NAT_IPV4_MULTI_RANGE.unpack_from(expr.info)
        if size != 1:
            raise dec.fail(f"REDIRECT with {size} ranges")
    elif family is Family.IPV6 and len(expr.info) >= _NAT_RANGE.size:
        flags, _, _, low, high = _NAT_RANGE.unpack_from(expr.info)
    else:
        raise dec.fail(f"REDIRECT info of {len(expr.info)} bytes")
    if flags & ~(NF_NAT_RANGE_PROTO_SPECIFIED | NF_NAT_RANGE_PROTO_RANDOM):
        raise dec.fail(f"REDIRECT flags {flags:#x}")
    ports = None
    if flags & NF_NAT_RANGE_PROTO_SPECIFIED:
        ports = (int.from_bytes(low, "big"), int.from_bytes(high, "big"))
    return Redirect(ports, bool(flags & NF_NAT_RANGE_PROTO_RANDOM))


# ============================================================================================
# Whole rules
# ============================================================================================


def encode_rule_tokens(tokens: Sequence[str], family: Family) -> EncodedRule:
    return encode_spec(canonical_spec(tokens, family), family)


def decode_rule_tokens(
    exprs: Sequence[Expr], family: Family, comment: str | None = None
) -> tuple[str, ...]:
    return render_spec_tokens(decode_spec(exprs, family, comment))


# ============================================================================================
# Messages
# ============================================================================================


class Message(NamedTuple):
    """One netlink message as received: nlmsghdr fields, nfgenmsg family, attribute bytes."""

    msg_type: int
    flags: int
    seq: int
    family: int
    body: bytes


class NetlinkError(NamedTuple):
    """An NLMSG_ERROR: errno 0 is an ACK. `seq` names the request it answers."""

    errno: int
    seq: int
    message: str = ""

    @property
    def name(self) -> str:
        return errno_mod.errorcode.get(self.errno, f"errno {self.errno}")


def nft_type(msg: int) -> int:
    return (NFNL_SUBSYS_NFTABLES << 8) | msg


def build_message(
    msg_type: int, flags: int, seq: int, family: int, body: bytes = b"", *, res_id: int = 0
) -> bytes:
    payload = _NFGENMSG.pack(family, 0, res_id) + body
    length = _NLMSGHDR.size + len(payload)
    return _NLMSGHDR.pack(length, msg_type, flags, seq, 0) + payload + b"\0" * (-length % 4)


def parse_messages(data: bytes) -> Iterator[Message | NetlinkError]:
    pos = 0
    while pos + _NLMSGHDR.size <= len(data):
        length, msg_type, flags, seq, _ = _NLMSGHDR.unpack_from(data, pos)
        if length < _NLMSGHDR.size or pos + length > len(data):
            return
        chunk = data[pos + _NLMSGHDR.size : pos + length]
        pos += (length + 3) & ~3
        if msg_type == NLMSG_ERROR:
            yield _parse_error(chunk, flags)
        elif msg_type == NLMSG_DONE:
            yield Message(msg_type, flags, seq, 0, b"")
        else:
            yield Message(msg_type, flags, seq, chunk[0] if chunk else 0, chunk[_NFGENMSG.size :])


def _parse_error(chunk: bytes, flags: int) -> NetlinkError:
    code = int(struct.unpack_from("=i", chunk)[0])
    orig_len, _, _, orig_seq, _ = _NLMSGHDR.unpack_from(chunk, 4)
    message = ""
    if flags & NLM_F_ACK_TLVS:
        echoed = _NLMSGHDR.size if flags & NLM_F_CAPPED else orig_len
        tlvs = attr_map(chunk[4 + ((echoed + 3) & ~3) :])
        message = cstr(tlvs.get(NLMSGERR_ATTR_MSG, b""))
    return NetlinkError(-code, orig_seq, message)


def getgen_request(seq: int) -> bytes:
    return build_message(nft_type(NFT_MSG_GETGEN), NLM_F_REQUEST | NLM_F_ACK, seq, 0)


def parse_genid(msg: Message) -> int | None:
    if msg.msg_type != nft_type(NFT_MSG_NEWGEN):
        return None
    value = attr_map(msg.body).get(NFTA_GEN_ID)
    return u32(value) if value else None


def dump_request(msg: int, family: Family, seq: int, table: str | None = None) -> bytes:
    body = attr_str(NFTA_RULE_TABLE, table) if table is not None else b""
    return build_message(nft_type(msg), NLM_F_REQUEST | NLM_F_DUMP, seq, NFPROTO[family], body)


# --- chains and rules as the kernel reports them -------------------------------------------


class ChainInfo(NamedTuple):
    table: str
    name: str
    hook: int | None = None
    priority: int | None = None
    policy: int | None = None
    counters: Counters | None = None
    kind: str | None = None  # base chain type: nat, filter, route


class RuleInfo(NamedTuple):
    table: str
    chain: str
    handle: int
    exprs: tuple[Expr, ...]
    comment: str | None = None


def parse_chain(msg: Message) -> ChainInfo:
    a = attr_map(msg.body)
    hook = attr_map(a[NFTA_CHAIN_HOOK]) if NFTA_CHAIN_HOOK in a else {}
    counters = None
    if NFTA_CHAIN_COUNTERS in a:
        c = attr_map(a[NFTA_CHAIN_COUNTERS])
        counters = Counters(u64(c[NFTA_COUNTER_PACKETS]), u64(c[NFTA_COUNTER_BYTES]))
    return ChainInfo(
        table=cstr(a.get(NFTA_CHAIN_TABLE, b"")),
        name=cstr(a.get(NFTA_CHAIN_NAME, b"")),
        hook=u32(hook[NFTA_HOOK_HOOKNUM]) if NFTA_HOOK_HOOKNUM in hook else None,
        priority=s32(hook[NFTA_HOOK_PRIORITY]) if NFTA_HOOK_PRIORITY in hook else None,
        policy=u32(a[NFTA_CHAIN_POLICY]) if NFTA_CHAIN_POLICY in a else None,
        counters=counters,
        kind=cstr(a[NFTA_CHAIN_TYPE]) if NFTA_CHAIN_TYPE in a else None,
    )


def parse_rule(msg: Message) -> RuleInfo:
    a = attr_map(msg.body)
    return RuleInfo(
        table=cstr(a.get(NFTA_RULE_TABLE, b"")),
        chain=cstr(a.get(NFTA_RULE_CHAIN, b"")),
        handle=u64(a[NFTA_RULE_HANDLE]) if NFTA_RULE_HANDLE in a else 0,
        exprs=decode_exprs(a.get(NFTA_RULE_EXPRESSIONS, b"")),
        comment=udata_comment(a.get(NFTA_RULE_USERDATA, b"")),
    )


def udata_comment(data: bytes) -> str | None:
    """NFTNL_UDATA_RULE_COMMENT from rule userdata: TLVs of u8 type, u8 length, value."""
    pos = 0
    while pos + 2 <= len(data):
        kind, length = data[pos], data[pos + 1]
        value = data[pos + 2 : pos + 2 + length]
        if kind == NFTNL_UDATA_RULE_COMMENT:
            return value.split(b"\0", 1)[0].decode(errors="replace")
        pos += 2 + length
    return None


def build_table(
    name: str, chains: Sequence[ChainInfo], rules: Sequence[RuleInfo], family: Family
) -> Table:
    """The canonical Table (what iptables-nft-save prints) from a dump of one table.

    As iptables-nft-save does, built-in chains are listed (ACCEPT, [0:0]) even when absent.
    A base chain iptables-nft would not have made fails the dump: iptables-nft-save would
    only warn and leave it out, which would hide traffic-steering chains from a verifier.
    """
    mine = {c.name: c for c in chains if c.table == name}
    for info in mine.values():
        _check_base_chain(name, info)
    order = save_order(name, frozenset(mine))
    out_chains = tuple(_chain_line(mine.get(n), n) for n in order)
    out_rules: list[Rule] = []
    for chain in order:
        for rule in (r for r in rules if r.table == name and r.chain == chain):
            try:
                spec = decode_rule_tokens(rule.exprs, family, rule.comment)
            except FirewallError as exc:
                raise FirewallError(
                    f"{exc.message} (table {name}, chain {chain}, rule handle {rule.handle})",
                    table=name,
                    chain=chain,
                ) from exc
            out_rules.append(Rule(chain, spec))
    return Table(name, out_chains, tuple(out_rules))


def _check_base_chain(table: str, info: ChainInfo) -> None:
    wanted = {b[0]: b[1:] for b in BASE_CHAINS.get(table, ())}
    if info.hook is None and info.name not in wanted:
        return
    if wanted.get(info.name) != (info.hook, info.priority, info.kind):
        raise FirewallError(
            f"table {table} holds chain {info.name} (hook {info.hook}, priority "
            f"{info.priority}, type {info.kind}) that iptables-nft would not create; "
            "inspect it with nft",
            table=table,
            chain=info.name,
        )


def _chain_line(info: ChainInfo | None, name: str) -> Chain:
    if info is None:
        return Chain(name, "ACCEPT", Counters(0, 0))
    if info.hook is None:
        return Chain(info.name, None, Counters(0, 0))
    policy = NF_POLICY.get(info.policy if info.policy is not None else 1, "ACCEPT")
    return Chain(info.name, policy, info.counters or Counters(0, 0))


# --- the apply batch -----------------------------------------------------------------------


class Batch(NamedTuple):
    """The bytes to send, and what each sequence number was (for error messages)."""

    data: bytes
    requests: dict[int, str]
    last_seq: int


def _rule_body(table: str, rule: Rule, family: Family) -> bytes:
    encoded = encode_rule_tokens(rule.spec, family)
    exprs = b"".join(encode_expr(e) for e in encoded.exprs)
    compat = attr_u32(NFTA_RULE_COMPAT_PROTO, encoded.compat_proto) + attr_u32(
        NFTA_RULE_COMPAT_FLAGS, NFT_RULE_COMPAT_F_INV if encoded.compat_invert else 0
    )
    return (
        attr_str(NFTA_RULE_TABLE, table)
        + attr_str(NFTA_RULE_CHAIN, rule.chain)
        + nested(NFTA_RULE_EXPRESSIONS, exprs)
        + nested(NFTA_RULE_COMPAT, compat)
    )


def _base_chain_body(table: str, name: str, hook: int, priority: int, kind: str) -> bytes:
    """As `iptables-nft -A` makes them: ACCEPT policy, no counters."""
    hook_attr = nested(NFTA_CHAIN_HOOK, attr_u32(NFTA_HOOK_HOOKNUM, hook), attr_u32(2, priority))
    return (
        attr_str(NFTA_CHAIN_TABLE, table)
        + attr_str(NFTA_CHAIN_NAME, name)
        + hook_attr
        + attr_u32(NFTA_CHAIN_POLICY, 1)
        + attr_str(NFTA_CHAIN_TYPE, kind)
    )


def plan_batch_ops(
    change: TableChange, existing: frozenset[str], family: Family
) -> list[tuple[int, int, bytes, str]]:
    """(message type, extra flags, body, description) for every message between BEGIN/END.

    Ensures the table and, like `iptables-nft -A`, only the base chains the change uses
    (rules appended to them, or named to create/flush) and only if missing; creates missing
    user chains, flushes the ones to flush (creating any that are missing: the result, an
    empty chain, is the same), then appends the rules.
    """
    table = change.table
    if table not in WRITABLE_TABLES:
        raise FirewallError(f"the nft backend cannot create table {table}", table=table)
    ops = [(NFT_MSG_NEWTABLE, NLM_F_CREATE, attr_str(NFTA_TABLE_NAME, table), f"table {table}")]
    used = {r.chain for r in change.append} | {*change.create_chains, *change.flush_chains}
    base_names = {b[0] for b in BASE_CHAINS[table]}
    for name, hook, prio, kind in BASE_CHAINS[table]:
        if name in used and name not in existing:
            body = _base_chain_body(table, name, hook, prio, kind)
            ops.append((NFT_MSG_NEWCHAIN, NLM_F_CREATE, body, f"chain {name}"))
    made = existing | base_names
    for name in dict.fromkeys((*change.create_chains, *change.flush_chains)):
        chain_attrs = attr_str(NFTA_CHAIN_TABLE, table) + attr_str(NFTA_CHAIN_NAME, name)
        if name not in made:
            ops.append((NFT_MSG_NEWCHAIN, NLM_F_CREATE, chain_attrs, f"-N {name}"))
            made |= {name}
        elif name in change.flush_chains and name in existing:
            # A DELRULE without NFTA_RULE_CHAIN would flush the whole table.
            scope = attr_str(NFTA_RULE_TABLE, table) + attr_str(NFTA_RULE_CHAIN, name)
            ops.append((NFT_MSG_DELRULE, 0, scope, f"-F {name}"))
    for rule in change.append:
        body = _rule_body(table, rule, family)
        ops.append((NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, body, render_rule(rule)))
    return ops


def build_batch(
    change: TableChange, existing: frozenset[str], family: Family, genid: int, seq: int
) -> Batch:
    """One NFNL batch applying `change`; the kernel commits all of it or none of it."""
    ops = plan_batch_ops(change, existing, family)
    res = NFNL_SUBSYS_NFTABLES
    parts = [
        build_message(
            NFNL_MSG_BATCH_BEGIN,
            NLM_F_REQUEST,
            seq,
            0,
            attr_u32(NFNL_BATCH_GENID, genid),
            res_id=res,
        )
    ]
    requests: dict[int, str] = {seq: "batch"}
    for i, (msg, flags, body, what) in enumerate(ops, start=1):
        parts.append(
            build_message(
                nft_type(msg), NLM_F_REQUEST | NLM_F_ACK | flags, seq + i, NFPROTO[family], body
            )
        )
        requests[seq + i] = what
    end = seq + len(ops) + 1
    parts.append(build_message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, res_id=res))
    return Batch(b"".join(parts), requests, end)
