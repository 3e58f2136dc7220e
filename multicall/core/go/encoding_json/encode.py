"""Go's JSON encoding (encoding/json encode.go) of plain values."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from json.encoder import encode_basestring as _quote  # json.dumps(s, ensure_ascii=False)
from typing import cast


class Rendered(str):
    """Text `marshal` already produced for a value (same `indent` and `sort_keys`, at the
    top level): written as it is, its lines indented to where it stands. The installer
    renders its linkerd plugin once and puts it into each of 10,000 configs (issue 30 item
    6); the HTML escapes applied again to it change nothing (they hold none of those
    characters)."""


_HTML_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def marshal(value: object, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """`json.Marshal` (indent None) or `json.MarshalIndent(v, "", indent spaces)` of plain
    values (dict, list or tuple, str, int, float, bool, None): HTML-safe strings, Go's float
    notation, no trailing newline. `sort_keys` is what Go does for a map; a struct keeps its
    field order, which callers give as the dict's order. Without recursion: a decoded
    document may nest 10000 deep. Strings go through the json module's C encoder and the
    HTML escapes are applied once to the whole text (outside strings Go's output holds none
    of those characters): the installer renders every CNI config with it, and this is
    several times faster than a piece list per container (issue 30 item 6)."""
    pretty = indent is not None
    unit = " " * (indent or 0)
    colon = ": " if pretty else ":"
    out: list[str] = []
    append = out.append
    # One frame per open container: its items, whether it is an object, the text before
    # each item after the first, the closing text, and the indent of its items.
    stack: list[tuple[Iterator[object], bool, str, str, str]] = []
    current: object = value
    prefix = ""
    while True:
        opened = True
        if isinstance(current, dict) and current:
            pairs = sorted(current.items()) if sort_keys else current.items()
            stack.append(_open(iter(pairs), "{}", prefix, unit if pretty else None, append))
        elif isinstance(current, list | tuple) and current:
            stack.append(_open(iter(current), "[]", prefix, unit if pretty else None, append))
        elif type(current) is Rendered:
            opened = False
            # Its newlines are all between its items (strings hold escaped ones only).
            append(current.replace("\n", "\n" + prefix) if prefix else current)
        else:
            opened = False
            empty = isinstance(current, dict | list | tuple)
            append(_empty(current) if empty else _scalar(current))
        while stack:
            items, is_object, separator, closing, inner = stack[-1]
            item = next(items, _END)
            if item is _END:
                append(closing)
                stack.pop()
                opened = False
                continue
            if not opened:
                append(separator)
            if is_object:
                key, current = cast(tuple[object, object], item)
                append(_quote(str(key)) + colon)
            else:
                current = item
            prefix = inner
            break
        else:
            return "".join(out).translate(_HTML_SAFE)


_END = object()


def _open(
    items: Iterator[object],
    brackets: str,
    prefix: str,
    unit: str | None,
    append: Callable[[str], None],
) -> tuple[Iterator[object], bool, str, str, str]:
    """Write a non-empty container's opening (`unit` None: compact) and return its frame."""
    is_object = brackets == "{}"
    if unit is None:
        append(brackets[0])
        return (items, is_object, ",", brackets[1], "")
    inner = prefix + unit
    append(brackets[0] + "\n" + inner)
    return (items, is_object, ",\n" + inner, "\n" + prefix + brackets[1], inner)


def _empty(value: object) -> str:
    return "{}" if isinstance(value, dict) else "[]"


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
        return _quote(value)  # escaped for HTML by marshal
    raise TypeError(f"cannot marshal {type(value).__name__} as JSON")


def quote_string(text: str) -> str:
    """A JSON string as encoding/json writes it (UTF-8 kept; <, >, &, U+2028/9 escaped)."""
    return _quote(text).translate(_HTML_SAFE)


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
