"""nf_tables expressions and their netlink attributes (one `NamedTuple` per expression kind,
as google/nftables keeps one file per expression under expr/)."""

from __future__ import annotations

import struct
from typing import NamedTuple

from multicall.core.firewall.nft.netlink import (
    NFTA_DATA_VALUE,
    NFTA_DATA_VERDICT,
    NFTA_EXPR_DATA,
    NFTA_EXPR_NAME,
    NFTA_LIST_ELEM,
    NFTA_VERDICT_CHAIN,
    NFTA_VERDICT_CODE,
    attr,
    attr_map,
    attr_str,
    attr_u32,
    attr_u64,
    cstr,
    iter_attrs,
    nested,
    s32,
    u32,
    u64,
)
from multicall.errors import FirewallError

NFT_REG_VERDICT = 0
NFT_REG_1 = 1
NFT_PAYLOAD_NETWORK_HEADER = 1
NFT_PAYLOAD_TRANSPORT_HEADER = 2
NFT_META_IIFNAME = 6
NFT_META_OIFNAME = 7
NFT_META_L4PROTO = 16
NFT_META_SKUID = 10
NFT_META_SKGID = 11
NFTA_REDIR_REG_PROTO_MIN = 1
NFTA_REDIR_REG_PROTO_MAX = 2
NFTA_REDIR_FLAGS = 3
NF_NAT_RANGE_PROTO_SPECIFIED = 2
NFTA_LOOKUP_SET = 1
NFTA_LOOKUP_SREG = 2
NFTA_LOOKUP_DREG = 3
NFTA_LOOKUP_SET_ID = 4
NFTA_LOOKUP_FLAGS = 5
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

# --- Expressions -------------------------------------------------------------------------------


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


class ImmediateData(NamedTuple):
    """A value loaded into a data register (the port a native `redirect` reads)."""

    data: bytes
    dreg: int = NFT_REG_1


class Redir(NamedTuple):
    """nft's native `redirect` (iptables-nft uses the REDIRECT `target` instead): the port
    range is read from registers; nft sends `redirect to :P` as min = max = the register
    holding P, flags NF_NAT_RANGE_PROTO_SPECIFIED."""

    reg_min: int | None = None
    reg_max: int | None = None
    flags: int = 0


class Lookup(NamedTuple):
    """`reg in set`: the native mode's port lists (anonymous sets). A batch names the set
    it creates by its transaction id (`set_id`, with the name template `__set%d`); the
    kernel reports the name it chose (`__set0`) and no id."""

    set_name: str
    sreg: int = NFT_REG_1
    set_id: int | None = None


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


Expr = (
    Meta
    | Payload
    | Cmp
    | Bitwise
    | Range
    | Counter
    | Immediate
    | ImmediateData
    | Redir
    | Lookup
    | XtMatch
    | XtTarget
    | Unknown
)


# --- expression <-> attributes ---------------------------------------------------------------


def _data_value(kind: int, value: bytes) -> bytes:
    return nested(kind, attr(NFTA_DATA_VALUE, value))


def _expr_data(expr: Expr) -> tuple[str, bytes]:  # noqa: PLR0911, PLR0912 - one arm per expression type
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
        case ImmediateData(data, dreg):
            return "immediate", attr_u32(1, dreg) + _data_value(2, data)
        case Redir(reg_min, reg_max, flags):
            body = b"" if reg_min is None else attr_u32(NFTA_REDIR_REG_PROTO_MIN, reg_min)
            body += b"" if reg_max is None else attr_u32(NFTA_REDIR_REG_PROTO_MAX, reg_max)
            return "redir", body + (attr_u32(NFTA_REDIR_FLAGS, flags) if flags else b"")
        case Lookup(set_name, sreg, set_id):
            body = attr_str(NFTA_LOOKUP_SET, set_name) + attr_u32(NFTA_LOOKUP_SREG, sreg)
            return "lookup", body + (
                b"" if set_id is None else attr_u32(NFTA_LOOKUP_SET_ID, set_id)
            )
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
    data = attr_map(a.get(2, b""))
    if NFTA_DATA_VALUE in data:
        return ImmediateData(data[NFTA_DATA_VALUE], u32(a.get(1, b"\0" * 4)))
    verdict = attr_map(data.get(NFTA_DATA_VERDICT, b""))
    if NFTA_VERDICT_CODE not in verdict:
        return Unknown("immediate (neither data nor verdict)")
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


def _decode_redir(a: dict[int, bytes]) -> Expr:
    def reg(key: int) -> int | None:
        return u32(a[key]) if key in a else None

    flags = u32(a[NFTA_REDIR_FLAGS]) if NFTA_REDIR_FLAGS in a else 0
    return Redir(reg(NFTA_REDIR_REG_PROTO_MIN), reg(NFTA_REDIR_REG_PROTO_MAX), flags)


def _decode_lookup(a: dict[int, bytes]) -> Expr:
    if NFTA_LOOKUP_DREG in a or (NFTA_LOOKUP_FLAGS in a and u32(a[NFTA_LOOKUP_FLAGS])):
        return Unknown("lookup (map or inverted)")
    set_id = u32(a[NFTA_LOOKUP_SET_ID]) if NFTA_LOOKUP_SET_ID in a else None
    return Lookup(cstr(a[NFTA_LOOKUP_SET]), u32(a[NFTA_LOOKUP_SREG]), set_id)


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
            case "redir":
                return _decode_redir(a)
            case "lookup":
                return _decode_lookup(a)
            case "match":
                return XtMatch(cstr(a[1]), u32(a[2]), a.get(3, b""))
            case "target":
                return XtTarget(cstr(a[1]), u32(a[2]), a.get(3, b""))
    except (KeyError, struct.error):
        return Unknown(f"{name} (malformed)")
    return Unknown(name)


def decode_exprs(data: bytes) -> tuple[Expr, ...]:
    return tuple(decode_expr(elem) for kind, elem in iter_attrs(data) if kind == NFTA_LIST_ELEM)


def undecodable(what: str) -> FirewallError:
    """The error for expressions that do not read back as an iptables rule."""
    return FirewallError(f"cannot decode nf_tables rule: {what}")


def text_of(raw: bytes) -> str:
    """UTF-8 text from a payload (interface names, comments), or the decode error."""
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise undecodable(f"undecodable text {raw!r}") from exc
