"""Dumping an x_tables table the way `iptables-legacy-save` prints it (rule 5 of
effects/firewall/legacy): the address part in C order, then `-m NAME` plus each extension's
own save output, then the target, tokenised into canonical `Rule.spec`s."""

from __future__ import annotations

import ctypes as ct
import socket
import struct
from collections.abc import Iterator
from functools import cache
from typing import Any

from multicall.core.firewall.iptables_save import tokenize
from multicall.core.firewall.model import Family
from multicall.core.firewall.protocols import XTABLES_NAMES
from multicall.core.firewall.ruleset import Chain, Counters, Rule, Table
from multicall.effects.firewall.legacy.loading import iptc, opened
from multicall.effects.ns import libc

IPT_F_GOTO = 0x02
IP6T_F_GOTO = 0x04
IPT_F_FRAG = 0x01
IPT_INV_FRAG = 0x20
INV_VIA_IN, INV_VIA_OUT, INV_SRC, INV_DST, INV_PROTO = 0x01, 0x02, 0x08, 0x10, 0x40


# ----------------------------------------------------------------------------- dump


def chain_names(handle: Any) -> list[str]:
    names = []
    name = handle._iptc.iptc_first_chain(handle._handle)
    while name:
        names.append(name.decode())
        name = handle._iptc.iptc_next_chain(handle._handle)
    return names


def entries(handle: Any, chain: str) -> Iterator[Any]:
    entry = handle.first_rule(chain)
    while entry:
        yield entry
        entry = handle.next_rule(entry)


def _chain_header(handle: Any, name: str) -> Chain:
    if not handle.builtin_chain(name):
        return Chain(name)
    policy, (packets, octets) = handle.get_policy(name)
    return Chain(name, policy.name, Counters(packets, octets))


def dump_table(family: Family, table: str = "nat") -> Table:
    with opened(family, table) as handle:
        chains: list[Chain] = []
        rules: list[Rule] = []
        for name in chain_names(handle):
            chains.append(_chain_header(handle, name))
            rules += [Rule(name, entry_spec(handle, e, family)) for e in entries(handle, name)]
    return Table(table, tuple(chains), tuple(rules))


def entry_spec(handle: Any, entry: Any, family: Family) -> tuple[str, ...]:
    """The tokens `iptables-save` prints after `-A CHAIN` for one libiptc entry."""
    rule = _rule_for(entry, family)
    ip = rule.get_ip()
    tokens = _ip_part(ip, family)
    for match in _matches(rule, entry):
        tokens += ["-m", match.name, *split_saved(match._get_saved_buf(ip))]
    return (*tokens, *_target_part(handle, rule, entry, ip, family))


def _rule_for(entry: Any, family: Family) -> Any:
    module = iptc()
    rule = module.Rule() if family is Family.IPV4 else module.Rule6()
    rule.entry = entry
    return rule


def _matches(rule: Any, entry: Any) -> Iterator[Any]:
    module = iptc()
    xt_entry_match = module.xtables.xt_entry_match
    offset = 0
    start = rule._entry_size()
    while start + offset < entry.target_offset:
        raw = ct.cast(ct.byref(entry.elems, offset), ct.POINTER(xt_entry_match))[0]
        match = module.Match(rule, match=raw)
        yield match
        offset += match.size


def _target_part(handle: Any, rule: Any, entry: Any, ip: Any, family: Family) -> list[str]:
    module = iptc()
    raw = ct.cast(ct.byref(entry, entry.target_offset), ct.POINTER(module.xtables.xt_entry_target))
    name = raw[0].u.user.name.decode()
    verdict = handle.get_target(entry)
    verdict = verdict.decode() if isinstance(verdict, bytes) else (verdict or "")
    if name:
        target = module_target_class()(rule, target=raw[0])
        return ["-j", target.name or verdict, *split_saved(target._get_saved_buf(ip))]
    if not verdict:
        return []
    goto = ip.flags & (IPT_F_GOTO if family is Family.IPV4 else IP6T_F_GOTO)
    return ["-g" if goto else "-j", verdict]


@cache
def module_target_class() -> type:
    """A Target that never asks every table whether its name is a chain (it is a module)."""

    class ModuleTarget(iptc().Target):  # type: ignore[misc]  # python-iptables is untyped
        def _is_standard_target(self) -> bool:
            return False

    return ModuleTarget


