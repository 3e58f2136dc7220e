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
    field order, which callers give as the dict's order."""
    out: list[str] = []
    _encode(value, out, None if indent is None else "", " " * (indent or 0), sort_keys)
    return "".join(out)


def _encode(value: object, out: list[str], prefix: str | None, unit: str, sort: bool) -> None:
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in (sorted(value.items()) if sort else value.items())]
        _container("{}", items, out, prefix=prefix, unit=unit, sort=sort)
    elif isinstance(value, list | tuple):
        _container("[]", [(None, v) for v in value], out, prefix=prefix, unit=unit, sort=sort)
    else:
        out.append(_scalar(value))


def _container(
    brackets: str,
    items: Sequence[tuple[str | None, object]],
    out: list[str],
    *,
    prefix: str | None,
    unit: str,
    sort: bool,
) -> None:
    if not items:
        out.append(brackets)
        return
    inner = None if prefix is None else prefix + unit
    out.append(brackets[0])
    for i, (key, item) in enumerate(items):
        out.append("," if i else "")
        if inner is not None:
            out.append("\n" + inner)
        if key is not None:
            out.append(quote_string(key) + (":" if inner is None else ": "))
        _encode(item, out, inner, unit, sort)
    if prefix is not None:
        out.append("\n" + prefix)
    out.append(brackets[1])


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
