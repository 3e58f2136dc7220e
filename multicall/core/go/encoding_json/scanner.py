"""Go's JSON validity scanner (encoding/json scanner.go): a state function per byte, and
Go's text for the first error. Like Go's, it refuses nesting deeper than 10000 (`invalid
character '[' exceeded max depth`), and it reports how deep a valid document goes, so the
parser can pick a way that does not recurse (decode.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from multicall.core.go.strconv import go_quote

SPACE = frozenset(b" \t\r\n")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'bfnrt\\/"')
MAX_NESTING_DEPTH = 10000  # scanner.go maxNestingDepth


class GoJsonError(ValueError):
    """A decode failure; `str()` is Go's error text."""


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
    max_depth: int = 0

    def __post_init__(self) -> None:
        self.state = self.begin_value

    def fail(self, c: int, context: str) -> None:
        self.error = _bad(c, context)
        self.state = self.failed

    def failed(self, c: int) -> None:
        return

    def push(self, c: int, kind: str) -> bool:
        """scanner.go pushParseState: an error past maxNestingDepth."""
        self.stack.append(kind)
        depth = len(self.stack)
        if depth > MAX_NESTING_DEPTH:
            self.fail(c, "exceeded max depth")
            return False
        self.max_depth = max(self.max_depth, depth)
        return True

    def begin_value(self, c: int) -> None:
        if c in SPACE:
            return
        if c == 0x7B:  # {
            if self.push(c, "key"):
                self.state = self.begin_string_or_empty
        elif c == 0x5B:  # [
            if self.push(c, "array"):
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
    return scan(data)[0]


def scan(data: bytes) -> tuple[str | None, int]:
    """`syntax_error`, and the deepest nesting of the document (0 for a scalar)."""
    scanner = _Scanner()
    for c in data:
        assert scanner.state is not None
        scanner.state(c)
        if scanner.error:
            return scanner.error, scanner.max_depth
    if scanner.end_top:
        return None, scanner.max_depth
    assert scanner.state is not None
    scanner.state(0x20)  # a number at the very end is only complete after a delimiter
    error = None if _complete(scanner) else "unexpected end of JSON input"
    return error, scanner.max_depth


def _complete(scanner: _Scanner) -> bool:
    return scanner.error is None and scanner.end_top
