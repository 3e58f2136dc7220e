"""The one protocol table: numbers, the names iptables prints, the names it reads.

Debian's iptables-save prints a protocol by its /etc/protocols name (`ipv6-icmp`); where
/etc/protocols lacks one (an empty root), libxtables falls back to its own short list
(`xtables_chain_protos`: `icmpv6`). Both spellings, and a few aliases, are read back.
"""

from __future__ import annotations

from typing import NamedTuple


class Protocol(NamedTuple):
    number: int
    name: str  # /etc/protocols (Debian netbase), as iptables-save prints it
    xtables: str | None = None  # xtables_chain_protos' name, None when it has none
    aliases: tuple[str, ...] = ()


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol(0, "all", "all"),
    Protocol(1, "icmp", "icmp"),
    Protocol(2, "igmp"),
    Protocol(6, "tcp", "tcp"),
    Protocol(17, "udp", "udp"),
    Protocol(33, "dccp"),
    Protocol(47, "gre"),
    Protocol(50, "esp", "esp"),
    Protocol(51, "ah", "ah"),
    Protocol(58, "ipv6-icmp", "icmpv6", ("icmpv6",)),
    Protocol(132, "sctp", "sctp"),
    Protocol(135, "mh", "mh", ("ipv6-mh",)),
    Protocol(136, "udplite", "udplite"),
)
# number -> the name iptables-save prints (0, "all", is never printed: `-p all` vanishes).
SAVE_NAMES: dict[int, str] = {p.number: p.name for p in PROTOCOLS if p.number}
# number -> libxtables' fallback name, for a dump printed without /etc/protocols.
XTABLES_NAMES: dict[int, str] = {p.number: p.xtables for p in PROTOCOLS if p.xtables}
# every spelling iptables reads -> number
NUMBERS: dict[str, int] = {n: p.number for p in PROTOCOLS for n in (p.name, *p.aliases)}


def protocol_number(value: str) -> int | None:
    """The number `-p VALUE` means (a known name, any case, or 0..255), None if unknown."""
    lowered = value.lower()
    if lowered in NUMBERS:
        return NUMBERS[lowered]
    if lowered.isascii() and lowered.isdigit() and len(lowered) <= 3 and int(lowered) < 256:
        return int(lowered)
    return None
