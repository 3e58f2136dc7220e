"""Go `encoding/json` behaviour the CNI plugin must reproduce byte for byte.

Rules of this module:
1. `syntax_error` is Go's validity scanner: the same first error, with the same text
   (`invalid character 'o' in literal null (expecting 'u')`), before anything is decoded.
2. `decode` fills a typed schema the way Go's decoder fills a struct: exact key match first,
   then case-insensitive; duplicate keys decoded in order (objects merge, slices replace);
   `null` leaves scalars alone; the first type mismatch is reported as Go words it, after the
   whole document was walked (Go keeps the first error and carries on).
3. `marshal` renders like `json.Marshal`/`MarshalIndent` (HTML-safe escapes, Go's float
   notation, no trailing newline), for CNI results and errors and for the installer's
   patched conflists alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from multicall.core.go.net import go_cidr, go_ip
from multicall.core.go.strconv import MAX_INT64, MIN_INT64, go_quote

SPACE = frozenset(b" \t\r\n")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'bfnrt\\/"')


class GoJsonError(ValueError):
    """A decode failure; `str()` is Go's error text."""


# --- the validity scanner --------------------------------------------------------------------


def quote_char(c: int) -> str:
    if c == 0x27:
        return "'\\''"
    if c == 0x22:
        return "'\"'"
    return "'" + go_quote(chr(c))[1:-1] + "'"


def _bad(c: int, context: str) -> str:
    return f"invalid character {quote_char(c)} {context}"


@dataclass(slots=True)
class _Scanner:
    """Go's `scanner`: a state function per byte and a stack of open containers."""

    stack: list[str] = field(default_factory=list)
    error: str | None = None
    state: Callable[[int], None] | None = None
    literal: bytes = b""
    literal_at: int = 0
    literal_name: str = ""
    end_top: bool = False

    def __post_init__(self) -> None:
        self.state = self.begin_value

    def fail(self, c: int, context: str) -> None:
        self.error = _bad(c, context)
        self.state = self.failed

    def failed(self, c: int) -> None:
        return

    def begin_value(self, c: int) -> None:
        if c in SPACE:
            return
        if c == 0x7B:  # {
            self.stack.append("key")
            self.state = self.begin_string_or_empty
        elif c == 0x5B:  # [
            self.stack.append("array")
            self.state = self.begin_value_or_empty
        elif c == 0x22:
            self.state = self.in_string
        elif c == 0x2D:
            self.state = self.neg
        elif c == 0x30:
            self.state = self.zero
        elif c in DIGITS:
            self.state = self.one
        elif c in b"tfn":
            self.literal = {0x74: b"true", 0x66: b"false", 0x6E: b"null"}[c]
            self.literal_name, self.literal_at = self.literal.decode(), 1
            self.state = self.in_literal
        else:
            self.fail(c, "looking for beginning of value")

    def begin_value_or_empty(self, c: int) -> None:
        if c in SPACE:
            return
        if c == 0x5D:
            self.end_value(c)
            return
        self.begin_value(c)

    def begin_string_or_empty(self, c: int) -> None:
        if c in SPACE:
            return
        if c == 0x7D:
            self.stack[-1] = "value"
            self.end_value(c)
            return
        self.begin_string(c)

    def begin_string(self, c: int) -> None:
        if c in SPACE:
            return
        if c == 0x22:
            self.state = self.in_string
        else:
            self.fail(c, "looking for beginning of object key string")

    def end_value(self, c: int) -> None:
        if not self.stack:
            self.end_top = True
            self.state = self.end_top_state
            self.end_top_state(c)
            return
        if c in SPACE:
            self.state = self.end_value
            return
        top = self.stack[-1]
        if top == "key":
            if c == 0x3A:
                self.stack[-1] = "value"
                self.state = self.begin_value
            else:
                self.fail(c, "after object key")
        elif top == "value":
            if c == 0x2C:
                self.stack[-1] = "key"
                self.state = self.begin_string
            elif c == 0x7D:
                self.pop()
            else:
                self.fail(c, "after object key:value pair")
        elif c == 0x2C:
            self.state = self.begin_value
        elif c == 0x5D:
            self.pop()
        else:
            self.fail(c, "after array element")

    def pop(self) -> None:
        self.stack.pop()
        if not self.stack:
            self.end_top = True
            self.state = self.end_top_state
        else:
            self.state = self.end_value

    def end_top_state(self, c: int) -> None:
        if c not in SPACE:
            self.fail(c, "after top-level value")

    def in_string(self, c: int) -> None:
        if c == 0x22:
            self.state = self.end_value
        elif c == 0x5C:
            self.state = self.in_escape
        elif c < 0x20:
            self.fail(c, "in string literal")

    def in_escape(self, c: int) -> None:
        if c in ESCAPES:
            self.state = self.in_string
        elif c == 0x75:
            self.literal_at = 0
            self.state = self.in_unicode
        else:
            self.fail(c, "in string escape code")

    def in_unicode(self, c: int) -> None:
        if c not in HEX:
            self.fail(c, "in \\u hexadecimal character escape")
            return
        self.literal_at += 1
        if self.literal_at == 4:
            self.state = self.in_string

    def in_literal(self, c: int) -> None:
        want = self.literal[self.literal_at]
        if c != want:
            self.fail(c, f"in literal {self.literal_name} (expecting {quote_char(want)})")
            return
        self.literal_at += 1
        if self.literal_at == len(self.literal):
            self.state = self.end_value

    def neg(self, c: int) -> None:
        if c == 0x30:
            self.state = self.zero
        elif c in DIGITS:
            self.state = self.one
        else:
            self.fail(c, "in numeric literal")

    def one(self, c: int) -> None:
        if c in DIGITS:
            return
        self.zero(c)

    def zero(self, c: int) -> None:
        if c == 0x2E:
            self.state = self.dot
        elif c in b"eE":
            self.state = self.exp
        else:
            self.end_value(c)

    def dot(self, c: int) -> None:
        if c in DIGITS:
            self.state = self.dot0
        else:
            self.fail(c, "after decimal point in numeric literal")

    def dot0(self, c: int) -> None:
        if c in DIGITS:
            return
        if c in b"eE":
            self.state = self.exp
        else:
            self.end_value(c)

    def exp(self, c: int) -> None:
        if c in b"+-":
            self.state = self.exp_sign
            return
        self.exp_sign(c)

    def exp_sign(self, c: int) -> None:
        if c in DIGITS:
            self.state = self.exp0
        else:
            self.fail(c, "in exponent of numeric literal")

    def exp0(self, c: int) -> None:
        if c not in DIGITS:
            self.end_value(c)


