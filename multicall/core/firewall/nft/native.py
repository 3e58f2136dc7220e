"""Linkerd's PROXY_INIT redirect as native nf_tables rules (`iptables-mode: nftables`):
tables of their own, no iptables-nft table and no xt compat expression, so a kernel without
x_tables (nft_compat, xt_*) runs them.

The layout, per family (`nft list table ip linkerd-proxy-init` prints it, see `render`):

    table ip linkerd-proxy-init
        chain prerouting  type nat hook prerouting priority dstnat (-100)  PROXY_INIT_REDIRECT
        chain output      type nat hook output priority -100 (dstnat)      PROXY_INIT_OUTPUT

Rules of this module:
1. The options are validated by the iptables mode's own `build_rules`, so both modes accept
   and refuse exactly the same options with the same errors; invalid port items are dropped
   as there (and logged by the plugin).
2. The rules keep upstream's order and meaning: `return` where upstream RETURNs (a base
   chain's return applies its accept policy, as RETURN from PROXY_INIT_* falls back to the
   nat chain's ACCEPT), `redirect to :P` where upstream REDIRECTs. A port list (ignored
   inbound or outbound ports, ports-to-redirect) is one rule looking its ports up in an
   anonymous constant set, as nft makes for `tcp dport { ... }`: a plain set of ports, or an
   interval set (its items merged) when the list holds a range; a list of one port or
   range is a plain compare, as nft makes for `{ P }`. Skipped subnets of the family
   likewise: one `ip saddr { ... }` rule over an interval set of the merged networks, or
   one prefix compare for a single subnet. Comments are upstream's, a list's
   cut to nft's 128 bytes (`...` ends a cut one).
3. The expressions are encoded as nft 1.0 encodes these statements (learned from
   `nft --debug=netlink`), except that a port range is one `range` expression (nft: two
   `cmp`) and a prefix is payload+bitwise+cmp (nft: a shorter payload); nft prints both
   the same way.
4. One batch programs every family of a pod: for each table, add (a no-op if present),
   delete, add again, then its chains and rules, each rule after its set and the set's
   elements (in messages that keep each list attribute under 64 KiB). The kernel commits it
   whole or not at all, so the result never depends on what was there before and a
   repeated ADD is idempotent.
5. Pure: values in, bytes and text out (the socket is `multicall.effects.firewall.nft`).

It is one file (~740 lines) because its four parts are one vocabulary read both ways: the
plan's expressions and sets, the batch that sends them, the dump that reads them back and
the text that prints them must stay each other's inverse (CHECK compares plan and dump by
that text), and a split would put the two halves of each pair in different modules.
"""

from __future__ import annotations

import difflib
import ipaddress
import struct
from collections.abc import Sequence
from typing import NamedTuple

from multicall.core.firewall.model import Family, ProxyInitOptions
from multicall.core.firewall.nft import expr as x
from multicall.core.firewall.nft.batch import Batch, base_chain_body, frame_batch
from multicall.core.firewall.nft.dump import ChainInfo, RuleInfo, SetElements, SetInfo
from multicall.core.firewall.nft.expr import (
    NF_ACCEPT,
    NFT_CMP_EQ,
    NFT_META_L4PROTO,
    NFT_META_OIFNAME,
    NFT_META_SKGID,
    NFT_META_SKUID,
    NFT_PAYLOAD_NETWORK_HEADER,
    NFT_PAYLOAD_TRANSPORT_HEADER,
    NFT_RANGE_EQ,
    NFT_REG_1,
    NFT_RETURN,
    Bitwise,
    Cmp,
    Expr,
    Immediate,
    ImmediateData,
    Lookup,
    Meta,
    Payload,
    Range,
    Redir,
    XtMatch,
    XtTarget,
    encode_expr,
)
from multicall.core.firewall.nft.netlink import (
    NFT_MSG_NEWCHAIN,
    NFT_MSG_NEWRULE,
    NFT_MSG_NEWSET,
    NFT_MSG_NEWSETELEM,
    NFT_MSG_NEWTABLE,
    NFT_SET_ANONYMOUS,
    NFT_SET_CONSTANT,
    NFT_SET_ELEM_INTERVAL_END,
    NFT_SET_INTERVAL,
    NFTA_DATA_VALUE,
    NFTA_LIST_ELEM,
    NFTA_RULE_CHAIN,
    NFTA_RULE_EXPRESSIONS,
    NFTA_RULE_TABLE,
    NFTA_RULE_USERDATA,
    NFTA_SET_DESC,
    NFTA_SET_DESC_SIZE,
    NFTA_SET_ELEM_FLAGS,
    NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS,
    NFTA_SET_ELEM_LIST_SET,
    NFTA_SET_ELEM_LIST_SET_ID,
    NFTA_SET_ELEM_LIST_TABLE,
    NFTA_SET_FLAGS,
    NFTA_SET_ID,
    NFTA_SET_KEY_LEN,
    NFTA_SET_KEY_TYPE,
    NFTA_SET_NAME,
    NFTA_SET_TABLE,
    NFTA_TABLE_NAME,
    NFTNL_UDATA_RULE_COMMENT,
    NLM_F_APPEND,
    NLM_F_CREATE,
    attr,
    attr_str,
    attr_u32,
    nested,
)
from multicall.core.firewall.ports import PortRange, Syntax, parse_port_range
from multicall.core.firewall.proxy_init import (
    COMMENT_PREFIX,
    build_rules,
    parse_subnet,
    subnets_of_family,
    validate_options,
)

