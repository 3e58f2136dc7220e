"""A firewall port that passes every call on to another one and remembers what it programmed.

Its users need to know, after a plugin run through the seam, whether ADD programmed rules
and with what: the repair controller checks exactly those rules in the sandbox afterwards
(plugin/in_place.py); the node agent only asks whether rules were applied (to warm the next
workers). One wrapper serves both, so what "programmed" means is decided once: an `apply`
that returned (a failed one raised, and programmed nothing by the port's contract).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
    from multicall.core.firewall.nft.native import NativeTable
    from multicall.core.firewall.ruleset import Table
    from multicall.core.logs import MessageLog
    from multicall.effects.ns import NetnsRef
    from multicall.plugin.ports import Firewall


@dataclass(frozen=True, slots=True)
class Programmed:
    """What one successful `Firewall.apply` call programmed."""

    netns: NetnsRef
    options: ProxyInitOptions
    mode: Mode
    families: tuple[Family, ...]


class RecordingFirewall:
    """The `Firewall` port over `inner`, recording the last successful `apply` in
    `programmed` (None until one succeeds); reads pass through unrecorded."""

    def __init__(self, inner: Firewall) -> None:
        self.inner = inner
        self.programmed: Programmed | None = None

    def apply(
        self,
        netns: NetnsRef,
        options: ProxyInitOptions,
        *,
        mode: Mode,
        families: tuple[Family, ...],
        log: MessageLog,
    ) -> None:
        self.inner.apply(netns, options, mode=mode, families=families, log=log)
        self.programmed = Programmed(netns, options, mode, families)

    def dump_nat(self, netns: NetnsRef, *, mode: Mode, family: Family, log: MessageLog) -> Table:
        return self.inner.dump_nat(netns, mode=mode, family=family, log=log)

    def dump_raw(
        self, netns: NetnsRef, *, mode: Mode, family: Family, log: MessageLog
    ) -> Table | None:
        return self.inner.dump_raw(netns, mode=mode, family=family, log=log)

    def dump_native(
        self, netns: NetnsRef, *, family: Family, log: MessageLog
    ) -> NativeTable | None:
        return self.inner.dump_native(netns, family=family, log=log)
