"""Response framings, each with what Go's net/http transport does with it (issue 29,
class 2; tests/hostile_inputs.md section 9): the table that tests/pure/test_http_framing.py
runs cnibox's client against, and that tests/tools/test_http_framing_oracle.py checks
against the real Go client (tests/support/framing_oracle.go).

A `Framing` is the raw bytes a server answers the first request with; every later request
(on that connection or a new one) gets `FOLLOW_UP`. The expected outcome is the first
request's (`Ok`: status and body; `Err`: a part of the error text) and `connections`:
how many connections the server saw once a second request was answered: 1 when the
connection was reused, 2 when the client closed it (an error, `Connection: close`, a body
to the end, bytes that arrived out of turn) and made a new one.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from tests.support.hostile_api import Listening

FOLLOW_UP = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass(frozen=True)
class Ok:
    status: int
    body: bytes


@dataclass(frozen=True)
class Err:
    text: str  # a part of cnibox's error text (Go's words where Go has some)


@dataclass(frozen=True)
class Framing:
    name: str
    raw: bytes
    outcome: Ok | Err
    connections: int
    close: bool = False  # the server closes the connection after `raw`
    # Where Go 1.19 (the oracle this machine builds) differs from later Go, which the
    # table follows: 1.19's outcome, for tests/tools/test_http_framing_oracle.py.
    go119: Ok | Err | None = None


def _r(status_line: str, *headers: str, body: bytes = b"") -> bytes:
    head = "\r\n".join((status_line, *headers)) + "\r\n\r\n"
    return head.encode("latin-1") + body


H = "HTTP/1.1"
CL5 = "Content-Length: 5"
TE = "Transfer-Encoding: chunked"
HELLO = b"hello"
CHUNKED_HELLO = b"5\r\nhello\r\n0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
OK_HELLO = _r(f"{H} 200 OK", CL5, body=HELLO)
# An empty chunk size: Go 1.19's parseHexUint reads it as 0, the last chunk, and the data
# after it as trailers; later Go refuses it ("empty hex number for chunk length"), as cnibox.
EMPTY_SIZE_119 = Err('malformed MIME header: missing colon: "hello"')


def _status(code: int, reason: str) -> Framing:
    return Framing(f"{code}", _r(f"{H} {code} {reason}", CL5, body=HELLO), Ok(code, HELLO), 1)


FRAMINGS: tuple[Framing, ...] = (
    # Status codes with a Content-Length body: the body is read, the connection reused.
    *(
        _status(code, reason)
        for code, reason in (
            (200, "OK"),
            (201, "Created"),
            (202, "Accepted"),
            (203, "Non-Authoritative"),
            (206, "Partial Content"),
            (301, "Moved Permanently"),
            (302, "Found"),
            (307, "Temporary Redirect"),
            (400, "Bad Request"),
            (401, "Unauthorized"),
            (403, "Forbidden"),
            (404, "Not Found"),
            (409, "Conflict"),
            (410, "Gone"),
            (429, "Too Many Requests"),
            (500, "Internal Server Error"),
            (502, "Bad Gateway"),
            (503, "Service Unavailable"),
            (504, "Gateway Timeout"),
        )
    ),
    # Statuses without a body, whatever the head says (RFC 9112 6.3).
    Framing("204-bare", _r(f"{H} 204 No Content"), Ok(204, b""), 1),
    Framing("204-length-no-body", _r(f"{H} 204 No Content", CL5), Ok(204, b""), 1),
    Framing("204-with-a-body", _r(f"{H} 204 No Content", CL5, body=HELLO), Ok(204, b""), 2),
    Framing("204-chunked", _r(f"{H} 204 No Content", TE, body=b"0\r\n\r\n"), Ok(204, b""), 2),
    Framing("304-length-no-body", _r(f"{H} 304 Not Modified", CL5), Ok(304, b""), 1),
    Framing("304-with-a-body", _r(f"{H} 304 Not Modified", CL5, body=HELLO), Ok(304, b""), 2),
    Framing("205-length-0", _r(f"{H} 205 Reset Content", "Content-Length: 0"), Ok(205, b""), 1),
    # Informational responses before the final one: skipped, at most 5.
    Framing("100-then-200", CONTINUE + OK_HELLO, Ok(200, HELLO), 1),
    Framing("102-then-200", _r(f"{H} 102 Processing") + OK_HELLO, Ok(200, HELLO), 1),
    Framing(
        "103-then-200",
        _r(f"{H} 103 Early Hints", "Link: </a.css>; rel=preload") + OK_HELLO,
        Ok(200, HELLO),
        1,
    ),
    Framing("199-then-200", _r(f"{H} 199 Whatever") + OK_HELLO, Ok(200, HELLO), 1),
    Framing("100-with-a-length", _r(f"{H} 100 Continue", CL5) + OK_HELLO, Ok(200, HELLO), 1),
    Framing("5x100-then-200", CONTINUE * 5 + OK_HELLO, Ok(200, HELLO), 1),
    Framing(
        "6x100-then-200",
        CONTINUE * 6 + OK_HELLO,
        Err("net/http: too many 1xx informational responses"),
        2,
    ),
    Framing(
        "100-then-404", CONTINUE + _r(f"{H} 404 Not Found", CL5, body=HELLO), Ok(404, HELLO), 1
    ),
    # Content-Length.
    Framing("length-0", _r(f"{H} 200 OK", "Content-Length: 0"), Ok(200, b""), 1),
    Framing(
        "length-leading-zeros",
        _r(f"{H} 200 OK", "Content-Length: 005", body=HELLO),
        Ok(200, HELLO),
        1,
    ),
    Framing(
        "length-spaces", _r(f"{H} 200 OK", "Content-Length:   5  ", body=HELLO), Ok(200, HELLO), 1
    ),
    Framing("length-twice-equal", _r(f"{H} 200 OK", CL5, CL5, body=HELLO), Ok(200, HELLO), 1),
    Framing(
        "length-twice-differ",
        _r(f"{H} 200 OK", CL5, "Content-Length: 6", body=HELLO + b"!"),
        Err("http: message cannot contain multiple Content-Length headers; got"),
        2,
    ),
    Framing(
        "length-list",
        _r(f"{H} 200 OK", "Content-Length: 5, 5", body=HELLO),
        Err('bad Content-Length "5, 5"'),
        2,
    ),
    Framing(
        "length-negative",
        _r(f"{H} 200 OK", "Content-Length: -1", body=HELLO),
        Err('bad Content-Length "-1"'),
        2,
    ),
    Framing(
        "length-plus",
        _r(f"{H} 200 OK", "Content-Length: +5", body=HELLO),
        Err('bad Content-Length "+5"'),
        2,
    ),
    Framing(
        "length-letters",
        _r(f"{H} 200 OK", "Content-Length: abc", body=HELLO),
        Err('bad Content-Length "abc"'),
        2,
    ),
    Framing(
        "length-over-63-bits",
        _r(f"{H} 200 OK", "Content-Length: 99999999999999999999", body=HELLO),
        Err('bad Content-Length "99999999999999999999"'),
        2,
    ),
    Framing(
        "length-short-body",
        _r(f"{H} 200 OK", "Content-Length: 9", body=HELLO),
        Err("unexpected EOF"),
        2,
        close=True,
    ),
    Framing(
        "length-long-body", _r(f"{H} 200 OK", "Content-Length: 3", body=HELLO), Ok(200, b"hel"), 2
    ),
    Framing("to-the-end", _r(f"{H} 200 OK", body=HELLO), Ok(200, HELLO), 2, close=True),
    Framing(
        "empty-length-to-the-end",
        _r(f"{H} 200 OK", "Content-Length: ", body=HELLO),
        Ok(200, HELLO),
        2,
        close=True,
    ),
    # Keep-alive or not.
    Framing(
        "connection-close",
        _r(f"{H} 200 OK", CL5, "Connection: close", body=HELLO),
        Ok(200, HELLO),
        2,
    ),
    Framing(
        "connection-Close-list",
        _r(f"{H} 200 OK", CL5, "Connection: Upgrade, Close", body=HELLO),
        Ok(200, HELLO),
        2,
    ),
    Framing("http10", _r("HTTP/1.0 200 OK", CL5, body=HELLO), Ok(200, HELLO), 2),
    Framing(
        "http10-keep-alive",
        _r("HTTP/1.0 200 OK", CL5, "Connection: keep-alive", body=HELLO),
        Ok(200, HELLO),
        1,
    ),
    Framing(
        "http10-chunked-ignored", _r("HTTP/1.0 200 OK", TE, CL5, body=HELLO), Ok(200, HELLO), 2
    ),
    # Chunked.
    Framing("chunked", _r(f"{H} 200 OK", TE, body=CHUNKED_HELLO), Ok(200, HELLO), 1),
    Framing(
        "chunked-several",
        _r(f"{H} 200 OK", TE, body=b"2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n"),
        Ok(200, HELLO),
        1,
    ),
    Framing(
        "chunked-extension",
        _r(f"{H} 200 OK", TE, body=b"5;a=b\r\nhello\r\n0\r\n\r\n"),
        Ok(200, HELLO),
        1,
    ),
    Framing(
        "chunked-upper-hex",
        _r(f"{H} 200 OK", TE, body=b"A\r\n0123456789\r\n0\r\n\r\n"),
        Ok(200, b"0123456789"),
        1,
    ),
    Framing(
        "chunked-size-spaces",
        _r(f"{H} 200 OK", TE, body=b"5  \r\nhello\r\n0\r\n\r\n"),
        Ok(200, HELLO),
        1,
    ),
    Framing(
        "chunked-trailers",
        _r(f"{H} 200 OK", TE, body=b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"),
        Ok(200, HELLO),
        1,
    ),
    Framing(
        "chunked-Chunked",
        _r(f"{H} 200 OK", "Transfer-Encoding: Chunked", body=CHUNKED_HELLO),
        Ok(200, HELLO),
        1,
    ),
    Framing(
        "chunked-and-length",
        _r(f"{H} 200 OK", TE, "Content-Length: 99", body=CHUNKED_HELLO),
        Ok(200, HELLO),
        1,
    ),
    Framing(
        "te-gzip-chunked",
        _r(f"{H} 200 OK", "Transfer-Encoding: gzip, chunked", body=CHUNKED_HELLO),
        Err('unsupported transfer encoding: "gzip, chunked"'),
        2,
    ),
    Framing(
        "te-gzip",
        _r(f"{H} 200 OK", "Transfer-Encoding: gzip", CL5, body=HELLO),
        Err('unsupported transfer encoding: "gzip"'),
        2,
    ),
    Framing(
        "te-identity",
        _r(f"{H} 200 OK", "Transfer-Encoding: identity", CL5, body=HELLO),
        Err('unsupported transfer encoding: "identity"'),
        2,
    ),
    Framing(
        "te-twice",
        _r(f"{H} 200 OK", TE, TE, body=CHUNKED_HELLO),
        Err('too many transfer encodings: ["chunked" "chunked"]'),
        2,
    ),
    Framing(
        "chunk-size-zz",
        _r(f"{H} 200 OK", TE, body=b"zz\r\nhello\r\n0\r\n\r\n"),
        Err("invalid byte in chunk length"),
        2,
    ),
    Framing(
        "chunk-size-0x",
        _r(f"{H} 200 OK", TE, body=b"0x5\r\nhello\r\n0\r\n\r\n"),
        Err("invalid byte in chunk length"),
        2,
    ),
    Framing(
        "chunk-without-crlf",
        _r(f"{H} 200 OK", TE, body=b"5\r\nhelloXX0\r\n\r\n"),
        Err("malformed chunked encoding"),
        2,
    ),
    Framing(
        "chunked-cut-off",
        _r(f"{H} 200 OK", TE, body=b"5\r\nhel"),
        Err("unexpected EOF"),
        2,
        close=True,
    ),
    # Chunk-size lines as Go's chunked reader reads them (core/go/chunked.py): the same
    # table runs through the watch stream's decoder (tests/pure/test_kube_watch.py).
    *(
        Framing(
            f"chunk-{name}",
            _r(f"{H} 200 OK", TE, body=body),
            outcome,
            1 if ok else 2,
            go119=EMPTY_SIZE_119 if b"empty hex" in str(outcome).encode() else None,
        )
        for name, body, outcome, ok in (
            ("plus-sign", b"+5\r\nhello\r\n0\r\n\r\n", Err("invalid byte in chunk length"), 0),
            ("minus-sign", b"-5\r\nhello\r\n0\r\n\r\n", Err("invalid byte in chunk length"), 0),
            ("0X-upper", b"0X5\r\nhello\r\n0\r\n\r\n", Err("invalid byte in chunk length"), 0),
            ("0x10", b"0x10\r\n" + b"h" * 16 + b"\r\n0\r\n\r\n", Err("invalid byte"), 0),
            ("underscore", b"1_0\r\n" + b"h" * 16 + b"\r\n0\r\n\r\n", Err("invalid byte"), 0),
            ("leading-space", b" 5\r\nhello\r\n0\r\n\r\n", Err("invalid byte in chunk length"), 0),
            ("space-before-ext", b"5 ;a\r\nhello\r\n0\r\n\r\n", Err("invalid byte"), 0),
            ("non-ascii-digit", b"\xd9\xa5\r\nhello\r\n0\r\n\r\n", Err("invalid byte"), 0),
            ("empty", b"\r\nhello\r\n0\r\n\r\n", Err("empty hex number for chunk length"), 0),
            ("only-ext", b";a=b\r\nhello\r\n0\r\n\r\n", Err("empty hex number"), 0),
            ("trailing-tab", b"5\t\r\nhello\r\n0\r\n\r\n", Ok(200, HELLO), 1),
            ("extra-cr", b"5\r\r\nhello\r\n0\r\n\r\n", Ok(200, HELLO), 1),
            ("bare-lf-size-line", b"5\nhello\r\n0\r\n\r\n", Ok(200, HELLO), 1),
            ("quoted-ext", b'5;a="b;c"\r\nhello\r\n0\r\n\r\n', Ok(200, HELLO), 1),
            ("ext-on-last", b"5\r\nhello\r\n0;x=y\r\n\r\n", Ok(200, HELLO), 1),
            ("last-000", b"5\r\nhello\r\n000\r\n\r\n", Ok(200, HELLO), 1),
            ("16-digits", b"0" * 15 + b"5\r\nhello\r\n0\r\n\r\n", Ok(200, HELLO), 1),
            ("17-digits", b"0" * 16 + b"5\r\nhello\r\n0\r\n\r\n", Err("too large"), 0),
            ("17th-bad", b"0" * 16 + b"z\r\nhello\r\n0\r\n\r\n", Err("invalid byte"), 0),
            ("4000-zeros", b"0" * 4000 + b"5\r\nhello\r\n0\r\n\r\n", Err("too large"), 0),
            ("5000-zeros", b"0" * 5000 + b"5\r\nhello\r\n0\r\n\r\n", Err("too long"), 0),
            (
                "one-byte-each",
                b"".join(b"1\r\n%c\r\n" % c for c in HELLO) + b"0\r\n\r\n",
                Ok(200, HELLO),
                1,
            ),
            (
                "mixed-case",
                b"a\r\n0123456789\r\nA\r\n0123456789\r\n0\r\n\r\n",
                Ok(200, b"0123456789" * 2),
                1,
            ),
            ("data-bare-lf", b"5\r\nhello\n0\r\n\r\n", Err("malformed chunked encoding"), 0),
            ("data-longer", b"3\r\nhello\r\n0\r\n\r\n", Err("malformed chunked encoding"), 0),
            ("data-cr-only", b"5\r\nhello\r0\r\n\r\n", Err("malformed chunked encoding"), 0),
        )
    ),
    # Status line and header lines.
    Framing("no-reason", _r(f"{H} 200", CL5, body=HELLO), Ok(200, HELLO), 1),
    Framing("two-spaces", _r(f"{H}  200 OK", CL5, body=HELLO), Ok(200, HELLO), 1),
    Framing(
        "status-4-digits",
        _r(f"{H} 2000 OK", CL5, body=HELLO),
        Err('malformed HTTP status code "2000"'),
        2,
    ),
    Framing(
        "status-2-digits",
        _r(f"{H} 20 OK", CL5, body=HELLO),
        Err('malformed HTTP status code "20"'),
        2,
    ),
    Framing(
        "status-letters",
        _r(f"{H} abc OK", CL5, body=HELLO),
        Err('malformed HTTP status code "abc"'),
        2,
    ),
    Framing(
        "version-letters",
        _r("HTTP/x.y 200 OK", CL5, body=HELLO),
        Err('malformed HTTP version "HTTP/x.y"'),
        2,
    ),
    Framing(
        "version-icy", _r("ICY 200 OK", CL5, body=HELLO), Err('malformed HTTP version "ICY"'), 2
    ),
    Framing("no-space", b"HTTP/1.1\r\n\r\n", Err('malformed HTTP response "HTTP/1.1"'), 2),
    Framing(
        "header-without-colon",
        _r(f"{H} 200 OK", "Nonsense", CL5, body=HELLO),
        Err('malformed MIME header: missing colon: "Nonsense"'),
        2,
    ),
    Framing("header-folded", _r(f"{H} 200 OK", "X-A: 1", " 2", CL5, body=HELLO), Ok(200, HELLO), 1),
    Framing(
        "header-initial-space",
        _r(f"{H} 200 OK", " X-A: 1", CL5, body=HELLO),
        Err("malformed MIME header initial line"),
        2,
    ),
    Framing("bare-lf", b"HTTP/1.1 200 OK\nContent-Length: 5\n\nhello", Ok(200, HELLO), 1),
    # Bytes out of turn after a complete response: the connection is not reused.
    Framing("stray-crlf", OK_HELLO + b"\r\n", Ok(200, HELLO), 2),
    Framing("stray-response", OK_HELLO + FOLLOW_UP, Ok(200, HELLO), 2),
    Framing("nothing", b"", Err("EOF"), 2, close=True),
)


@dataclass
class ReplayServer(Listening):
    """Answers the first request it reads with `framing.raw`, every later one with
    `follow_up`; counts connections."""

    framing: Framing
    follow_up: bytes = FOLLOW_UP
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _answer(self, conn: socket.socket, path: str) -> bool:
        with self._lock:
            first = self.requests == 0
            self.requests += 1
        conn.sendall(self.framing.raw if first else self.follow_up)
        return not (first and self.framing.close)


@contextmanager
def replay(framing: Framing, follow_up: bytes = FOLLOW_UP) -> Iterator[ReplayServer]:
    server = ReplayServer(framing, follow_up)
    server.start()
    try:
        yield server
    finally:
        server.stop()