NFT_MSG_DELTABLE = 2
TABLE = "linkerd-proxy-init"
# NF_IP_PRI_NAT_DST: the slot of iptables' own nat PREROUTING/OUTPUT (legacy and
# iptables-nft alike), nft's `dstnat`. Among nat chains of one hook the first to bind a
# connection's destination wins, and a `return` binds nothing, so tables holding the same
# redirect may share the slot while a node switches modes (docs/firewall.md).
PRIORITY = -100
HOOK_PREROUTING, HOOK_OUTPUT = 0, 3
PREROUTING, OUTPUT = "prerouting", "output"
HOOK_NAMES = {HOOK_PREROUTING: "prerouting", HOOK_OUTPUT: "output"}
IPPROTO_TCP = 6
IFNAMSIZ = 16
FAMILY_WORD = {Family.IPV4: "ip", Family.IPV6: "ip6"}
# Where the source address sits in the network header, and how long it is.
SADDR = {Family.IPV4: (12, 4), Family.IPV6: (8, 16)}
# A port list's set: nft's datatype of a port (inet_service; nft prints the keys by it),
# 2 bytes; its name a template the kernel fills (`__set0`), the batch naming it by id.
# Ids are unique in a batch; the ip6 table's start past the ip table's (a kernel before
# nft_set_lookup_byid compared tables would find an id in the other family's table).
TYPE_INET_SERVICE = 13
# nft's datatypes of IPv4 and IPv6 addresses (ipv4_addr, ipv6_addr), for skipped subnets.
ADDRESS_TYPE = {Family.IPV4: 7, Family.IPV6: 8}
SET_TEMPLATE = "__set%d"
SET_ID_BASE = {Family.IPV4: 1, Family.IPV6: 1 << 16}
# Elements go in messages of at most this many: NFTA_SET_ELEM_LIST_ELEMENTS is one
# attribute (16-bit length, < 64 KiB). An element costs at most 20 bytes (three attribute
# headers and an interval end's flags) plus its key padded to 4: 24 for a port, 36 for an
# IPv6 address, whose sets get fewer per message. A 65,535-port list is 32 messages, ~1 MiB.
ELEMENTS_PER_MESSAGE = 2048
ATTRIBUTE_ROOM = 65_535 - 4  # the list attribute's own header