def syntax_error(data: bytes) -> str | None:
    """Go's `checkValid`: None for a valid document, else its error text."""
    scanner = _Scanner()
    for c in data:
        assert scanner.state is not None
        scanner.state(c)
        if scanner.error:
            return scanner.error
    if scanner.end_top:
        return None
    assert scanner.state is not None
    scanner.state(0x20)  # a number at the very end is only complete after a delimiter
    return None if _complete(scanner) else "unexpected end of JSON input"


def _complete(scanner: _Scanner) -> bool:
    return scanner.error is None and scanner.end_top


# --- parsing into Python values ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Number:
    """A JSON number kept as its literal text (Go reports the literal in type errors)."""

    text: str

    def as_float(self) -> float:
        return float(self.text)


class Obj(list[tuple[str, object]]):
    """A JSON object as its key/value pairs, in document order, duplicates kept."""


def parse(data: bytes) -> object:
    """A valid JSON document as Python values: objects are key/value pair lists (duplicates
    and order kept), numbers are `Number`s. Raises GoJsonError with Go's syntax error text."""
    problem = syntax_error(data)
    if problem is not None:
        raise GoJsonError(problem)
    # Go replaces invalid UTF-8 and lone surrogate escapes with U+FFFD instead of failing.
    text = data.decode("utf-8", "replace")
    value: object = json.loads(
        text,
        object_pairs_hook=Obj,
        parse_int=Number,
        parse_float=Number,
        parse_constant=_no_constant,
    )
    return _scrub_surrogates(value)


def _no_constant(name: str) -> object:  # pragma: no cover - the scanner rejects NaN first
    raise GoJsonError(
        f"invalid character {quote_char(ord(name[0]))} looking for beginning of value"
    )


def _scrub_surrogates(value: object) -> object:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(value, Obj):
        return Obj((str(_scrub_surrogates(k)), _scrub_surrogates(v)) for k, v in value)
    if isinstance(value, list):
        return [_scrub_surrogates(v) for v in value]
    return value


def is_object(value: object) -> bool:
    return isinstance(value, Obj)


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
    elem: GoType
    go_type: str


@dataclass(frozen=True, slots=True)
class Struct:
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
ANY = Scalar("any", "interface {}")
INT_PTR = Scalar("int", "int")

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
    if not INT_RE.fullmatch(v.text):
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
    """Pair lists to dicts (last duplicate wins, as a Go map does), Numbers to float64."""
    if isinstance(v, Number):
        f = v.as_float()
        return int(f) if f.is_integer() and abs(f) < 1e21 else f
    if isinstance(v, Obj):
        return {k: to_plain(item) for k, item in v}
    if isinstance(v, list):
        return [to_plain(item) for item in v]
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


# --- encoding -------------------------------------------------------------------------------

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
