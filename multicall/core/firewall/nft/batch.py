"""A `TableChange` -> one NFNL batch that the kernel commits whole or not at all."""

from __future__ import annotations

import functools
from typing import NamedTuple

from multicall.core.firewall.model import Family, TableChange
from multicall.core.firewall.nft.expr import encode_expr
from multicall.core.firewall.nft.netlink import (
    NFNL_BATCH_GENID,
    NFNL_MSG_BATCH_BEGIN,
    NFNL_MSG_BATCH_END,
    NFNL_SUBSYS_NFTABLES,
    NFPROTO,
    NFT_MSG_DELRULE,
    NFT_MSG_NEWCHAIN,
    NFT_MSG_NEWRULE,
    NFT_MSG_NEWTABLE,
    NFT_RULE_COMPAT_F_INV,
    NFTA_CHAIN_HOOK,
    NFTA_CHAIN_NAME,
    NFTA_CHAIN_POLICY,
    NFTA_CHAIN_TABLE,
    NFTA_CHAIN_TYPE,
    NFTA_HOOK_HOOKNUM,
    NFTA_RULE_CHAIN,
    NFTA_RULE_COMPAT,
    NFTA_RULE_COMPAT_FLAGS,
    NFTA_RULE_COMPAT_PROTO,
    NFTA_RULE_EXPRESSIONS,
    NFTA_RULE_TABLE,
    NFTA_TABLE_NAME,
    NLM_F_ACK,
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_REQUEST,
    attr_str,
    attr_u32,
    build_message,
    nested,
    nft_type,
)
from multicall.core.firewall.nft.rule import encode_rule_tokens
from multicall.core.firewall.ruleset import Rule, render_rule
from multicall.errors import FirewallError

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

# --- the apply batch -----------------------------------------------------------------------


class Batch(NamedTuple):
    """The bytes to send, and what each sequence number was (for error messages)."""

    data: bytes
    requests: dict[int, str]
    last_seq: int


# Pure, and the same rules come again for every pod with the same options: an agent's worker
# encoded the chart's default rules anew for each ADD (~0.9 ms of its ~8 ms). Bounded.
@functools.lru_cache(maxsize=4096)
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


def base_chain_body(table: str, name: str, hook: int, priority: int, kind: str) -> bytes:
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
            body = base_chain_body(table, name, hook, prio, kind)
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
    return frame_batch([(*op, family) for op in ops], seq, genid)


def frame_batch(
    ops: list[tuple[int, int, bytes, str, Family]], seq: int, genid: int | None = None
) -> Batch:
    """Messages (type, extra flags, body, description, family) between BEGIN and END; with
    `genid`, the kernel refuses the batch (ERESTART) if the ruleset moved past it."""
    res = NFNL_SUBSYS_NFTABLES
    guard = attr_u32(NFNL_BATCH_GENID, genid) if genid is not None else b""
    parts = [build_message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, guard, res_id=res)]
    requests: dict[int, str] = {seq: "batch"}
    for i, (msg, flags, body, what, family) in enumerate(ops, start=1):
        parts.append(
            build_message(
                nft_type(msg), NLM_F_REQUEST | NLM_F_ACK | flags, seq + i, NFPROTO[family], body
            )
        )
        requests[seq + i] = what
    end = seq + len(ops) + 1
    parts.append(build_message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, res_id=res))
    return Batch(b"".join(parts), requests, end)