def elements_per_message(key_len: int) -> int:
    return min(ELEMENTS_PER_MESSAGE, ATTRIBUTE_ROOM // (20 + -(-key_len // 4) * 4))


# nft refuses a longer comment (NFTNL_UDATA_COMMENT_MAXLEN): what it lists it can re-add.
COMMENT_MAX = 128


class NativeChain(NamedTuple):
    name: str
    hook: int
    priority: int = PRIORITY
    kind: str = "nat"
    policy: int = NF_ACCEPT


class Interval(NamedTuple):
    """An inclusive range of a set's keys as integers (ports, or addresses)."""

    lower: int
    upper: int


class NativeSet(NamedTuple):
    """An anonymous constant set of ports or addresses a rule looks up (rule 2). `items` are
    sorted and, for an interval set, disjoint and not adjacent; a plain set's are single
    keys. Planned sets are named by `set_id`; dumped ones by the kernel's `name` (no id)."""

    name: str
    set_id: int | None
    interval: bool
    items: tuple[Interval, ...]
    key_type: int = TYPE_INET_SERVICE
    key_len: int = 2


class NativeRule(NamedTuple):
    chain: str
    exprs: tuple[Expr, ...]
    comment: str | None = None
    sets: tuple[NativeSet, ...] = ()  # the sets its `lookup` expressions name


class NativeTable(NamedTuple):
    """One family's `linkerd-proxy-init` table: its base chains and their rules in order."""

    family: Family
    chains: tuple[NativeChain, ...]
    rules: tuple[NativeRule, ...]


CHAINS = (NativeChain(PREROUTING, HOOK_PREROUTING), NativeChain(OUTPUT, HOOK_OUTPUT))

# ----------------------------------------------------------------------------- statements

RETURN = (Immediate(NFT_RETURN),)
TCP = (Meta(NFT_META_L4PROTO), Cmp(NFT_CMP_EQ, bytes([IPPROTO_TCP])))


def _port(value: int) -> bytes:
    return struct.pack(">H", value)


def tcp_dport(ports: PortRange) -> tuple[Expr, ...]:
    load = Payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
    if ports.lower == ports.upper:
        return (*TCP, load, Cmp(NFT_CMP_EQ, _port(ports.lower)))
    return (*TCP, load, Range(NFT_RANGE_EQ, _port(ports.lower), _port(ports.upper)))


def merged(ranges: Sequence[tuple[int, int]]) -> tuple[Interval, ...]:
    """Sorted ranges with overlapping and adjacent ones joined (what nft puts in an interval
    set for a list; the kernel refuses overlapping intervals)."""
    out: list[Interval] = []
    for lower, upper in sorted(ranges):
        if out and lower <= out[-1].upper + 1:
            out[-1] = Interval(out[-1].lower, max(out[-1].upper, upper))
        else:
            out.append(Interval(lower, upper))
    return tuple(out)


def port_list(
    ranges: Sequence[PortRange], set_id: int
) -> tuple[tuple[Expr, ...], tuple[NativeSet, ...]]:
    """`tcp dport { ... }` for a list (rule 2): the expressions and the set they look up."""
    interval = any(r.lower != r.upper for r in ranges)
    items = merged(ranges) if interval else tuple(sorted({Interval(*r) for r in ranges}))
    if len(items) == 1:
        return tcp_dport(PortRange(*items[0])), ()
    load = Payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2)
    lookup = Lookup(SET_TEMPLATE, NFT_REG_1, set_id)
    return (*TCP, load, lookup), (NativeSet(SET_TEMPLATE, set_id, interval, items),)


def subnet_list(
    subnets: Sequence[str], family: Family, set_id: int
) -> tuple[tuple[Expr, ...], tuple[NativeSet, ...]]:
    """`ip saddr { ... }` for two or more subnets: an interval set of the merged networks."""
    networks = [parse_subnet(s) for s in subnets]
    items = merged([(int(n.network_address), int(n.broadcast_address)) for n in networks])
    offset, length = SADDR[family]
    lookup = Lookup(SET_TEMPLATE, NFT_REG_1, set_id)
    address_set = NativeSet(SET_TEMPLATE, set_id, True, items, ADDRESS_TYPE[family], length)
    return (Payload(NFT_PAYLOAD_NETWORK_HEADER, offset, length), lookup), (address_set,)


def set_elements(key_set: NativeSet) -> list[tuple[bytes, int]]:
    """(key, flags) of each element as nft sends them: a plain set's keys; an interval
    set's starts and ends (the key after each range, flagged), led by an end at 0 and
    without an end past the largest key."""
    size, top = key_set.key_len, (1 << (8 * key_set.key_len)) - 1
    if not key_set.interval:
        return [(r.lower.to_bytes(size, "big"), 0) for r in key_set.items]
    end = NFT_SET_ELEM_INTERVAL_END
    out = [(bytes(size), end)] if key_set.items[0].lower > 0 else []
    for r in key_set.items:
        out.append((r.lower.to_bytes(size, "big"), 0))
        if r.upper < top:
            out.append(((r.upper + 1).to_bytes(size, "big"), end))
    return out


