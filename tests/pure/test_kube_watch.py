"""core/kube_watch: the body decoder (chunked framing, lines across chunks, the cap on a whole
line) and the list/watch cursor (kube-rs's watcher states, 410 Gone, bookmarks)."""

from __future__ import annotations

import json
import random
import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicall.core.kube.watch import (
    MAX_EVENT_BYTES,
    BodyLines,
    Kind,
    Phase,
    Selector,
    WatchCursor,
    WatchEvent,
    parse_watch_event,
)
from multicall.errors import KubeError
from tests.support.framing import FRAMINGS, Err, Framing, Ok
from tests.support.plain import assert_plain


def chunked(payload: bytes, sizes: list[int]) -> bytes:
    out, pos, i = b"", 0, 0
    while pos < len(payload):
        size = max(1, sizes[i % len(sizes)])
        part = payload[pos : pos + size]
        out += b"%x;ext=1\r\n%s\r\n" % (len(part), part)
        pos += size
        i += 1
    return out + b"0\r\nTrailer: x\r\n\r\n"


def feed_all(decoder: BodyLines, wire: bytes, cuts: list[int]) -> list[bytes | None]:
    out: list[bytes | None] = []
    pos = 0
    for cut in cuts:
        out += decoder.feed(wire[pos : pos + cut])
        pos += cut
    out += decoder.feed(wire[pos:])
    return out


@given(
    lines=st.lists(
        st.binary(min_size=0, max_size=40).filter(lambda b: b"\n" not in b), max_size=12
    ),
    sizes=st.lists(st.integers(1, 17), min_size=1, max_size=5),
    cuts=st.lists(st.integers(0, 9), max_size=30),
)
def test_lines_survive_any_chunking_and_any_read_boundaries(
    lines: list[bytes], sizes: list[int], cuts: list[int]
) -> None:
    payload = b"".join(line + b"\n" for line in lines)
    decoder = BodyLines(chunked=True)
    assert feed_all(decoder, chunked(payload, sizes), cuts) == lines
    assert decoder.done


def test_identity_body_lines_and_final_line_without_newline() -> None:
    decoder = BodyLines(chunked=False)
    assert decoder.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert decoder.feed(b":2}") == []
    assert decoder.finish() == [b'{"b":2}']


def test_an_oversized_line_is_dropped_whole_and_the_next_one_kept() -> None:
    """The cap is on the whole line, however many chunks carry it."""
    big = b"x" * 1000
    wire = chunked(b"small\n" + big + b"\nafter\n", [7])
    decoder = BodyLines(chunked=True, max_line=100)
    assert feed_all(decoder, wire, [3] * 500) == [b"small", None, b"after"]
    assert len(decoder._line) <= 100


def test_memory_stays_at_one_line_however_long_the_stream() -> None:
    decoder = BodyLines(chunked=True, max_line=64)
    for _ in range(2000):
        decoder.feed(chunked(b"y" * 50 + b"\n", [13])[:-5])  # no terminator yet
    assert len(decoder._line) == 0
    assert len(decoder._head) < 16


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"zz\r\nabc\r\n", "invalid byte in chunk length"),
        (b"3\r\nabcX\r\n", "malformed chunked encoding"),
        (b"1" * 5000, "header line too long"),
    ],
)
def test_malformed_chunking_is_an_error(wire: bytes, message: str) -> None:
    with pytest.raises(KubeError, match=message):
        BodyLines(chunked=True).feed(wire)


def test_eof_inside_a_chunked_body_is_an_error() -> None:
    decoder = BodyLines(chunked=True)
    decoder.feed(b"5\r\nab")
    with pytest.raises(KubeError, match="unexpected EOF"):
        decoder.finish()


def test_watch_event_parsing() -> None:
    event = parse_watch_event(b'{"type":"ADDED","object":{"metadata":{"resourceVersion":"5"}}}')
    assert event == WatchEvent("ADDED", {"metadata": {"resourceVersion": "5"}})
    for bad in (b"nope", b"[]", b'{"type":"ADDED"}', b'{"type":"WAT","object":{}}'):
        with pytest.raises(KubeError):
            parse_watch_event(bad)


# ----------------------------------------------------------------------------- the cursor


def query(path: str) -> dict[str, str]:
    parts = urlsplit(path)
    assert parts.path == "/api/v1/pods"
    return {k: v[0] for k, v in parse_qs(parts.query).items()}


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


