"""Values that cross the firewall seam: the effective proxy-init options, the change a backend
applies, and the backend Protocol.

Rules of this module:
1. `ProxyInitOptions` is what upstream calls the firewall configuration after the annotation
   merge (docs/upstream-behaviour.md §3-4): port lists stay strings, because invalid entries
   are dropped (and logged) only when the rules are built, exactly as upstream does.
2. A backend applies a `TableChange` atomically (legacy: one libiptc commit; nft: one netlink
   batch) in the network namespace the calling thread is in; the caller enters the pod netns.
3. Rules inside a change are canonical `Rule`s (the form `iptables-save` prints); each backend
   encodes them its own way and its `dump` decodes back to the same canonical form.
4. A change is planned from a `Snapshot` and applied against it: a backend that can tell
   (nft's generation id, libiptc's commit) refuses with `FirewallConflict` when the table moved
   since, and the engine plans again from a fresh snapshot (never a stale plan twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from multicall.core.firewall.ruleset import Rule, Table

REDIRECT_CHAIN = "PROXY_INIT_REDIRECT"
OUTPUT_CHAIN = "PROXY_INIT_OUTPUT"
# xt_comment_info's buffer: iptables (legacy and nft, 1.8.9) keeps the first 255 bytes of a
# longer --comment and says nothing.
COMMENT_LEN = 256


class Family(Enum):
    IPV4 = "ipv4"
    IPV6 = "ipv6"


def families(*, ipv6: bool) -> tuple[Family, ...]:
    """The families ADD programs: IPv4, and IPv6 when the config's `ipv6` says so."""
    return (Family.IPV4, Family.IPV6) if ipv6 else (Family.IPV4,)


class Mode(Enum):
    """`linkerd.iptables-mode`: which kernel interface the rules go to."""

    LEGACY = "legacy"
    NFT = "nft"
    PLAIN = "plain"  # detect: legacy if it already has rules here, else nft, else legacy
    # cnibox's own: native nf_tables rules in tables of their own, no iptables table and no
    # xt compat expression (core/firewall/nft/native.py, docs/firewall.md)
    NFTABLES = "nftables"


@dataclass(frozen=True, slots=True)
class ProxyInitOptions:
    """proxy-init's settings: what the redirect rules are made from."""

    incoming_proxy_port: int = 4143
    outgoing_proxy_port: int = 4140
    proxy_uid: int = 2102
    proxy_gid: int = 0
    ports_to_redirect: tuple[int, ...] = ()
    inbound_ports_to_ignore: tuple[str, ...] = ()
    outbound_ports_to_ignore: tuple[str, ...] = ()
    subnets_to_ignore: tuple[str, ...] = ()
    use_wait_flag: bool = False


@dataclass(frozen=True, slots=True)
class TableChange:
    """Create missing chains, flush existing ones, then append rules, as one transaction."""

    table: str
    create_chains: tuple[str, ...]
    flush_chains: tuple[str, ...]
    append: tuple[Rule, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A table as read at one moment, for planning a change and applying it against that moment.

    `version` is the backend's token for "nothing changed since" (nf_tables' ruleset
    generation id; None for libiptc, whose commit checks on its own). `present` names the
    chains the kernel really holds (a dump lists built-in chains even when absent).
    """

    table: Table
    version: int | None = None
    present: frozenset[str] = frozenset()


class FirewallBackend(Protocol):
    """One kernel interface (legacy x_tables or nf_tables), for one family at a time."""

    @property
    def name(self) -> str: ...

    def dump(self, family: Family, table: str = "nat") -> Table:
        """The table as `iptables-save` would print it (canonical rules), without host tools."""
        ...

    def snapshot(self, family: Family, table: str = "nat") -> Snapshot:
        """The table and the moment it was read at (what `apply`'s `base` expects)."""
        ...

    def apply(self, family: Family, change: TableChange, base: Snapshot | None = None) -> None:
        """Apply `change` atomically; on any error the table is left as it was.

        With `base` (the snapshot the change was planned from), FirewallConflict when the
        table changed since; without, the change is applied to whatever the table is now.
        """
        ...

    def has_rules(self, family: Family) -> bool:
        """Whether any table of this backend holds rules here (for `plain` detection)."""
        ...