def items_from_elements(
    elements: Sequence[tuple[bytes, int]], interval: bool, key_len: int = 2
) -> tuple[Interval, ...]:
    """The inverse of set_elements for a dumped set (its elements in any order)."""
    keys = sorted((int.from_bytes(k, "big"), f) for k, f in elements if len(k) == key_len)
    if not interval:
        return tuple(Interval(k, k) for k, _ in keys)
    top = (1 << (8 * key_len)) - 1
    out: list[Interval] = []
    start: int | None = None
    for key, flags in keys:
        if flags & NFT_SET_ELEM_INTERVAL_END:
            if start is not None:
                out.append(Interval(start, key - 1))
            start = None
        else:
            if start is not None:  # two starts: the first ends where the second begins
                out.append(Interval(start, key - 1))
            start = key
    if start is not None:
        out.append(Interval(start, top))
    return tuple(out)


def saddr(subnet: str, family: Family) -> tuple[Expr, ...]:
    """`ip saddr NET` / `ip6 saddr NET`; nothing for a /0 (iptables-save omits it too)."""
    network = parse_subnet(subnet)
    if not network.prefixlen:
        return ()
    offset, length = SADDR[family]
    load = Payload(NFT_PAYLOAD_NETWORK_HEADER, offset, length)
    address = network.network_address.packed
    if network.prefixlen == network.max_prefixlen:
        return (load, Cmp(NFT_CMP_EQ, address))
    mask = Bitwise(network.netmask.packed, bytes(length))
    return (load, mask, Cmp(NFT_CMP_EQ, address))


def meta_id(key: int, value: int) -> tuple[Expr, ...]:
    """`meta skuid N` / `meta skgid N`: the id is host-endian, as the kernel stores it."""
    return (Meta(key), Cmp(NFT_CMP_EQ, struct.pack("=I", value)))


def oifname(name: str) -> tuple[Expr, ...]:
    return (Meta(NFT_META_OIFNAME), Cmp(NFT_CMP_EQ, name.encode().ljust(IFNAMSIZ, b"\0")))


def redirect(to_port: int) -> tuple[Expr, ...]:
    return (
        ImmediateData(_port(to_port), NFT_REG_1),
        Redir(NFT_REG_1, NFT_REG_1, x.NF_NAT_RANGE_PROTO_SPECIFIED),
    )


# ----------------------------------------------------------------------------- the plan


def _ranges(items: Sequence[str]) -> list[PortRange]:
    """The valid items of a port list, in order; the invalid ones are dropped (and logged by
    the plugin) exactly as the iptables mode drops them (proxy_init.group_ports)."""
    out = []
    for item in items:
        try:
            out.append(parse_port_range(item, Syntax.LINKERD))
        except ValueError:
            continue
    return out


def _rule(
    chain: str, exprs: tuple[Expr, ...], text: str, sets: tuple[NativeSet, ...] = ()
) -> NativeRule:
    return NativeRule(chain, exprs, COMMENT_PREFIX + text, sets)


def list_comment(head: str, items: Sequence[str], tail: str = "") -> str:
    """upstream's comment for a list, `HEAD1,2,3TAIL`, with as many items as COMMENT_MAX
    allows (with the prefix); a cut list ends `,...`."""
    room = COMMENT_MAX - len(COMMENT_PREFIX) - len(head) - len(tail)
    text = ",".join(items)
    if len(text) > room:
        kept: list[str] = []
        for item in items:
            if len(",".join([*kept, item, "..."])) > room:
                break
            kept.append(item)
        text = ",".join([*kept, "..."])
    return f"{head}{text}{tail}"


def _list_rule(
    chain: str, ranges: Sequence[PortRange], tail: tuple[Expr, ...], text: str, set_id: int
) -> NativeRule:
    exprs, sets = port_list(ranges, set_id)
    return NativeRule(chain, (*exprs, *tail), COMMENT_PREFIX + text, sets)


