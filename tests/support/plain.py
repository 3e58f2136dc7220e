"""One assertion for every suite that drives hostile input: what a user sees carries no
Python internals (issue 29: "no user-visible message contains a Python exception name").

What counts: a traceback, the dispatcher's `internal error` (a bug caught at the boundary),
any name ending in Error or Exception (ValueError, UnicodeDecodeError, KeyError's cousins
OSError, RecursionError, ...), every other built-in exception's name (KeyError counts by
the first rule; StopIteration, KeyboardInterrupt, GeneratorExit by this one), an errno
tuple (`[Errno 2]`), and the texts CPython's own errors carry without their names (the
4,300-digit limit, `invalid literal for int()`, `NoneType`, `object has no attribute`).
"""

from __future__ import annotations

import builtins
import re

_BUILTIN_NAMES = sorted(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException) and "Warning" not in name
)
_PYTHON_TEXTS = (
    "Traceback",
    "internal error",
    "[Errno",
    "Exceeds the limit",
    "sys.set_int_max_str_digits",
    "invalid literal for int()",
    "could not convert string to float",
    "NoneType",
    "object has no attribute",
    "not subscriptable",
    "unhashable type",
    "codec can't",
    "maximum recursion depth",
    "embedded null",
)
INTERNALS = re.compile(
    r"\b[A-Z][A-Za-z]*(?:Error|Exception)\b"
    rf"|\b(?:{'|'.join(map(re.escape, _BUILTIN_NAMES))})\b"
    rf"|{'|'.join(map(re.escape, _PYTHON_TEXTS))}"
)


def internals(text: str | bytes) -> list[str]:
    """Every Python internal `text` shows (empty when it is plain)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [m.group(0) for m in INTERNALS.finditer(text)]


def assert_plain(text: str | bytes) -> None:
    """`text` (a message, stdout, stderr, a log) shows no Python internals."""
    found = internals(text)
    assert not found, f"Python internals {found} in: {text[:2000]!r}"
