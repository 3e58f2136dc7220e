"""Chain and rule dumps from the kernel -> the canonical `Table` iptables-nft-save prints;
set and set element dumps (the native mode's port lists) as values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from multicall.core.firewall.model import Family
from multicall.core.firewall.nft.batch import BASE_CHAINS
from multicall.core.firewall.nft.expr import Expr, decode_exprs
from multicall.core.firewall.nft.netlink import (
    NFTA_CHAIN_COUNTERS,
    NFTA_CHAIN_HOOK,
    NFTA_CHAIN_NAME,
    NFTA_CHAIN_POLICY,
    NFTA_CHAIN_TABLE,
    NFTA_CHAIN_TYPE,
    NFTA_COUNTER_BYTES,
    NFTA_COUNTER_PACKETS,
    NFTA_DATA_VALUE,
    NFTA_HOOK_HOOKNUM,
    NFTA_HOOK_PRIORITY,
    NFTA_LIST_ELEM,
    NFTA_RULE_CHAIN,
    NFTA_RULE_EXPRESSIONS,
    NFTA_RULE_HANDLE,
    NFTA_RULE_TABLE,
    NFTA_RULE_USERDATA,
    NFTA_SET_ELEM_FLAGS,
    NFTA_SET_ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS,
    NFTA_SET_ELEM_LIST_SET,
    NFTA_SET_ELEM_LIST_TABLE,
    NFTA_SET_FLAGS,
    NFTA_SET_KEY_LEN,
    NFTA_SET_KEY_TYPE,
    NFTA_SET_NAME,
    NFTA_SET_TABLE,
    NFTNL_UDATA_RULE_COMMENT,
    Message,
    attr_map,
    cstr,
    iter_attrs,
    s32,
    u32,
    u64,
)
from multicall.core.firewall.nft.rule import decode_rule_tokens
from multicall.core.firewall.ruleset import Chain, Counters, Rule, Table, save_order
from multicall.errors import FirewallError

NF_POLICY = {0: "DROP", 1: "ACCEPT"}

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


class SetInfo(NamedTuple):
    table: str
    name: str
    flags: int
    key_type: int
    key_len: int


class SetElements(NamedTuple):
    """One message of a set element dump: its set and (key, NFTA_SET_ELEM_FLAGS) pairs."""

    table: str
    set_name: str
    elements: tuple[tuple[bytes, int], ...]


def parse_set(msg: Message) -> SetInfo:
    a = attr_map(msg.body)
    return SetInfo(
        table=cstr(a.get(NFTA_SET_TABLE, b"")),
        name=cstr(a.get(NFTA_SET_NAME, b"")),
        flags=u32(a[NFTA_SET_FLAGS]) if NFTA_SET_FLAGS in a else 0,
        key_type=u32(a[NFTA_SET_KEY_TYPE]) if NFTA_SET_KEY_TYPE in a else 0,
        key_len=u32(a[NFTA_SET_KEY_LEN]) if NFTA_SET_KEY_LEN in a else 0,
    )


def parse_set_elements(msg: Message) -> SetElements:
    a = attr_map(msg.body)
    elements = []
    for kind, elem in iter_attrs(a.get(NFTA_SET_ELEM_LIST_ELEMENTS, b"")):
        if kind != NFTA_LIST_ELEM:
            continue
        e = attr_map(elem)
        key = attr_map(e.get(NFTA_SET_ELEM_KEY, b"")).get(NFTA_DATA_VALUE, b"")
        elements.append((key, u32(e[NFTA_SET_ELEM_FLAGS]) if NFTA_SET_ELEM_FLAGS in e else 0))
    return SetElements(
        cstr(a.get(NFTA_SET_ELEM_LIST_TABLE, b"")),
        cstr(a.get(NFTA_SET_ELEM_LIST_SET, b"")),
        tuple(elements),
    )


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