def native_table(options: ProxyInitOptions, family: Family) -> NativeTable:
    """The table ADD programs for `options` (rule 1: FirewallError as the iptables mode)."""
    build_rules(options, family, backend="nft")
    options = validate_options(options)
    pre = PREROUTING
    set_ids = iter(range(SET_ID_BASE[family], SET_ID_BASE[family] + 4))
    rules: list[NativeRule] = []
    if inbound_ignored := _ranges(options.inbound_ports_to_ignore):
        text = list_comment("ignore-port-", [r.render("-") for r in inbound_ignored])
        rules.append(_list_rule(pre, inbound_ignored, RETURN, text, next(set_ids)))
    # the family's own subnets only, as the iptables mode (proxy_init.subnets_of_family)
    subnets = subnets_of_family(options.subnets_to_ignore, family)
    if len(subnets) == 1:
        subnet = subnets[0]
        rules.append(_rule(pre, (*saddr(subnet, family), *RETURN), f"ignore-subnet-{subnet}"))
    elif subnets:
        exprs, sets = subnet_list(subnets, family, next(set_ids))
        text = list_comment("ignore-subnet-", subnets)
        rules.append(NativeRule(pre, (*exprs, *RETURN), COMMENT_PREFIX + text, sets))
    inbound = options.incoming_proxy_port
    if ports := options.ports_to_redirect:
        text = list_comment("redirect-port-", [str(p) for p in ports], "-to-proxy-port")
        ranges = [PortRange(p, p) for p in ports]
        rules.append(_list_rule(pre, ranges, redirect(inbound), text, next(set_ids)))
    else:
        rules.append(_rule(pre, (*TCP, *redirect(inbound)), "redirect-all-incoming-to-proxy-port"))
    if options.proxy_uid > 0:
        exprs = (*meta_id(NFT_META_SKUID, options.proxy_uid), *RETURN)
        rules.append(_rule(OUTPUT, exprs, "ignore-proxy-user-id"))
    if options.proxy_gid > 0:
        exprs = (*meta_id(NFT_META_SKGID, options.proxy_gid), *RETURN)
        rules.append(_rule(OUTPUT, exprs, "ignore-proxy-group-id"))
    rules.append(_rule(OUTPUT, (*oifname("lo"), *RETURN), "ignore-loopback"))
    if outbound_ignored := _ranges(options.outbound_ports_to_ignore):
        text = list_comment("ignore-port-", [r.render("-") for r in outbound_ignored])
        rules.append(_list_rule(OUTPUT, outbound_ignored, RETURN, text, next(set_ids)))
    outbound = options.outgoing_proxy_port
    rules.append(_rule(OUTPUT, (*TCP, *redirect(outbound)), "redirect-all-outgoing-to-proxy-port"))
    return NativeTable(family, CHAINS, tuple(rules))


# ----------------------------------------------------------------------------- the batch


def _udata_comment(text: str) -> bytes:
    value = text.encode() + b"\0"
    return bytes([NFTNL_UDATA_RULE_COMMENT, len(value)]) + value


def _rule_body(rule: NativeRule) -> bytes:
    exprs = b"".join(encode_expr(e) for e in rule.exprs)
    body = attr_str(NFTA_RULE_TABLE, TABLE) + attr_str(NFTA_RULE_CHAIN, rule.chain)
    body += nested(NFTA_RULE_EXPRESSIONS, exprs)
    if rule.comment is not None:
        body += attr(NFTA_RULE_USERDATA, _udata_comment(rule.comment))
    return body


def _set_body(port_set: NativeSet, size: int) -> bytes:
    assert port_set.set_id is not None, "a planned set is named by its id"
    flags = NFT_SET_ANONYMOUS | NFT_SET_CONSTANT | (NFT_SET_INTERVAL if port_set.interval else 0)
    body = attr_str(NFTA_SET_TABLE, TABLE) + attr_str(NFTA_SET_NAME, port_set.name)
    body += attr_u32(NFTA_SET_FLAGS, flags) + attr_u32(NFTA_SET_KEY_TYPE, port_set.key_type)
    body += attr_u32(NFTA_SET_KEY_LEN, port_set.key_len) + attr_u32(NFTA_SET_ID, port_set.set_id)
    return body + nested(NFTA_SET_DESC, attr_u32(NFTA_SET_DESC_SIZE, size))


def _element(key: bytes, flags: int) -> bytes:
    body = nested(NFTA_SET_ELEM_KEY, attr(NFTA_DATA_VALUE, key))
    return nested(NFTA_LIST_ELEM, body + (attr_u32(NFTA_SET_ELEM_FLAGS, flags) if flags else b""))


def _set_ops(
    port_set: NativeSet, what: str, fam: Family
) -> list[tuple[int, int, bytes, str, Family]]:
    """NEWSET, then its elements in messages of at most elements_per_message (rule 4)."""
    assert port_set.set_id is not None, "a planned set is named by its id"
    elements = set_elements(port_set)
    ops = [
        (NFT_MSG_NEWSET, NLM_F_CREATE, _set_body(port_set, len(elements)), f"set of {what}", fam)
    ]
    head = attr_str(NFTA_SET_ELEM_LIST_TABLE, TABLE)
    head += attr_str(NFTA_SET_ELEM_LIST_SET, port_set.name)
    head += attr_u32(NFTA_SET_ELEM_LIST_SET_ID, port_set.set_id)
    per = elements_per_message(port_set.key_len)
    for start in range(0, len(elements), per):
        chunk = elements[start : start + per]
        body = head + nested(NFTA_SET_ELEM_LIST_ELEMENTS, *(_element(k, f) for k, f in chunk))
        ops.append((NFT_MSG_NEWSETELEM, NLM_F_CREATE, body, f"elements of the set of {what}", fam))
    return ops


