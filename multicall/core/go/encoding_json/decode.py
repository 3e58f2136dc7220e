"""Go's JSON decoding (encoding/json decode.go): a valid document into Python values, and
those into a typed schema the way Go's decoder fills a struct (`decode`).

One file (~500 lines), as decode.go is one: the schema kinds and the decoder that walks them
share Go's error texts and its literal-keeping values, and each kind's decode calls the
others recursively (a Struct holds Slices of Structs)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from multicall.core.go.encoding_json.scanner import GoJsonError, quote_char, scan
from multicall.core.go.net import go_cidr, go_ip
from multicall.core.go.strconv import MAX_INT64, MIN_INT64

# --- parsing into Python values ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Number:
    """A JSON number kept as its literal text (Go reports the literal in type errors)."""

    text: str

    def as_float(self) -> float:
        return float(self.text)


class Obj(list[tuple[str, object]]):
    """A JSON object as its key/value pairs, in document order, duplicates kept."""


# json.loads recurses once per level (as does `_scrub_surrogates`): deeper documents, which
# Go accepts up to 10000 levels, are built by `_parse_deep` without recursion.
_RECURSION_SAFE_DEPTH = 100


def parse(data: bytes) -> object:
    """A valid JSON document as Python values: objects are key/value pair lists (duplicates
    and order kept), numbers are `Number`s. Raises GoJsonError with Go's syntax error text."""
    problem, depth = scan(data)
    if problem is not None:
        raise GoJsonError(problem)
    # Go replaces invalid UTF-8 and lone surrogate escapes with U+FFFD instead of failing.
    text = data.decode("utf-8", "replace")
    if depth > _RECURSION_SAFE_DEPTH:
        return _parse_deep(text)
    value: object = json.loads(
        text,
        object_pairs_hook=Obj,
        parse_int=Number,
        parse_float=Number,
        parse_constant=_no_constant,
    )
    return _scrub_surrogates(value)


_DEEP_TOKEN = re.compile(
    r'[ \t\r\n]*(?:("(?:[^"\\]|\\.)*")|([-0-9][-+.eE0-9]*)|(true|false|null)|([{}\[\],:]))',
    re.DOTALL,
)
_LITERALS: dict[str, object] = {"true": True, "false": False, "null": None}


def _parse_deep(text: str) -> object:
    """`parse` of a document the scanner found valid, with a stack instead of recursion."""
    root: list[object] = []
    stack: list[Obj | list[object]] = []  # open containers, innermost last
    keys: list[str | None] = []  # per open container: the key awaiting its value
    expect_key = False
    pos = 0
    while True:
        token = _DEEP_TOKEN.match(text, pos)
        if token is None:
            break
        pos = token.end()
        quote, number, literal, punct = token.groups()
        value: object
        if quote:
            string = json.loads(quote)
            if expect_key:
                keys[-1], expect_key = scrub_text(string), False
                continue
            value = scrub_text(string)
        elif number:
            value = Number(number)
        elif literal:
            value = _LITERALS[literal]
        elif punct in "{[":
            stack.append(Obj() if punct == "{" else [])
            keys.append(None)
            expect_key = punct == "{"
            continue
        elif punct == ",":
            expect_key = isinstance(stack[-1], Obj)
            continue
        elif punct == ":":
            continue
        else:  # } or ]
            expect_key = False
            keys.pop()
            value = stack.pop()
        _store(stack[-1] if stack else root, keys[-1] if keys else None, value)
    return root[0]


def _store(container: Obj | list[object], key: str | None, value: object) -> None:
    if isinstance(container, Obj):
        assert key is not None
        container.append((key, value))
    else:
        container.append(value)


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub_text(text: str) -> str:
    """Go decodes each lone surrogate escape (`\\ud800`) as one U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def _no_constant(name: str) -> object:  # pragma: no cover - the scanner rejects NaN first
    raise GoJsonError(
        f"invalid character {quote_char(ord(name[0]))} looking for beginning of value"
    )


def _scrub_surrogates(value: object) -> object:
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, Obj):
        return Obj((str(_scrub_surrogates(k)), _scrub_surrogates(v)) for k, v in value)
    if isinstance(value, list):
        return [_scrub_surrogates(v) for v in value]
    return value


def kind_of(value: object) -> str:
    """Go's word for a JSON value in type errors."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Number):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Obj):
        return "object"
    return "array"