SELECTOR = Selector("linkerd.io/control-plane-ns", "spec.nodeName=n1")


def test_paginated_list_then_watch_with_bookmarks_from_the_lists_version() -> None:
    cursor = WatchCursor("/api/v1/pods", SELECTOR, page_size=2)
    assert query(cursor.request()) == {
        "fieldSelector": "spec.nodeName=n1",
        "labelSelector": "linkerd.io/control-plane-ns",
        "limit": "2",
    }
    first = cursor.list_page(
        {
            "metadata": {"resourceVersion": "10", "continue": "c1"},
            "items": [pod("a", "7"), pod("b", "8")],
        }
    )
    assert [e.kind for e in first] == [Kind.INIT, Kind.INIT_APPLY, Kind.INIT_APPLY]
    assert query(cursor.request())["continue"] == "c1"
    last = cursor.list_page({"metadata": {"resourceVersion": "10"}, "items": [pod("c", "9")]})
    assert [e.kind for e in last] == [Kind.INIT_APPLY, Kind.INIT_DONE]
    assert cursor.phase is Phase.WATCH
    assert query(cursor.request()) == {
        "watch": "true",
        "timeoutSeconds": "290",
        "fieldSelector": "spec.nodeName=n1",
        "labelSelector": "linkerd.io/control-plane-ns",
        "allowWatchBookmarks": "true",
        "resourceVersion": "10",
    }


def test_watch_events_advance_the_version_and_bookmarks_only_that() -> None:
    cursor = WatchCursor("/api/v1/pods", SELECTOR)
    cursor.list_page({"metadata": {"resourceVersion": "10"}, "items": []})
    applied = cursor.watch_event(WatchEvent("MODIFIED", pod("a", "11")))
    assert [(e.kind, e.object) for e in applied] == [(Kind.APPLY, pod("a", "11"))]
    assert cursor.watch_event(WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "15"}})) == []
    assert cursor.resource_version == "15"
    assert [e.kind for e in cursor.watch_event(WatchEvent("DELETED", pod("a", "16")))] == [
        Kind.DELETE
    ]
    cursor.request_failed(500)  # a failed watch resumes from where it was
    assert (cursor.phase, cursor.resource_version) == (Phase.WATCH, "16")


@pytest.mark.parametrize("how", ["event", "status"])
def test_gone_starts_over_with_a_fresh_list(how: str) -> None:
    cursor = WatchCursor("/api/v1/pods", SELECTOR)
    cursor.list_page({"metadata": {"resourceVersion": "10"}, "items": []})
    if how == "event":
        gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
        with pytest.raises(KubeError, match="too old"):
            cursor.watch_event(WatchEvent("ERROR", gone))
    else:
        cursor.request_failed(410)
    assert cursor.phase is Phase.LIST
    assert "resourceVersion" not in query(cursor.request())
    assert [
        e.kind for e in cursor.list_page({"metadata": {"resourceVersion": "99"}, "items": []})
    ] == [Kind.INIT, Kind.INIT_DONE]


def test_other_error_events_keep_the_version() -> None:
    cursor = WatchCursor("/api/v1/pods", SELECTOR)
    cursor.list_page({"metadata": {"resourceVersion": "10"}, "items": []})
    with pytest.raises(KubeError):
        cursor.watch_event(WatchEvent("ERROR", {"code": 500, "message": "boom"}))
    assert (cursor.phase, cursor.resource_version) == (Phase.WATCH, "10")


def test_a_list_without_a_version_is_refused() -> None:
    cursor = WatchCursor("/api/v1/pods", SELECTOR)
    with pytest.raises(KubeError, match=r"no metadata\.resourceVersion"):
        cursor.list_page({"metadata": {}, "items": []})
    assert cursor.phase is Phase.LIST


def test_random_event_json_round_trips_through_the_decoder() -> None:
    rng = random.Random(7)
    events = [{"type": "MODIFIED", "object": pod(f"p{i}", str(i))} for i in range(200)]
    wire = chunked(
        b"".join(json.dumps(e).encode() + b"\n" for e in events),
        [rng.randint(1, 90) for _ in range(50)],
    )
    decoder = BodyLines(chunked=True)
    lines = feed_all(decoder, wire, [rng.randint(1, 400) for _ in range(200)])
    assert [parse_watch_event(line).object for line in lines if line] == [
        e["object"] for e in events
    ]