def batch_ops(tables: Sequence[NativeTable]) -> list[tuple[int, int, bytes, str, Family]]:
    """Every message of rule 4's batch, for all of a pod's families."""
    name = attr_str(NFTA_TABLE_NAME, TABLE)
    ops: list[tuple[int, int, bytes, str, Family]] = []
    for table in tables:
        where = f"table {FAMILY_WORD[table.family]} {TABLE}"
        fam = table.family
        ops += [
            (NFT_MSG_NEWTABLE, NLM_F_CREATE, name, f"add {where}", fam),
            (NFT_MSG_DELTABLE, 0, name, f"delete {where}", fam),
            (NFT_MSG_NEWTABLE, NLM_F_CREATE, name, f"add {where}", fam),
        ]
        for chain in table.chains:
            body = base_chain_body(TABLE, chain.name, chain.hook, chain.priority, chain.kind)
            ops.append((NFT_MSG_NEWCHAIN, NLM_F_CREATE, body, f"chain {chain.name}", fam))
        for rule in table.rules:
            what = f"{where} chain {rule.chain}: {_short(render_rule(rule, fam))}"
            for port_set in rule.sets:
                ops += _set_ops(port_set, what, fam)
            ops.append((NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, _rule_body(rule), what, fam))
    return ops


def _short(text: str, limit: int = 200) -> str:
    """A rule's text for an error message: a set of thousands of ports is cut."""
    return text if len(text) <= limit else text[: limit - 5] + " ... }"


def build_native_batch(tables: Sequence[NativeTable], seq: int) -> Batch:
    """One batch (rule 4). No generation guard: its result does not depend on the ruleset."""
    return frame_batch(batch_ops(tables), seq)


def compat_expressions(tables: Sequence[NativeTable]) -> list[Expr]:
    """The xt compat (`match`/`target`) expressions among the tables' rules: none, ever."""
    return [
        e for t in tables for r in t.rules for e in r.exprs if isinstance(e, XtMatch | XtTarget)
    ]


# ----------------------------------------------------------------------------- the dump


def _dumped_set(info: SetInfo, elements: Sequence[SetElements]) -> NativeSet:
    interval = bool(info.flags & NFT_SET_INTERVAL)
    pairs = [e for m in elements if (m.table, m.set_name) == (TABLE, info.name) for e in m.elements]
    items = items_from_elements(pairs, interval, info.key_len) if info.key_len else ()
    return NativeSet(info.name, None, interval, items, info.key_type, info.key_len)


def from_dump(
    family: Family,
    chains: Sequence[ChainInfo],
    rules: Sequence[RuleInfo],
    sets: Sequence[SetInfo] = (),
    elements: Sequence[SetElements] = (),
) -> NativeTable | None:
    """The family's `linkerd-proxy-init` table from a chain, rule, set and element dump
    (None: absent). Chains come in the kernel's order (creation), rules in their chain's
    order; each rule carries the sets its lookups name."""
    mine = [c for c in chains if c.table == TABLE]
    if not mine:
        return None
    out_chains = tuple(
        NativeChain(
            c.name,
            c.hook if c.hook is not None else -1,
            c.priority if c.priority is not None else 0,
            c.kind or "",
            c.policy if c.policy is not None else NF_ACCEPT,
        )
        for c in mine
    )
    by_name = {s.name: _dumped_set(s, elements) for s in sets if s.table == TABLE}

    def named(rule: RuleInfo) -> tuple[NativeSet, ...]:
        names = [e.set_name for e in rule.exprs if isinstance(e, Lookup)]
        return tuple(by_name[n] for n in names if n in by_name)

    out_rules = tuple(
        NativeRule(r.chain, r.exprs, r.comment, named(r))
        for c in mine
        for r in rules
        if r.table == TABLE and r.chain == c.name
    )
    return NativeTable(family, out_chains, out_rules)


# ----------------------------------------------------------------------------- text


