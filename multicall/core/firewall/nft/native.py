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
   nat chain's ACCEPT), `redirect to :P` where upstream REDIRECTs. A multiport group becomes
   one rule per item (a port or a range): the same set of ports. Comments are upstream's.
3. The expressions are encoded as nft 1.0 encodes these statements (learned from
   `nft --debug=netlink`), except that a port range is one `range` expression (nft: two
   `cmp`) and a prefix is payload+bitwise+cmp (nft: a shorter payload); nft prints both
   the same way.
4. One batch programs every family of a pod: for each table, add (a no-op if present),
   delete, add again, then its chains and rules. The kernel commits it whole or not at all,
   so the result never depends on what was there before and a repeated ADD is idempotent.
5. Pure: values in, bytes and text out (the socket is `multicall.effects.firewall.nft`).
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
from multicall.core.firewall.nft.dump import ChainInfo, RuleInfo
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
    NFT_MSG_NEWTABLE,
    NFTA_RULE_CHAIN,
    NFTA_RULE_EXPRESSIONS,
    NFTA_RULE_TABLE,
    NFTA_RULE_USERDATA,
    NFTA_TABLE_NAME,
    NFTNL_UDATA_RULE_COMMENT,
    NLM_F_APPEND,
    NLM_F_CREATE,
    attr,
    attr_str,
    nested,
)
from multicall.core.firewall.ports import PortRange, Syntax, parse_port_range
from multicall.core.firewall.proxy_init import (
    COMMENT_PREFIX,
    build_rules,
    parse_subnet,
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


class NativeChain(NamedTuple):
    name: str
    hook: int
    priority: int = PRIORITY
    kind: str = "nat"
    policy: int = NF_ACCEPT


class NativeRule(NamedTuple):
    chain: str
    exprs: tuple[Expr, ...]
    comment: str | None = None


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


def _rule(chain: str, exprs: tuple[Expr, ...], text: str) -> NativeRule:
    return NativeRule(chain, exprs, COMMENT_PREFIX + text)


def native_table(options: ProxyInitOptions, family: Family) -> NativeTable:
    """The table ADD programs for `options` (rule 1: FirewallError as the iptables mode)."""
    build_rules(options, family, backend="nft")
    options = validate_options(options)
    pre = PREROUTING
    rules = [
        _rule(pre, (*tcp_dport(r), *RETURN), f"ignore-port-{r.render('-')}")
        for r in _ranges(options.inbound_ports_to_ignore)
    ]
    rules += [
        _rule(pre, (*saddr(s, family), *RETURN), f"ignore-subnet-{s}")
        for s in options.subnets_to_ignore
    ]
    inbound = options.incoming_proxy_port
    if options.ports_to_redirect:
        rules += [
            _rule(pre, (*tcp_dport(PortRange(p, p)), *redirect(inbound)),
                  f"redirect-port-{p}-to-proxy-port")
            for p in options.ports_to_redirect
        ]  # fmt: skip
    else:
        rules.append(_rule(pre, (*TCP, *redirect(inbound)), "redirect-all-incoming-to-proxy-port"))
    if options.proxy_uid > 0:
        exprs = (*meta_id(NFT_META_SKUID, options.proxy_uid), *RETURN)
        rules.append(_rule(OUTPUT, exprs, "ignore-proxy-user-id"))
    if options.proxy_gid > 0:
        exprs = (*meta_id(NFT_META_SKGID, options.proxy_gid), *RETURN)
        rules.append(_rule(OUTPUT, exprs, "ignore-proxy-group-id"))
    rules.append(_rule(OUTPUT, (*oifname("lo"), *RETURN), "ignore-loopback"))
    rules += [
        _rule(OUTPUT, (*tcp_dport(r), *RETURN), f"ignore-port-{r.render('-')}")
        for r in _ranges(options.outbound_ports_to_ignore)
    ]
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
            what = f"{where} chain {rule.chain}: {render_rule(rule, fam)}"
            ops.append((NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, _rule_body(rule), what, fam))
    return ops


def build_native_batch(tables: Sequence[NativeTable], seq: int) -> Batch:
    """One batch (rule 4). No generation guard: its result does not depend on the ruleset."""
    return frame_batch(batch_ops(tables), seq)


def compat_expressions(tables: Sequence[NativeTable]) -> list[Expr]:
    """The xt compat (`match`/`target`) expressions among the tables' rules: none, ever."""
    return [
        e for t in tables for r in t.rules for e in r.exprs if isinstance(e, XtMatch | XtTarget)
    ]


# ----------------------------------------------------------------------------- the dump


def from_dump(
    family: Family, chains: Sequence[ChainInfo], rules: Sequence[RuleInfo]
) -> NativeTable | None:
    """The family's `linkerd-proxy-init` table from a chain and rule dump (None: absent).
    Chains come in the kernel's order (creation), rules in their chain's order."""
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
    out_rules = tuple(
        NativeRule(r.chain, r.exprs, r.comment)
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
    words = _statements(list(rule.exprs), family)
    if rule.comment is not None:
        words.append(f'comment "{rule.comment}"')
    return " ".join(words)


def _statements(exprs: list[Expr], family: Family) -> list[str]:  # noqa: PLR0911
    # Constants in patterns are dotted (`x.NFT_CMP_EQ`): a bare name would capture.
    if not exprs:
        return []
    match exprs:
        case [Meta(x.NFT_META_L4PROTO, 1), Cmp(x.NFT_CMP_EQ, b"\x06", 1),
              Payload(x.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, 1), value, *rest] if (
            ports := _dport(value)
        ):  # fmt: skip
            return [f"tcp dport {ports}", *_statements(rest, family)]
        case [Meta(x.NFT_META_L4PROTO, 1), Cmp(x.NFT_CMP_EQ, b"\x06", 1), *rest]:
            return ["meta l4proto tcp", *_statements(rest, family)]
        case [Meta(x.NFT_META_SKUID | x.NFT_META_SKGID as key, 1), Cmp(x.NFT_CMP_EQ, value, 1),
              *rest] if len(value) == 4:  # fmt: skip
            name = "skuid" if key == x.NFT_META_SKUID else "skgid"
            (number,) = struct.unpack("=I", value)
            return [f"meta {name} {number}", *_statements(rest, family)]
        case [Meta(x.NFT_META_OIFNAME, 1), Cmp(x.NFT_CMP_EQ, name, 1), *rest] if (
            len(name) == IFNAMSIZ
        ):
            text = name.rstrip(b"\0").decode(errors="replace")
            return [f'oifname "{text}"', *_statements(rest, family)]
        case [Payload(x.NFT_PAYLOAD_NETWORK_HEADER, offset, length, 1), *rest] if (
            offset,
            length,
        ) == SADDR[family] and (found := _prefix(rest, length)) is not None:
            text, rest = found
            return [f"{FAMILY_WORD[family]} saddr {text}", *_statements(rest, family)]
        case [ImmediateData(port, 1), Redir(1, 1, x.NF_NAT_RANGE_PROTO_SPECIFIED), *rest] if (
            len(port) == 2
        ):
            return [f"redirect to :{_u16(port)}", *_statements(rest, family)]
        case [Immediate(x.NFT_RETURN, None, 0), *rest]:
            return ["return", *_statements(rest, family)]
    return [f"<expr {exprs[0]!r}>", *_statements(exprs[1:], family)]


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
