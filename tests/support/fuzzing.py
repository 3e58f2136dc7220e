"""The fuzzing harness's settings and input strategies (tests/pure/test_fuzz_parsers.py).

Inputs are hypothesis strategies of three kinds: structured documents (JSON/YAML values
over the field names each parser knows, so fuzzing reaches past the first type check),
byte-level mutations of real fixtures (insert, delete, duplicate, replace, deep nesting),
and plain random bytes.

`make test` runs a fixed number of examples, derandomized (the same inputs on every run,
so CI is reproducible). `make fuzz` runs many more with a random seed:
`CNIBOX_FUZZ_EXAMPLES=20000 make fuzz`; a failure prints the `@reproduce_failure` line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

F = TypeVar("F", bound=Callable[..., Any])

LONG_RUN_EXAMPLES = int(os.environ.get("CNIBOX_FUZZ_EXAMPLES") or 0)
# One input must be handled in this time (generous: a loaded 2-core CI machine). The parsers
# take milliseconds; only a blow-up (backtracking, quadratic loops, hangs) gets near it.
PER_INPUT = timedelta(seconds=3)


def fuzz(examples: int) -> Callable[[F], F]:
    """Hypothesis settings of one fuzz target: `examples` derandomized inputs in `make test`,
    or CNIBOX_FUZZ_EXAMPLES random ones."""
    return settings(
        max_examples=LONG_RUN_EXAMPLES or examples,
        derandomize=not LONG_RUN_EXAMPLES,
        deadline=PER_INPUT,
        database=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


# Bytes that matter to the grammars fuzzed: JSON and YAML structure, quoting, escapes,
# line ends, invalid UTF-8, NUL and a lone surrogate escape.
GRAMMAR_BYTES = b"{}[],:\"\\' \t\r\n-#*!&|>=.0123456789eE+tfnul\x00\x85\xc3\xa9\xff"
SNIPPETS = (
    b"\\ud800",
    b"1e400",
    b"-0",
    b"null",
    b"\r\n",
    b"COMMIT\n",
    b"*nat\n",
    b"-A ",
    b'"',
    b"---\n",
    b"&a [*a]",
    b"\xef\xbb\xbf",
)


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[bytes]) -> bytes:
    """A seed with a few byte-level edits."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(("insert", "snippet", "delete", "duplicate", "nest")))
        if op == "insert":
            data[at:at] = bytes([draw(st.sampled_from(GRAMMAR_BYTES))])
        elif op == "snippet":
            data[at:at] = draw(st.sampled_from(SNIPPETS))
        elif op == "delete":
            data[at : at + draw(st.integers(1, 16))] = b""
        elif op == "duplicate":
            end = min(len(data), at + draw(st.integers(1, 64)))
            data[at:at] = data[at:end] * draw(st.integers(1, 50))
        else:
            depth = draw(st.sampled_from((2, 50, 150, 1200, 12000)))
            opener = draw(st.sampled_from((b"[", b'{"a":', b"- ", b"  ")))
            data[at:at] = opener * depth
    return bytes(data)


def json_values(keys: Sequence[str]) -> st.SearchStrategy[Any]:
    """Decoded JSON values whose object keys are mostly the parser's own field names."""
    key = st.one_of(st.sampled_from(list(keys)), st.text(max_size=6))
    scalar = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=12),
        st.sampled_from(["", "0", "4143", "10.0.0.0/8", "::1", "nft", "legacy", "true", "80-90"]),
    )
    return st.recursive(
        scalar,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(key, inner, max_size=5),
        ),
        max_leaves=24,
    )


def documents(seeds: Sequence[bytes], keys: Sequence[str]) -> st.SearchStrategy[bytes]:
    """Inputs for a parser of JSON documents: seeds mutated, structured values (alone or
    merged into a seed), random bytes."""
    objects = [json.loads(seed) for seed in seeds]

    @st.composite
    def merged(draw: st.DrawFn) -> bytes:
        base = dict(draw(st.sampled_from(objects)))
        extra = draw(st.dictionaries(st.sampled_from(list(keys)), json_values(keys), max_size=4))
        return json.dumps({**base, **extra}).encode()

    return st.one_of(
        mutated(seeds),
        merged(),
        json_values(keys).map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=200),
    )


def keys_of(*docs: Any) -> list[str]:
    """Every object key in some documents (the vocabulary of a parser)."""
    found: set[str] = set()
    work = list(docs)
    while work:
        value = work.pop()
        if isinstance(value, dict):
            found.update(value)
            work += value.values()
        elif isinstance(value, list):
            work += value
    return sorted(found)