def _prio(chain: NativeChain) -> str:
    # nft names -100 `dstnat` only at prerouting (its standard priority table).
    if chain.priority == PRIORITY and chain.hook == HOOK_PREROUTING:
        return "dstnat"
    return str(chain.priority)


def render(table: NativeTable | None, family: Family) -> list[str]:
    """`nft list table ip linkerd-proxy-init` for the table, line by line (tabs as nft);
    an absent table is one line saying so."""
    word = FAMILY_WORD[family]
    if table is None:
        return [f"# no table {word} {TABLE}"]
    lines = [f"table {word} {TABLE} {{"]
    for i, chain in enumerate(table.chains):
        if i:
            lines.append("")
        lines.append(f"\tchain {chain.name} {{")
        if chain.hook >= 0:
            hook = HOOK_NAMES.get(chain.hook, str(chain.hook))
            policy = "accept" if chain.policy == NF_ACCEPT else "drop"
            lines.append(
                f"\t\ttype {chain.kind} hook {hook} priority {_prio(chain)}; policy {policy};"
            )
        lines += [f"\t\t{render_rule(r, family)}" for r in table.rules if r.chain == chain.name]
        lines.append("\t}")
    lines.append("}")
    return lines


def render_rule(rule: NativeRule, family: Family) -> str:
    """One rule as nft prints it; expressions outside this module's vocabulary are shown
    raw (`<expr ...>`), so a foreign rule never reads as one of ours."""
    words = _statements(list(rule.exprs), family, rule.sets)
    if rule.comment is not None:
        words.append(f'comment "{rule.comment}"')
    return " ".join(words)


def _statements(  # noqa: PLR0911
    exprs: list[Expr], family: Family, sets: Sequence[NativeSet] = ()
) -> list[str]:
    # Constants in patterns are dotted (`x.NFT_CMP_EQ`): a bare name would capture.
    if not exprs:
        return []
    match exprs:
        case [Meta(x.NFT_META_L4PROTO, 1), Cmp(x.NFT_CMP_EQ, b"\x06", 1),
              Payload(x.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, 1), Lookup(_, 1) as lookup,
              *rest] if (text := _set_text(lookup, sets, family)):  # fmt: skip
            return [f"tcp dport {text}", *_statements(rest, family, sets)]
        case [Payload(x.NFT_PAYLOAD_NETWORK_HEADER, offset, length, 1), Lookup(_, 1) as lookup,
              *rest] if (offset, length) == SADDR[family] and (
            text := _set_text(lookup, sets, family)
        ):  # fmt: skip
            return [f"{FAMILY_WORD[family]} saddr {text}", *_statements(rest, family, sets)]
        case [Meta(x.NFT_META_L4PROTO, 1), Cmp(x.NFT_CMP_EQ, b"\x06", 1),
              Payload(x.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, 1), value, *rest] if (
            ports := _dport(value)
        ):  # fmt: skip
            return [f"tcp dport {ports}", *_statements(rest, family, sets)]
        case [Meta(x.NFT_META_L4PROTO, 1), Cmp(x.NFT_CMP_EQ, b"\x06", 1), *rest]:
            return ["meta l4proto tcp", *_statements(rest, family, sets)]
        case [Meta(x.NFT_META_SKUID | x.NFT_META_SKGID as key, 1), Cmp(x.NFT_CMP_EQ, value, 1),
              *rest] if len(value) == 4:  # fmt: skip
            name = "skuid" if key == x.NFT_META_SKUID else "skgid"
            (number,) = struct.unpack("=I", value)
            return [f"meta {name} {number}", *_statements(rest, family, sets)]
        case [Meta(x.NFT_META_OIFNAME, 1), Cmp(x.NFT_CMP_EQ, name, 1), *rest] if (
            len(name) == IFNAMSIZ
        ):
            text = name.rstrip(b"\0").decode(errors="replace")
            return [f'oifname "{text}"', *_statements(rest, family, sets)]
        case [Payload(x.NFT_PAYLOAD_NETWORK_HEADER, offset, length, 1), *rest] if (
            offset,
            length,
        ) == SADDR[family] and (found := _prefix(rest, length)) is not None:
            text, rest = found
            return [f"{FAMILY_WORD[family]} saddr {text}", *_statements(rest, family, sets)]
        case [ImmediateData(port, 1), Redir(1, 1, x.NF_NAT_RANGE_PROTO_SPECIFIED), *rest] if (
            len(port) == 2
        ):
            return [f"redirect to :{_u16(port)}", *_statements(rest, family, sets)]
        case [Immediate(x.NFT_RETURN, None, 0), *rest]:
            return ["return", *_statements(rest, family, sets)]
    return [f"<expr {exprs[0]!r}>", *_statements(exprs[1:], family, sets)]


