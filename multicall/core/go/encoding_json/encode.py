"""Go's JSON encoding (encoding/json encode.go) of plain values."""

from __future__ import annotations

import json
from collections.abc import Sequence

_HTML_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def marshal(value: object, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """`json.Marshal` (indent None) or `json.MarshalIndent(v, "", indent spaces)` of plain
    values (dict, list or tuple, str, int, float, bool, None): HTML-safe strings, Go's float
    notation, no trailing newline. `sort_keys` is what Go does for a map; a struct keeps its
    field order, which callers give as the dict's order. Without recursion: a decoded
    document may nest 10000 deep."""
    unit = " " * (indent or 0)
    out: list[str] = []
    # Work in reverse order of output: text to emit (str), or a value to encode at a prefix.
    work: list[str | tuple[object, str | None]] = [(value, None if indent is None else "")]
    while work:
        item = work.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        current, prefix = item
        if isinstance(current, dict):
            pairs = sorted(current.items()) if sort_keys else current.items()
            work += reversed(_container("{}", [(str(k), v) for k, v in pairs], prefix, unit))
        elif isinstance(current, list | tuple):
            work += reversed(_container("[]", [(None, v) for v in current], prefix, unit))
        else:
            out.append(_scalar(current))
    return "".join(out)


def _container(
    brackets: str, items: Sequence[tuple[str | None, object]], prefix: str | None, unit: str
) -> list[str | tuple[object, str | None]]:
    """The pieces of one object or array, in output order."""
    if not items:
        return [brackets]
    inner = None if prefix is None else prefix + unit
    pieces: list[str | tuple[object, str | None]] = [brackets[0]]
    for i, (key, item) in enumerate(items):
        head = "," if i else ""
        if inner is not None:
            head += "\n" + inner
        if key is not None:
            head += quote_string(key) + (":" if inner is None else ": ")
        pieces += [head, (item, inner)]
    pieces.append(brackets[1] if prefix is None else "\n" + prefix + brackets[1])
    return pieces


def _scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return quote_string(value)
    raise TypeError(f"cannot marshal {type(value).__name__} as JSON")


def quote_string(text: str) -> str:
    """A JSON string as encoding/json writes it (UTF-8 kept; <, >, &, U+2028/9 escaped)."""
    return json.dumps(text, ensure_ascii=False).translate(_HTML_SAFE)


def go_float(value: float) -> str:
    """strconv.AppendFloat(f, 'f' or 'e', -1, 64) as encoding/json picks and tidies it."""
    from decimal import Decimal

    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        # Go prints at least two exponent digits, then turns e-07 into e-7.
        sign, digits = exponent[0], exponent[1:].lstrip("0")
        return f"{mantissa}e{sign}{digits}"
    return format(Decimal(repr(value)).normalize(), "f")