CHUNKED_200 = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNKED_FRAMINGS = [f for f in FRAMINGS if f.raw.startswith(CHUNKED_200)]


@pytest.mark.parametrize("framing", CHUNKED_FRAMINGS, ids=lambda f: f.name)
def test_the_watch_decoder_reads_chunks_as_the_client(framing: Framing) -> None:
    """Every chunked body of the framing table (Go's outcome per case, checked against Go's
    client by tests/tools/test_http_framing_oracle.py) ends in the watch stream's decoder as
    in the client: the same payload, or an error in the same words (`0x10`, `+5`, ` 5`,
    `1_0`, 17 digits were read by `int(text, 16)` before)."""
    wire = framing.raw[len(CHUNKED_200) :]
    expected = framing.outcome
    if isinstance(expected, Ok):
        assert decode_whole(wire) == expected.body
    else:
        assert isinstance(expected, Err)
        with pytest.raises(KubeError, match=re.escape(expected.text)):
            decode_whole(wire)


def decode_whole(wire: bytes) -> bytes:
    decoder = BodyLines(chunked=True)
    lines = decoder.feed(wire) + decoder.finish()
    assert decoder.done
    return b"\n".join(line or b"" for line in lines)


def _event(kind: str, rv: object = "7", **extra: object) -> bytes:
    meta: dict[str, object] = {"name": "p", "namespace": "n"}
    if rv is not None:
        meta["resourceVersion"] = rv
    return json.dumps({"type": kind, "object": {"metadata": meta, **extra}}).encode()


NOT_JSON = "not JSON"
NO_OBJECT = "without an object"
NO_RV = "no metadata.resourceVersion"
BIG = b"x" * (3 * 1024 * 1024)