def _set_text(lookup: Lookup, sets: Sequence[NativeSet], family: Family) -> str:
    """`{ 80, 4190-4191 }` / `{ 10.0.0.0/8, 172.16.0.1 }` as nft prints a set of ports or of
    the family's addresses (sorted; a range `L-U`, an aligned one as a prefix); "" when
    the set is not there or of another kind (the lookup is then shown raw)."""
    kinds = {(TYPE_INET_SERVICE, 2): None, (ADDRESS_TYPE[family], SADDR[family][1]): family}
    for key_set in sets:
        mine = (
            lookup.set_name == key_set.name
            if lookup.set_id is None
            else lookup.set_id == key_set.set_id
        )
        if mine and (key_set.key_type, key_set.key_len) in kinds and key_set.items:
            of = kinds[key_set.key_type, key_set.key_len]
            texts = [
                PortRange(*r).render("-") if of is None else _address_range(r, of)
                for r in key_set.items
            ]
            return "{ " + ", ".join(texts) + " }"
    return ""


def _address_range(r: Interval, family: Family) -> str:
    address = ipaddress.IPv4Address if family is Family.IPV4 else ipaddress.IPv6Address
    size = r.upper - r.lower + 1
    if size & (size - 1) == 0 and r.lower % size == 0:  # a prefix
        if size == 1:
            return str(address(r.lower))
        width = SADDR[family][1] * 8
        return f"{address(r.lower)}/{width - size.bit_length() + 1}"
    return f"{address(r.lower)}-{address(r.upper)}"


def _dport(expr: Expr) -> str:
    """`P` or `L-U` from the comparison after a destination port load ("" for another)."""
    match expr:
        case Cmp(x.NFT_CMP_EQ, port, 1) if len(port) == 2:
            return str(_u16(port))
        case Range(x.NFT_RANGE_EQ, lo, hi, 1) if len(lo) == len(hi) == 2:
            return f"{_u16(lo)}-{_u16(hi)}"
    return ""


def _u16(data: bytes) -> int:
    return int(struct.unpack(">H", data)[0])


def _prefix(rest: list[Expr], length: int) -> tuple[str, list[Expr]] | None:
    """`ADDR` or `NET/LEN` from the expressions after a source address load."""
    mask = b"\xff" * length
    match rest:
        case [Bitwise(m, xor, 1, 1), Cmp(x.NFT_CMP_EQ, value, 1), *tail] if len(m) == len(
            value
        ) == length and xor == bytes(length):
            mask = m
        case [Cmp(x.NFT_CMP_EQ, value, 1), *tail] if len(value) == length:
            pass
        case _:
            return None
    prefixlen = _prefixlen(mask)
    if prefixlen < 0:
        return None
    network = ipaddress.ip_network((value, prefixlen), strict=False)
    if network.network_address.packed != value:
        return None  # host bits set: not what a prefix match sends
    whole = prefixlen == network.max_prefixlen
    return (str(network.network_address) if whole else str(network)), tail


def _prefixlen(mask: bytes) -> int:
    bits = int.from_bytes(mask, "big")
    width = len(mask) * 8
    ones = bin(bits).count("1")
    if bits != ((1 << width) - 1) ^ ((1 << (width - ones)) - 1):
        return -1  # not a prefix mask
    return ones


def diff_text(expected: Sequence[str], actual: Sequence[str], source: str = "live") -> str:
    """A unified diff of two `render`ed tables ("" when equal), for CHECK and the verifier."""
    if list(expected) == list(actual):
        return ""
    lines = difflib.unified_diff(expected, actual, "expected", source, lineterm="")
    return "\n".join(lines)


def extract_table(lines: Sequence[str], family: Family) -> list[str]:
    """The family's `linkerd-proxy-init` block of an `nft list ruleset`/`list table` text
    (blank lines between chains kept, trailing spaces dropped); `render`'s absent line if
    there is none, so a text compares with a live dump line by line."""
    head = f"table {FAMILY_WORD[family]} {TABLE} {{"
    out: list[str] = []
    for raw in lines:
        line = raw.rstrip()
        if not out and line == head:
            out.append(line)
        elif out:
            out.append(line)
            if line == "}":
                return out
    return out or render(None, family)
