"""Ports and port ranges: the one `PortRange` and the one `parse_port_range`.

`parse_port_range(text, syntax)` reads the three spellings cnibox meets:

    Syntax.LINKERD   `N` or `L-U`          upstream's util.ParsePortRange: the config's port
                                           lists and the skip-*-ports annotations. Bounds are
                                           Go strconv.Atoi (a sign is allowed: `+80`), in
                                           0..65535, L <= U. ValueError with upstream's text;
                                           callers drop the item and log it, as upstream does.
    Syntax.IPTABLES  `N`, `L:U`, `:U`, `L:`  iptables' --sport/--dport and multiport items
                                           (`:U` is 0..U, `L:` is L..65535); ASCII digits
                                           only, no service names. FirewallError with
                                           iptables' text.
    Syntax.TO_PORTS  `N` or `L-U`          REDIRECT's --to-ports; ASCII digits only, and, as
                                           cnibox has always read it, no L <= U check.
                                           FirewallError with iptables' text.

Upstream's messages put the item between plain double quotes (Go's `"\"%s\""`), not
strconv.Quote: a control character in an annotation is printed as it is, as upstream does.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from multicall.core.go.strconv import NumError, go_atoi, leading_uint64
from multicall.errors import FirewallError

PORT_MAX = 65535
# xt_multiport's XT_MULTI_PORTS: a single port costs one slot, a range two.
MULTIPORT_SLOTS = 15


class Syntax(Enum):
    LINKERD = "linkerd"
    IPTABLES = "iptables"
    TO_PORTS = "to-ports"


class PortRange(NamedTuple):
    """An inclusive range of ports; a single port is `PortRange(p, p)`."""

    lower: int
    upper: int

    @property
    def slots(self) -> int:
        """Multiport slots it costs: 1 for a single port (also `N-N`), 2 for a range."""
        return 1 if self.lower == self.upper else 2

    def render(self, separator: str = ":") -> str:
        """`N`, or `L:U` (iptables' match syntax; `-` for --to-ports and owner ids)."""
        if self.lower == self.upper:
            return str(self.lower)
        return f"{self.lower}{separator}{self.upper}"


def is_port(value: int) -> bool:
    return 0 <= value <= PORT_MAX


def parse_port_range(text: str, syntax: Syntax) -> PortRange:
    """A port range in one of the spellings above (see the module docstring)."""
    if syntax is Syntax.LINKERD:
        return _linkerd_range(text)
    if syntax is Syntax.IPTABLES:
        low, sep, high = text.partition(":")
        first = _iptables_port(low) if low or not sep else 0
        last = (_iptables_port(high) if high else PORT_MAX) if sep else first
        if first > last:
            raise FirewallError(f"invalid portrange ({text}) specified")
        return PortRange(first, last)
    low, sep, high = text.partition("-")
    first = _iptables_port(low)
    return PortRange(first, _iptables_port(high) if sep else first)


def _iptables_port(text: str) -> int:
    """xtables_parse_port without /etc/services: a decimal port number."""
    parsed = leading_uint64(text) if text else None  # leading zeros of any length are fine
    if parsed is None or parsed[1] != len(text) or parsed[0] > PORT_MAX:
        raise FirewallError(f"invalid port/service `{text}' specified")
    return parsed[0]


def _linkerd_range(text: str) -> PortRange:
    """util.ParsePortRange: split on `-`, each bound Atoi'd and range-checked."""
    bounds = text.split("-")
    if len(bounds) > 2:
        raise ValueError("ranges expected as <lower>-<upper>")
    if len(bounds) == 1:
        bounds.append(bounds[0])
    lower = _linkerd_bound(bounds[0], "lower")
    upper = _linkerd_bound(bounds[1], "upper")
    if upper < lower:
        raise ValueError(f'"{text}": upper-bound must be greater than or equal to lower-bound')
    return PortRange(lower, upper)


def _linkerd_bound(text: str, which: str) -> int:
    try:
        value = go_atoi(text)
    except NumError:
        value = -1
    if not is_port(value):
        raise ValueError(f'"{text}" is not a valid {which}-bound')
    return value