def fold(name: str) -> str:
    """Go's `foldName`: ASCII upper-cased, other runes through ToUpper(ToLower(r))."""
    out = []
    for ch in name:
        if ch.isascii():
            out.append(ch.upper())
            continue
        low = ch.lower()
        up = low.upper() if len(low) == 1 else ch
        out.append(up if len(up) == 1 else low)
    return "".join(out)


# --- typed decoding ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scalar:
    """string / int / bool / net.IP / types.IPNet / interface{} maps."""

    kind: str  # "string", "int", "bool", "ip", "cidr", "anymap", "boolmap", "any"
    go_type: str


@dataclass(frozen=True, slots=True)
class Slice:
    """A Go slice type (for decoding and its error messages)."""

    elem: GoType
    go_type: str


@dataclass(frozen=True, slots=True)
class Struct:
    """A Go struct type: its JSON fields and how errors name it."""

    name: str  # the Go type's name, as it appears in "Go struct field NAME.path"
    go_type: str  # reflect's Type.String(), e.g. "main.ProxyInit"
    fields: tuple[tuple[str, GoType], ...]
    # Types with their own UnmarshalJSON call json.Unmarshal afresh: errors restart the path.
    own_unmarshal: bool = False
    embedded: str = ""  # set on fields promoted from an embedded struct (Go 1.24 paths)


GoType = Scalar | Slice | Struct

STRING = Scalar("string", "string")
INT = Scalar("int", "int")
BOOL = Scalar("bool", "bool")
IP = Scalar("ip", "net.IP")
CIDR = Scalar("cidr", "types.IPNet")
ANYMAP = Scalar("anymap", "map[string]interface {}")
BOOLMAP = Scalar("boolmap", "map[string]bool")

INT_RE = re.compile(r"-?(0|[1-9][0-9]*)")


class _TypeAbort(Exception):
    """A type error that stops decoding: it left a type with its own UnmarshalJSON."""

    def __init__(self, what: str, go_type: str) -> None:
        super().__init__(what)
        self.what = what
        self.go_type = go_type
        self.where: tuple[str, str] | None = None


def _type_error(what: str, go_type: str, where: tuple[str, str] | None) -> str:
    if where is None:
        return f"json: cannot unmarshal {what} into Go value of type {go_type}"
    field_name = f"{where[0]}.{where[1]}"
    return f"json: cannot unmarshal {what} into Go struct field {field_name} of type {go_type}"


Ctx = tuple[str, tuple[str, ...]]


