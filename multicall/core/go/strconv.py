"""Go's strconv as upstream's messages show it: `Quote` (the `%q` verb) and `Atoi`."""

from __future__ import annotations

import re

MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
_ATOI_SYNTAX = re.compile(r"[+-]?[0-9]+")

_SHORT = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SHORT |= {"\v": "\\v", '"': '\\"', "\\": "\\\\"}


class NumError(ValueError):
    """strconv.NumError: `str()` is Go's text, e.g. `strconv.Atoi: parsing "x": invalid syntax`."""


def go_atoi(text: str) -> int:
    """strconv.Atoi: an optional sign and ASCII digits, in int64 range; NumError otherwise."""
    if not _ATOI_SYNTAX.fullmatch(text):
        raise NumError(f"strconv.Atoi: parsing {go_quote(text)}: invalid syntax")
    value = int(text)
    if not MIN_INT64 <= value <= MAX_INT64:
        raise NumError(f"strconv.Atoi: parsing {go_quote(text)}: value out of range")
    return value


def go_quote(s: str) -> str:
    """`strconv.Quote`: Go's double-quoted, escaped form."""
    out = ['"']
    for ch in s:
        out.append(_quote_rune(ch))
    out.append('"')
    return "".join(out)


def _quote_rune(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    if ch == " " or (code >= 0x20 and ch.isprintable() and not 0xD800 <= code <= 0xDFFF):
        return ch
    if code < 0x80 or code == 0xFFFD:
        return f"\\x{code:02x}" if code < 0x80 else ch
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def go_quote_list(items: list[str]) -> str:
    """`fmt.Sprintf("%q", []string{...})`."""
    return "[" + " ".join(go_quote(s) for s in items) + "]"
