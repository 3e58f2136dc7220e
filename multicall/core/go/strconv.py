"""Go's strconv as upstream's messages show it: `Quote` (the `%q` verb) and `Atoi`.

Numbers are read without handing long text to `int()`: CPython refuses more than 4,300
digits (a ValueError whose text would reach the user), while Go reads any length.
"""

from __future__ import annotations

MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)
MAX_UINT64 = 2**64 - 1
ASCII_DIGITS = "0123456789"
# A value of this many significant digits or fewer is converted by `int()`; any more
# overflow uint64 (20 digits), so they are never converted at all.
UINT64_DIGITS = 20

_SHORT = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SHORT |= {"\v": "\\v", '"': '\\"', "\\": "\\\\"}


class NumError(ValueError):
    """strconv.NumError: `str()` is Go's text, e.g. `strconv.Atoi: parsing "x": invalid syntax`."""


def go_atoi(text: str) -> int:
    """strconv.Atoi: an optional sign and ASCII digits, in int64 range; NumError otherwise.

    Any length: leading zeros are free (`"0"*5000 + "7"` is 7). Like Go's ParseUint, the
    digits are read left to right and the first overflow ends the read with the range error,
    before a bad character further on is seen (`"99999999999999999999x"` is out of range).
    """
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body:
        raise NumError(f"strconv.Atoi: parsing {go_quote(text)}: invalid syntax")
    magnitude = leading_uint64(body)
    if magnitude is None:
        raise NumError(f"strconv.Atoi: parsing {go_quote(text)}: value out of range")
    value, end = magnitude
    if end != len(body):
        raise NumError(f"strconv.Atoi: parsing {go_quote(text)}: invalid syntax")
    value = -value if text[0] == "-" else value
    if not MIN_INT64 <= value <= MAX_INT64:
        raise NumError(f"strconv.Atoi: parsing {go_quote(text)}: value out of range")
    return value


def leading_uint64(text: str) -> tuple[int, int] | None:
    """The run of ASCII digits at the start of `text`: its value and where it ends, or None
    when the value overflows uint64 (Go's ParseUint stops there). `int()` only ever sees at
    most UINT64_DIGITS digits."""
    end = len(text) - len(text.lstrip(ASCII_DIGITS))
    significant = text[:end].lstrip("0")
    if len(significant) > UINT64_DIGITS:
        return None
    value = int(significant or "0")
    return None if value > MAX_UINT64 else (value, end)


def go_quote(s: str) -> str:
    """`strconv.Quote`: Go's double-quoted, escaped form."""
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'  # printable ASCII is kept as it is (most log values: paths, words)
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