def split_saved(raw: bytes | None) -> list[str]:
    """Tokens of an extension's save output (xtables_save_string quoting), split by the same
    lexer as save text (core/firewall/iptables_save.py `tokenize`)."""
    text = (raw or b"").decode().strip("\n")
    return [token.text for token in tokenize(text)]


# ----------------------------------------------------------------------------- address part


def _ip_part(ip: Any, family: Family) -> list[str]:
    if family is Family.IPV4:
        src = _ipv4(ip.src.s_addr, ip.smsk.s_addr, ip.invflags & INV_SRC, "-s")
        dst = _ipv4(ip.dst.s_addr, ip.dmsk.s_addr, ip.invflags & INV_DST, "-d")
    else:
        src = _ipv6(bytes(ip.src.s6_addr), bytes(ip.smsk.s6_addr), ip.invflags & INV_SRC, "-s")
        dst = _ipv6(bytes(ip.dst.s6_addr), bytes(ip.dmsk.s6_addr), ip.invflags & INV_DST, "-d")
    tokens = [*src, *dst]
    tokens += _iface(ip, "iniface", ip.invflags & INV_VIA_IN, "-i")
    tokens += _iface(ip, "outiface", ip.invflags & INV_VIA_OUT, "-o")
    tokens += _proto(ip.proto, ip.invflags & INV_PROTO)
    if family is Family.IPV4 and ip.flags & IPT_F_FRAG:
        tokens += ["!", "-f"] if ip.invflags & IPT_INV_FRAG else ["-f"]
    return tokens


def _invert(flag: int) -> list[str]:
    return ["!"] if flag else []


def _ipv4(addr: int, mask: int, inverted: int, option: str) -> list[str]:
    if not addr and not mask and not inverted:
        return []
    text = socket.inet_ntop(socket.AF_INET, struct.pack("I", addr))
    return [*_invert(inverted), option, f"{text}/{_v4_prefix(struct.pack('I', mask))}"]


def _v4_prefix(mask: bytes) -> str:
    bits = int.from_bytes(mask, "big")
    length = bin(bits).count("1")
    if bits == ((1 << 32) - 1) ^ ((1 << (32 - length)) - 1):
        return str(length)
    return socket.inet_ntop(socket.AF_INET, mask)


def _ipv6(addr: bytes, mask: bytes, inverted: int, option: str) -> list[str]:
    bits = int.from_bytes(mask, "big")
    length = bin(bits).count("1")
    contiguous = bits == ((1 << 128) - 1) ^ ((1 << (128 - length)) - 1)
    if contiguous and length == 0 and not inverted:
        return []
    prefix = str(length) if contiguous else socket.inet_ntop(socket.AF_INET6, mask)
    text = socket.inet_ntop(socket.AF_INET6, addr)
    return [*_invert(inverted), option, f"{text}/{prefix}"]


def _iface(ip: Any, field: str, inverted: int, option: str) -> list[str]:
    offset = getattr(type(ip), field).offset
    name = ct.string_at(ct.addressof(ip) + offset, 16)
    mask = ct.string_at(ct.addressof(ip) + offset + 32, 16)
    if mask[0] == 0:
        return []
    out = []
    for i in range(16):
        if mask[i] == 0:
            if name[i - 1] != 0:
                out.append("+")
            break
        if name[i] != 0:
            out.append(chr(name[i]))
    return [*_invert(inverted), option, "".join(out)]


class _Protoent(ct.Structure):
    _fields_ = (("p_name", ct.c_char_p), ("p_aliases", ct.c_void_p), ("p_proto", ct.c_int))


def _proto(number: int, inverted: int) -> list[str]:
    if not number:
        return []
    return [*_invert(inverted), "-p", protocol_name(number)]


@cache
def protocol_name(number: int) -> str:
    """As iptables: /etc/protocols through libc first, then xtables' own short list."""
    lookup = libc().getprotobynumber
    lookup.restype = ct.POINTER(_Protoent)
    entry = lookup(number)
    if entry and entry[0].p_name:
        return str(entry[0].p_name.decode())
    return XTABLES_NAMES.get(number, str(number))
