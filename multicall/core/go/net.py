"""Go's net.ParseIP / net.ParseCIDR and the way Go prints what they parsed.

`ipaddress` is imported inside the functions: only results with addresses need it, and
VERSION and DEL never do.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from multicall.core.go.strconv import ASCII_DIGITS

if TYPE_CHECKING:
    import ipaddress

_V4_PART = re.compile(r"0|[1-9][0-9]{0,2}")
_DTOI_BIG = 0xFFFFFF  # Go's dtoi gives up at this size


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`net.ParseIP`: dotted quad without leading zeros, or IPv6 without a zone; else None."""
    import ipaddress

    if "." in text and ":" not in text:
        parts = text.split(".")
        if len(parts) != 4 or not all(_V4_PART.fullmatch(p) and int(p) < 256 for p in parts):
            return None
        return ipaddress.IPv4Address(text)
    if "%" in text or not text.isascii():
        return None
    try:
        return ipaddress.IPv6Address(text)
    except ValueError:
        return None


def parse_cidr(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """`net.ParseCIDR`: the address (host bits kept) and the prefix length; None on error."""
    addr, slash, mask = text.partition("/")
    bits = _dtoi(mask)
    if not slash or bits is None:
        return None
    ip = parse_ip(addr)
    if ip is None or bits > ip.max_prefixlen:
        return None
    return ip, bits


def _dtoi(text: str) -> int | None:
    """Go net's dtoi over the whole text: ASCII digits, any number of leading zeros (a
    5,000-digit `/000…024` is /24 in Go), below 0xFFFFFF; None otherwise. `int()` sees at
    most 8 digits (CPython refuses over 4,300)."""
    if not text or text.lstrip(ASCII_DIGITS):
        return None
    significant = text.lstrip("0")
    if len(significant) > len(str(_DTOI_BIG)):
        return None
    value = int(significant or "0")
    return value if value < _DTOI_BIG else None


def _ip_string(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    import ipaddress

    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return ip.compressed


def go_ip(text: str) -> str | None:
    """`net.ParseIP(text).String()`, or None where Go fails to parse."""
    ip = parse_ip(text)
    return None if ip is None else _ip_string(ip)


def go_cidr(text: str) -> str | None:
    """`types.ParseCIDR(text)` printed back: the address keeps its host bits."""
    import ipaddress

    parsed = parse_cidr(text)
    if parsed is None:
        return None
    ip, bits = parsed
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return f"{ip.ipv4_mapped}/{max(0, bits - 96)}"
    return f"{_ip_string(ip)}/{bits}"


def is_ipv4_text(text: str) -> bool:
    """Whether a canonical address (as `go_ip`/`go_cidr` print it) is IPv4 (`To4() != nil`);
    false for Go's "<nil>" (an absent address)."""
    return "." in text and ":" not in text
