"""Netlink and nfnetlink framing for nf_tables: constants, attributes, messages and replies.

Integers inside nf_tables attributes are big-endian; the netlink headers are host-endian.
"""

from __future__ import annotations

import errno as errno_mod
import struct
from collections.abc import Iterator
from typing import NamedTuple

from multicall.core.firewall.model import Family

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

# --- nf_tables message types and attributes -------------------------------------------------
NFT_MSG_NEWTABLE = 0
NFT_MSG_NEWCHAIN = 3
NFT_MSG_GETCHAIN = 4
NFT_MSG_NEWRULE = 6
NFT_MSG_GETRULE = 7
NFT_MSG_DELRULE = 8
NFT_MSG_NEWSET = 9
NFT_MSG_GETSET = 10
NFT_MSG_NEWSETELEM = 12
NFT_MSG_GETSETELEM = 13
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
NFTA_SET_TABLE = 1
NFTA_SET_NAME = 2
NFTA_SET_FLAGS = 3
NFTA_SET_KEY_TYPE = 4
NFTA_SET_KEY_LEN = 5
NFTA_SET_DESC = 9
NFTA_SET_ID = 10
NFTA_SET_DESC_SIZE = 1
NFT_SET_ANONYMOUS = 0x1
NFT_SET_CONSTANT = 0x2
NFT_SET_INTERVAL = 0x4
NFTA_SET_ELEM_LIST_TABLE = 1
NFTA_SET_ELEM_LIST_SET = 2
NFTA_SET_ELEM_LIST_ELEMENTS = 3
NFTA_SET_ELEM_LIST_SET_ID = 4
NFTA_SET_ELEM_KEY = 1
NFTA_SET_ELEM_FLAGS = 3
NFT_SET_ELEM_INTERVAL_END = 0x1
NFTA_LIST_ELEM = 1
NFTA_EXPR_NAME = 1
NFTA_EXPR_DATA = 2
NFTA_DATA_VALUE = 1
NFTA_DATA_VERDICT = 2
NFTA_VERDICT_CODE = 1
NFTA_VERDICT_CHAIN = 2
NFTA_GEN_ID = 1

NFPROTO = {Family.IPV4: 2, Family.IPV6: 10}


# Netlink attributes


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


# Messages


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


def dump_request(
    msg: int, family: Family, seq: int, table: str | None = None, set_name: str | None = None
) -> bytes:
    """A dump of one family (or one table; NFTA_*_TABLE is attribute 1 in every message
    kind), or of one set's elements (`set_name`: NFTA_SET_ELEM_LIST_SET)."""
    body = attr_str(NFTA_RULE_TABLE, table) if table is not None else b""
    body += attr_str(NFTA_SET_ELEM_LIST_SET, set_name) if set_name is not None else b""
    return build_message(nft_type(msg), NLM_F_REQUEST | NLM_F_DUMP, seq, NFPROTO[family], body)
