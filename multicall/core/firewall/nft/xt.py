"""xt compat payloads: the structs of the xtables extensions iptables-nft hands to the kernel
inside `match` and `target` expressions (linux/netfilter/*.h), as plain values.

Sizes are already XT_ALIGNed; the structs are host-endian (little-endian on every platform
cnibox ships for), ports inside nf_nat ranges are big-endian, as the kernel reads them.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from multicall.core.firewall.model import COMMENT_LEN, Family
from multicall.core.firewall.nft.expr import XtMatch, XtTarget, text_of, undecodable
from multicall.core.firewall.ports import MULTIPORT_SLOTS, PortRange
from multicall.errors import FirewallError

# xt structs (linux/netfilter/*.h), host-endian, sizes already XT_ALIGNed.
MULTIPORT_MAX = MULTIPORT_SLOTS
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


# An owner id range (min, max), as xt_owner stores it.
IdRange = tuple[int, int]


class Multiport(NamedTuple):
    option: str  # --sports / --dports / --ports
    ports: tuple[PortRange, ...]
    invert: bool = False


class Owner(NamedTuple):
    uid: IdRange | None = None
    uid_invert: bool = False
    gid: IdRange | None = None
    gid_invert: bool = False
    socket_exists: bool = False
    socket_invert: bool = False


class Comment(NamedTuple):
    text: str


class Redirect(NamedTuple):
    ports: PortRange | None = None
    random: bool = False


class Notrack(NamedTuple):
    """`-j CT --notrack` (iptables-nft writes `-j NOTRACK` as this too: CT revision 1 or 2
    with XT_CT_NOTRACK). Only read, in a raw table, to judge a bypass of nat
    (core/firewall/diff.py `untracked`); never written."""


XT_CT_NOTRACK = 1  # xt_ct_target_info(_v1).flags; the kernel ignores the other fields then


# --- options -> structs ---------------------------------------------------------------------


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


def encode_target(target: Redirect, family: Family) -> XtTarget:
    """The `target` expression iptables-nft writes for -j REDIRECT."""
    return XtTarget("REDIRECT", 0, encode_redirect(target, family))


def encode_redirect(target: Redirect, family: Family) -> bytes:
    flags = NF_NAT_RANGE_PROTO_RANDOM if target.random else 0
    low = high = b"\0\0"
    if target.ports is not None:
        flags |= NF_NAT_RANGE_PROTO_SPECIFIED
        low, high = struct.pack(">H", target.ports[0]), struct.pack(">H", target.ports[1])
    if family is Family.IPV4:
        return _NAT_IPV4_MULTI_RANGE.pack(1, flags, bytes(4), bytes(4), low, high)
    return _NAT_RANGE.pack(flags, bytes(16), bytes(16), low, high)


def encode_match(match: Multiport | Owner | Comment) -> XtMatch:
    """The `match` expression iptables-nft writes for an xt match."""
    if isinstance(match, Multiport):
        return XtMatch("multiport", 1, encode_multiport(match.option, match.ports, match.invert))
    if isinstance(match, Owner):
        return XtMatch("owner", 1, encode_owner(match))
    return XtMatch("comment", 0, match.text.encode().ljust(COMMENT_LEN, b"\0"))


# --- structs -> options ---------------------------------------------------------------------


def decode_match(expr: XtMatch) -> Multiport | Owner | Comment:
    info = expr.info
    if (expr.name, expr.rev) == ("comment", 0) and len(info) >= COMMENT_LEN:
        return Comment(text_of(info[:COMMENT_LEN].split(b"\0", 1)[0]))
    if (expr.name, expr.rev) == ("multiport", 1) and len(info) >= _MULTIPORT_V1.size:
        return _decode_multiport(info)
    if (expr.name, expr.rev) == ("owner", 1) and len(info) >= _OWNER.size:
        return _decode_owner(info)
    raise undecodable(f"unsupported match {expr.name} revision {expr.rev} ({len(info)} bytes)")


def _decode_multiport(info: bytes) -> Multiport:
    values = _MULTIPORT_V1.unpack_from(info)
    flags, count = values[0], values[1]
    ports, pflags, invert = values[2:17], values[17:32], values[32]
    options = {v: k for k, v in MULTIPORT_FLAGS.items()}
    if flags not in options or not 0 < count <= MULTIPORT_MAX or invert > 1:
        raise undecodable(f"multiport flags={flags} count={count}")
    out: list[PortRange] = []
    i = 0
    while i < count:
        if pflags[i]:
            if i + 1 >= count:
                raise undecodable("multiport range without an end")
            out.append(PortRange(ports[i], ports[i + 1]))
            i += 2
        else:
            out.append(PortRange(ports[i], ports[i]))
            i += 1
    return Multiport(options[flags], tuple(out), bool(invert))


def _decode_owner(info: bytes) -> Owner:
    uid_min, uid_max, gid_min, gid_max, flags, invert = _OWNER.unpack_from(info)
    known = XT_OWNER_UID | XT_OWNER_GID | XT_OWNER_SOCKET
    if flags & ~known or invert & ~flags or not flags:
        raise undecodable(f"owner match flags {flags:#x} invert {invert:#x}")
    return Owner(
        (uid_min, uid_max) if flags & XT_OWNER_UID else None,
        bool(invert & XT_OWNER_UID),
        (gid_min, gid_max) if flags & XT_OWNER_GID else None,
        bool(invert & XT_OWNER_GID),
        bool(flags & XT_OWNER_SOCKET),
        bool(invert & XT_OWNER_SOCKET),
    )


def decode_target(expr: XtTarget, family: Family) -> Redirect | Notrack:
    if expr.name == "CT" and expr.rev in (1, 2) and len(expr.info) >= 2:
        (flags,) = struct.unpack_from("<H", expr.info)
        if flags & XT_CT_NOTRACK:
            return Notrack()
    if (expr.name, expr.rev) != ("REDIRECT", 0):
        raise undecodable(f"unsupported target {expr.name} revision {expr.rev}")
    if family is Family.IPV4 and len(expr.info) >= _NAT_IPV4_MULTI_RANGE.size:
        size, flags, _, _, low, high = _NAT_IPV4_MULTI_RANGE.unpack_from(expr.info)
        if size != 1:
            raise undecodable(f"REDIRECT with {size} ranges")
    elif family is Family.IPV6 and len(expr.info) >= _NAT_RANGE.size:
        flags, _, _, low, high = _NAT_RANGE.unpack_from(expr.info)
    else:
        raise undecodable(f"REDIRECT info of {len(expr.info)} bytes")
    if flags & ~(NF_NAT_RANGE_PROTO_SPECIFIED | NF_NAT_RANGE_PROTO_RANDOM):
        raise undecodable(f"REDIRECT flags {flags:#x}")
    ports = None
    if flags & NF_NAT_RANGE_PROTO_SPECIFIED:
        ports = PortRange(int.from_bytes(low, "big"), int.from_bytes(high, "big"))
    return Redirect(ports, bool(flags & NF_NAT_RANGE_PROTO_RANDOM))
