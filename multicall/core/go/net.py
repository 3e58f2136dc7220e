"""Go's net.ParseIP / net.ParseCIDR and the way Go prints what they parsed.

`ipaddress` is imported inside the functions, and only for IPv6: an IPv4 dotted quad Go
accepts is already printed the way Go prints it (no leading zeros, each part < 256), so the
IPv4 addresses of a pod's prevResult cost no import (~1 ms of a one-shot ADD).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ipaddress

_V4_PART = re.compile(r"0|[1-9][0-9]{0,2}")
_MASK_MAX = 0xFFFFFF  # Go's dtoi gives up at this size


def _go_v4(text: str) -> bool:
    """A dotted quad `net.ParseIP` accepts (no leading zeros, each part < 256)."""
    parts = text.split(".")
    return len(parts) == 4 and all(_V4_PART.fullmatch(p) and int(p) < 256 for p in parts)


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`net.ParseIP`: dotted quad without leading zeros, or IPv6 without a zone; else None."""
    import ipaddress

    if is_ipv4_text(text):
        return ipaddress.IPv4Address(text) if _go_v4(text) else None
    if "%" in text or not text.isascii():
        return None
    try:
        return ipaddress.IPv6Address(text)
    except ValueError:
        return None


def _prefix(text: str) -> tuple[str, int] | None:
    """`net.ParseCIDR`'s split: (address text, prefix length) or None."""
    addr, slash, mask = text.partition("/")
    if not slash or not mask.isdigit() or not mask.isascii() or int(mask) > _MASK_MAX:
        return None
    return addr, int(mask)


def parse_cidr(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """`net.ParseCIDR`: the address (host bits kept) and the prefix length; None on error."""
    split = _prefix(text)
    if split is None:
        return None
    addr, bits = split
    ip = parse_ip(addr)
    if ip is None or bits > ip.max_prefixlen:
        return None
    return ip, bits


def _ip_string(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    import ipaddress

    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return ip.compressed


def go_ip(text: str) -> str | None:
    """`net.ParseIP(text).String()`, or None where Go fails to parse."""
    if is_ipv4_text(text):
        return text if _go_v4(text) else None
    ip = parse_ip(text)
    return None if ip is None else _ip_string(ip)


def go_cidr(text: str) -> str | None:
    """`types.ParseCIDR(text)` printed back: the address keeps its host bits."""
    split = _prefix(text)
    if split is not None and is_ipv4_text(split[0]):
        addr, bits = split
        return f"{addr}/{bits}" if _go_v4(addr) and bits <= 32 else None
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
    false for Go's "<nil>" (an absent address). On any text: whether to parse it as IPv4."""
    return "." in text and ":" not in text
