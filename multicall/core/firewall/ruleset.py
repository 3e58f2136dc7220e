"""The iptables rule model shared by the firewall engine, the verifier and CNI CHECK.

Rules of this module:
1. A `Rule`'s `spec` holds the tokens after `-A CHAIN` exactly as `iptables-save` prints them
   (canonical order, `--to-ports`, implicit `-m tcp`, `/32`), unquoted. Builders produce that
   form directly; parsers of save text and kernel dumps produce it too, so equality of models
   is equality of what the kernel holds.
2. Rendering quotes values the way iptables' `xtables_save_string` does.
3. Values are immutable; a table lists its chains in save order (built-ins first, then user
   chains alphabetically) and its rules grouped by chain in that same order.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

BUILTIN_CHAINS: dict[str, tuple[str, ...]] = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
}

_NO_QUOTE = frozenset("_-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ESCAPE = frozenset("\"\\'")
# Options whose value iptables prints through xtables_save_string (quoted when needed).
QUOTED_OPTIONS = frozenset({"--comment", "--log-prefix", "--nflog-prefix"})


@dataclass(frozen=True, slots=True)
class Counters:
    """A chain's packet and byte counters."""

    packets: int
    bytes: int


@dataclass(frozen=True, slots=True)
class Chain:
    """A chain header line: `:NAME POLICY [p:b]`; user chains have policy None (`-`)."""

    name: str
    policy: str | None = None
    counters: Counters | None = None
    # Where a parser found it (1-based), for messages; never part of equality.
    line: int | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Rule:
    """One `-A CHAIN spec...` line."""

    chain: str
    spec: tuple[str, ...]
    counters: Counters | None = None
    # Where a parser found it (1-based), for messages; never part of equality.
    line: int | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Table:
    """One table: its chains and its rules in order."""

    name: str
    chains: tuple[Chain, ...]
    rules: tuple[Rule, ...] = ()

    def chain(self, name: str) -> Chain | None:
        return next((c for c in self.chains if c.name == name), None)

    def rules_of(self, chain: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.chain == chain)


@dataclass(frozen=True, slots=True)
class Ruleset:
    """What `iptables-save` prints for one family: tables in the order they were listed."""

    tables: tuple[Table, ...] = ()
    # Non-rule comment lines such as iptables-nft's "# Warning: iptables-legacy tables present".
    warnings: tuple[str, ...] = field(default=())

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)


def quote_value(value: str) -> str:
    """Quote like xtables_save_string: bare when only [A-Za-z0-9_-], else double-quoted."""
    if value and all(ch in _NO_QUOTE for ch in value):
        return value
    escaped = "".join(f"\\{ch}" if ch in _ESCAPE else ch for ch in value)
    return f'"{escaped}"'


def render_spec(spec: tuple[str, ...]) -> str:
    out: list[str] = []
    quote_next = False
    for token in spec:
        out.append(quote_value(token) if quote_next else token)
        quote_next = token in QUOTED_OPTIONS
    return " ".join(out)


def render_rule(rule: Rule, *, with_counters: bool = False) -> str:
    prefix = ""
    if with_counters and rule.counters is not None:
        prefix = f"[{rule.counters.packets}:{rule.counters.bytes}] "
    body = render_spec(rule.spec)
    return f"{prefix}-A {rule.chain} {body}" if body else f"{prefix}-A {rule.chain}"


def render_chain(chain: Chain) -> str:
    counters = chain.counters or Counters(0, 0)
    return f":{chain.name} {chain.policy or '-'} [{counters.packets}:{counters.bytes}]"


def render_table(table: Table) -> str:
    """The `*table ... COMMIT` block as iptables-save prints it (no header/footer comments)."""
    lines = [f"*{table.name}"]
    lines += [render_chain(c) for c in table.chains]
    lines += [render_rule(r) for r in table.rules]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def save_order(table_name: str, chain_names: set[str] | frozenset[str]) -> tuple[str, ...]:
    """Chain order in save output: built-ins in kernel order, then user chains sorted."""
    builtins = BUILTIN_CHAINS.get(table_name, ())
    users = sorted(n for n in chain_names if n not in builtins)
    return (*builtins, *users)


def format_ipv6(address: ipaddress.IPv6Address) -> str:
    """glibc's inet_ntop, which iptables prints with: Python's compressed form, except that
    IPv4-mapped and -compatible addresses end in dotted quad (`::ffff:10.0.0.0`, `::1.2.3.4`;
    a longer zero run wins: `::1`, `::`)."""
    words = [int.from_bytes(address.packed[i : i + 2], "big") for i in range(0, 16, 2)]
    tail = str(ipaddress.IPv4Address(address.packed[12:]))
    if words[:5] == [0] * 5 and words[5] == 0xFFFF:
        return f"::ffff:{tail}"
    if words[:6] == [0] * 6 and words[6] != 0:
        return f"::{tail}"
    return address.compressed


def format_network(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    """`ADDR/PREFIX` as iptables-save prints it."""
    if isinstance(network, ipaddress.IPv4Network):
        return str(network)
    return f"{format_ipv6(network.network_address)}/{network.prefixlen}"