# One line of a watch body -> the cursor's events (kinds), or the KubeError's words, and
# whether the cursor starts over with a LIST. Upstream reads these with kube-rs and
# serde_json; where Python's json would take more, the line is refused as serde refuses it.
WATCH_LINES: list[tuple[str, bytes, list[str] | str, bool]] = [
    ("added", _event("ADDED"), ["Apply"], False),
    ("modified", _event("MODIFIED"), ["Apply"], False),
    ("deleted", _event("DELETED"), ["Delete"], False),
    ("bookmark", _event("BOOKMARK"), [], False),
    ("bookmark-no-object-fields", b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}', [], False),  # noqa: E501 - one case a line
    ("error-410", b'{"type":"ERROR","object":{"code":410,"message":"too old","reason":"Expired"}}', "too old (Expired)", True),  # noqa: E501 - one case a line
    ("error-500", b'{"type":"ERROR","object":{"code":500,"message":"boom"}}', "boom", False),
    ("error-code-string", b'{"type":"ERROR","object":{"code":"410","message":"m"}}', "m", False),
    ("error-code-true", b'{"type":"ERROR","object":{"code":true}}', "unknown error", False),
    ("error-empty", b'{"type":"ERROR","object":{}}', "unknown error", False),
    ("no-resource-version", _event("ADDED", rv=None), NO_RV, True),
    ("int-resource-version", _event("ADDED", rv=7), NO_RV, True),
    ("empty-resource-version", _event("MODIFIED", rv=""), NO_RV, True),
    ("not-json", b"hello", NOT_JSON, False),
    ("empty-line", b"", NOT_JSON, False),
    ("spaces", b"   ", NOT_JSON, False),
    ("truncated", _event("ADDED")[:-3], NOT_JSON, False),
    ("two-objects", _event("ADDED") + _event("ADDED"), NOT_JSON, False),
    ("nan", b'{"type":"ADDED","object":{"a":NaN,"metadata":{"resourceVersion":"1"}}}', NOT_JSON, False),  # noqa: E501 - one case a line
    ("infinity", b'{"type":"ADDED","object":{"a":-Infinity}}', NOT_JSON, False),
    ("deep", b'{"type":"ADDED","object":' + b"[" * 100_000 + b"]" * 100_000 + b"}", NOT_JSON, False),  # noqa: E501 - one case a line
    ("huge-int", b'{"type":"ADDED","object":{"a":' + b"9" * 5000 + b"}}", NOT_JSON, False),
    ("invalid-utf8", b'{"type":"ADDED","object":{"a":"\xff"}}', NOT_JSON, False),
    ("encoded-surrogate", b'{"type":"ADDED","object":{"a":"\xed\xa0\x80"}}', NOT_JSON, False),
    ("bom", b"\xef\xbb\xbf" + _event("ADDED"), NOT_JSON, False),
    ("utf16", _event("ADDED").decode().encode("utf-16"), NOT_JSON, False),
    ("utf16-le", _event("ADDED").decode().encode("utf-16-le"), NOT_JSON, False),
    ("nul-bytes", b"\x00" + _event("ADDED"), NOT_JSON, False),
    ("top-array", b"[]", NO_OBJECT, False),
    ("top-string", b'"ADDED"', NO_OBJECT, False),
    ("top-null", b"null", NO_OBJECT, False),
    ("object-null", b'{"type":"ADDED","object":null}', NO_OBJECT, False),
    ("object-list", b'{"type":"ADDED","object":[]}', NO_OBJECT, False),
    ("no-object", b'{"type":"ADDED"}', NO_OBJECT, False),
    ("no-type", b'{"object":{}}', "unknown event type None", False),
    ("lowercase-type", b'{"type":"added","object":{}}', "unknown event type 'added'", False),
    ("numeric-type", b'{"type":1,"object":{}}', "unknown event type 1", False),
    ("metadata-list", b'{"type":"ADDED","object":{"metadata":[]}}', NO_RV, True),
    ("3mib-object", _event("ADDED", blob=BIG.decode()), ["Apply"], False),
    ("unicode-name", _event("ADDED", name="caf\u00e9 \u2603"), ["Apply"], False),
    ("escaped-surrogate-pair", b'{"type":"ADDED","object":{"a":"\\ud83d\\ude00","metadata":{"resourceVersion":"3"}}}', ["Apply"], False),  # noqa: E501 - one case a line
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "line", "outcome", "relists"),
    WATCH_LINES,
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else "",
)
def test_watch_lines(name: str, line: bytes, outcome: list[str] | str, relists: bool) -> None:
    """Every line kind a watch stream can carry, good or hostile: the events it becomes, or
    one KubeError in plain words (no Python internals: DEEP nesting was a RecursionError,
    NaN, UTF-16 and a BOM were read), bounded in time."""
    cursor = WatchCursor("/api/v1/pods", Selector())
    cursor.list_page({"metadata": {"resourceVersion": "1"}, "items": []})
    assert "watch=true" in cursor.request()
    if isinstance(outcome, list):
        events = cursor.watch_event(parse_watch_event(line))
        assert [e.kind.value for e in events] == outcome
        assert cursor.phase is Phase.WATCH
    else:
        with pytest.raises(KubeError) as caught:
            cursor.watch_event(parse_watch_event(line))
        assert outcome in caught.value.message
        assert_plain(caught.value.message)
        assert (cursor.phase is Phase.LIST) is relists


def test_a_bookmark_only_stream_moves_the_version_and_delivers_nothing() -> None:
    """10,000 bookmarks: no event for the consumer, the resourceVersion of the last one
    (what a resumed watch asks from); memory does not grow."""
    cursor = WatchCursor("/api/v1/pods", Selector())
    cursor.list_page({"metadata": {"resourceVersion": "1"}, "items": []})
    wire = b"".join(_event("BOOKMARK", rv=str(i)) + b"\n" for i in range(10_000))
    decoder = BodyLines(chunked=False)
    delivered = []
    for line in decoder.feed(wire) + decoder.finish():
        assert line is not None
        delivered += cursor.watch_event(parse_watch_event(line))
    assert delivered == []
    assert "resourceVersion=9999" in cursor.request()


@pytest.mark.parametrize("size", [MAX_EVENT_BYTES - 1, MAX_EVENT_BYTES + 1, 5 * 1024 * 1024])
def test_events_at_and_over_the_line_bound(size: int) -> None:
    """A line up to the bound is one event; past it (a 5 MB event) the decoder drops it
    (None) without holding it, and the next line is read."""
    pad = size - len(_event("ADDED", blob=""))
    line = _event("ADDED", blob="y" * max(pad, 0))
    decoder = BodyLines(chunked=True)
    lines = decoder.feed(chunked(line + b"\n" + _event("DELETED") + b"\n", [65536]))
    lines += decoder.finish()
    if len(line) <= MAX_EVENT_BYTES:
        assert lines[0] == line
    else:
        assert lines[0] is None
    assert lines[1] == _event("DELETED")