@dataclass(slots=True)
class _Decoder:
    """One `json.Unmarshal` call (a types with its own UnmarshalJSON starts a new one)."""

    first: tuple[str, str, tuple[str, str] | None] | None = None
    # Inside a type with its own UnmarshalJSON: an aborting error's field context is the one
    # the outermost decoder is at, so nothing in here may claim it.
    inner: bool = False

    def save(self, value: object, go_type: str, ctx: Ctx | None) -> None:
        if self.first is None:
            # Go names the literal only when a number does not fit a numeric field.
            numeric = go_type in ("int", "float64")
            what = (
                "number " + value.text if isinstance(value, Number) and numeric else kind_of(value)
            )
            where = None if ctx is None else (ctx[0], ".".join(ctx[1]))
            self.first = (what, go_type, where)

    def value(self, v: object, t: GoType, old: object, ctx: Ctx | None) -> object:
        if isinstance(t, Struct):
            if t.own_unmarshal:
                return self.own(v, t, old)
            return self.struct(v, t, old, ctx)
        if isinstance(t, Slice):
            return self.slice(v, t, old, ctx)
        return self.scalar(v, t, old, ctx)

    def own(self, v: object, t: Struct, old: object) -> object:
        inner = _Decoder(inner=True)
        out = inner.struct(v, t, old, None)
        if inner.first is not None:
            raise _TypeAbort(inner.first[0], inner.first[1])
        return out

    def struct(self, v: object, t: Struct, old: object, ctx: Ctx | None) -> object:
        if v is None:
            return old
        if not isinstance(v, Obj):
            self.save(v, t.go_type, ctx)
            return old
        fields: dict[str, object] = dict(old) if isinstance(old, dict) else {}
        path: tuple[str, ...] = () if ctx is None else ctx[1]
        for key, item in v:
            match = _field(t, key)
            if match is None:
                continue
            name, ft = match
            fctx = (t.name, (*path, name))
            try:
                fields[name] = self.value(item, ft, fields.get(name), fctx)
            except _TypeAbort as abort:
                if abort.where is None and not self.inner:
                    abort.where = (fctx[0], ".".join(fctx[1]))
                raise
        return fields

    def slice(self, v: object, t: Slice, old: object, ctx: Ctx | None) -> object:
        if v is None:
            return None
        if kind_of(v) != "array":
            self.save(v, t.go_type, ctx)
            return old
        assert isinstance(v, list)
        return [self.value(item, t.elem, None, ctx) for item in v]

    def scalar(self, v: object, t: Scalar, old: object, ctx: Ctx | None) -> object:
        if v is None:
            if t.kind == "cidr":  # UnmarshalJSON still runs for null: ParseCIDR("") fails
                raise GoJsonError("invalid CIDR address: ")
            return None if t.kind in ("ip", "anymap", "boolmap", "any") else old
        if t.kind in ("anymap", "any"):
            # interface{} holds numbers as float64: one out of its range fails the decode.
            overflow = _first_overflow(v)
            if overflow is not None:
                self.save(overflow, "float64", ctx)
                return old
        decoded = _SCALARS[t.kind](v, kind_of(v))
        if decoded is _MISMATCH:
            self.save(v, t.go_type, ctx)
            return old
        return decoded


_MISMATCH = object()


def _as_string(v: object, kind: str) -> object:
    return v if kind == "string" else _MISMATCH


def _as_int(v: object, kind: str) -> object:
    if kind != "number" or not isinstance(v, Number):
        return _MISMATCH
    # ParseInt fails past 19 digits (a JSON number has no leading zeros); `int()` must not
    # see them: CPython refuses over 4,300 digits.
    if not INT_RE.fullmatch(v.text) or len(v.text.lstrip("-")) > len(str(MAX_INT64)):
        return _MISMATCH
    n = int(v.text)
    return n if MIN_INT64 <= n <= MAX_INT64 else _MISMATCH


def _as_bool(v: object, kind: str) -> object:
    return v if kind == "bool" else _MISMATCH


def _as_ip(v: object, kind: str) -> object:
    if kind != "string":
        return _MISMATCH
    assert isinstance(v, str)
    if v == "":
        return None
    ip = go_ip(v)
    if ip is None:
        raise GoJsonError(f"invalid IP address: {v}")
    return ip


def _as_cidr(v: object, kind: str) -> object:
    # types.IPNet first unmarshals into a plain string, a fresh Unmarshal whose type error
    # surfaces with the context of the enclosing field.
    if kind != "string":
        raise _TypeAbort(kind, "string")
    assert isinstance(v, str)
    cidr = go_cidr(v)
    if cidr is None:
        raise GoJsonError(f"invalid CIDR address: {v}")
    return cidr


def _as_anymap(v: object, kind: str) -> object:
    if kind == "object":
        return to_plain(v)
    return _MISMATCH


def _as_boolmap(v: object, kind: str) -> object:
    if kind != "object":
        return _MISMATCH
    out = {}
    assert isinstance(v, Obj)
    for key, item in v:
        if not isinstance(item, bool) and item is not None:
            return _MISMATCH
        out[key] = bool(item)
    return out


def _as_any(v: object, kind: str) -> object:
    return to_plain(v)


_SCALARS: dict[str, Callable[[object, str], object]] = {
    "string": _as_string,
    "int": _as_int,
    "bool": _as_bool,
    "ip": _as_ip,
    "cidr": _as_cidr,
    "anymap": _as_anymap,
    "boolmap": _as_boolmap,
    "any": _as_any,
}


def _field(t: Struct, key: str) -> tuple[str, GoType] | None:
    for name, ft in t.fields:
        if name == key:
            return name, ft
    folded = fold(key)
    for name, ft in t.fields:
        if fold(name) == folded:
            return name, ft
    return None


def to_plain(v: object) -> object:
    """Pair lists to dicts (last duplicate wins, as a Go map does), Numbers to float64.
    Without recursion: a document may nest 10000 deep."""
    root: list[object] = [None]
    work: list[tuple[object, dict[str, object] | list[object], str | int]] = [(v, root, 0)]
    while work:
        value, parent, slot = work.pop()
        converted: object
        if isinstance(value, Obj):
            last = dict(value)  # key order of first appearance, value of the last
            converted = dict.fromkeys(last)
            work += [(item, converted, key) for key, item in last.items()]
        elif isinstance(value, list):
            items: list[object] = [None] * len(value)
            work += [(item, items, i) for i, item in enumerate(value)]
            converted = items
        else:
            converted = _plain_scalar(value)
        parent[slot] = converted  # type: ignore[index]  # str keys for dicts, int for lists
    return root[0]


def _first_overflow(v: object) -> Number | None:
    """The first number (in document order) beyond float64's range, as ParseFloat sees it."""
    work = [v]
    while work:
        value = work.pop()
        if isinstance(value, Number):
            if math.isinf(value.as_float()):
                return value
        elif isinstance(value, Obj):
            work += reversed([item for _, item in value])
        elif isinstance(value, list):
            work += reversed(value)
    return None


def _plain_scalar(v: object) -> object:
    if isinstance(v, Number):
        f = v.as_float()
        return int(f) if f.is_integer() and abs(f) < 1e21 else f
    return v


def decode(data: bytes, schema: Struct) -> dict[str, object]:
    """Go's `json.Unmarshal(data, &schema)`: the decoded fields by JSON name."""
    return decode_value(parse(data), schema)


def decode_value(value: object, schema: Struct) -> dict[str, object]:
    decoder = _Decoder()
    try:
        out = decoder.struct(value, schema, {}, None)
    except _TypeAbort as abort:
        raise GoJsonError(_type_error(abort.what, abort.go_type, abort.where)) from None
    if decoder.first is not None:
        raise GoJsonError(_type_error(*decoder.first))
    return out if isinstance(out, dict) else {}


# --- reading decoded fields back as Go values ---------------------------------------------
# What `decode` returns holds only what the document set; Go's struct would hold the zero
# value (0, "", nil) for the rest, and for a null element of a slice.


def field_str(fields: Mapping[str, object], key: str) -> str:
    value = fields.get(key)
    return value if isinstance(value, str) else ""


def field_int(fields: Mapping[str, object], key: str) -> int:
    value = fields.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def field_opt_str(fields: Mapping[str, object], key: str) -> str | None:
    """A *string or net.IP field: None when absent or null."""
    value = fields.get(key)
    return value if isinstance(value, str) else None


def field_opt_int(fields: Mapping[str, object], key: str) -> int | None:
    """An *int field: None when absent or null."""
    value = fields.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def field_struct(fields: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = fields.get(key)
    return value if isinstance(value, dict) else {}


def field_structs(fields: Mapping[str, object], key: str) -> list[Mapping[str, object]]:
    """A slice of structs; a null element reads as an empty struct."""
    value = fields.get(key)
    if not isinstance(value, list):
        return []
    return [v if isinstance(v, dict) else {} for v in value]


def field_strs(fields: Mapping[str, object], key: str) -> tuple[str, ...]:
    """A []string; a null element is "" in Go."""
    value = fields.get(key)
    if not isinstance(value, list):
        return ()
    return tuple(v if isinstance(v, str) else "" for v in value)


def field_ints(fields: Mapping[str, object], key: str) -> tuple[int, ...]:
    """A []int; a null element is 0 in Go."""
    value = fields.get(key)
    if not isinstance(value, list):
        return ()
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) else 0 for v in value)
