"""HTTP/1.1 on `socket` + `ssl` for the Kubernetes API clients (effects/kube/): one
connection with one deadline, the one request primitive (`Connection.exchange`), response
heads and bodies (Content-Length, chunked, to the end) read bounded, and Go's net/http
wording of what failed.

Rules of this module:
1. A connection's `deadline` covers everything: name resolution, connect, TLS, every read of
   every head and body. A server that never answers, or answers one byte at a time, costs
   at most that, never client-go's unbounded wait (linkerd2 #2875). `Connection` says how.
2. Memory: a response head is at most API_HEAD, a body (chunked: all chunks together) at
   most the caller's limit, refused with the limit named (core/limits.py).
3. A reused keep-alive connection (or an adopted warm one, effects/kube/warm.py) that ends
   before the first byte of a response raises `StaleConnection`: the caller retries an
   idempotent request once on a new connection, as Go's transport does.
4. `ssl` and `socket` are imported on first use only (start-up time of DEL/VERSION/skipped
   pods stays low). http.client is not used: it imports the email package, about as costly
   as ssl itself, on a path every meshed pod start pays.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from multicall.core.go.chunked import ChunkError, chunk_size
from multicall.core.go.strconv import go_quote, go_quote_list
from multicall.core.limits import API_HEAD, describe_size

if TYPE_CHECKING:
    import socket
    import ssl

MAX_BODY = 64 * 1024 * 1024  # what any caller may ask for (a LIST page); GETs ask API_OBJECT
READ_SIZE = 64 * 1024
CHUNKED = -1  # `Head.length`: the body is chunked
TO_CLOSE = -2  # `Head.length`: the body runs to the end of the connection
MAX_1XX = 5  # informational responses skipped before the final one (Go's max1xxResponses)


class Head(dict[str, str]):
    """A response head: its header fields (lower-case names; a repeated field's values
    joined with ", ", RFC 9110 5.3), and what its framing says (RFC 9112 6.3, as Go's
    net/http reads it): `length` (bytes, CHUNKED or TO_CLOSE) and `keep_alive`."""

    __slots__ = ("keep_alive", "length", "status")

    def __init__(self, status: int) -> None:
        super().__init__()
        self.status = status
        self.length = 0
        self.keep_alive = True


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API server is: scheme, host, port and path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str
    # The name TLS sends (SNI) and verifies the certificate against: a kubeconfig's
    # `tls-server-name` (client-go's TLSClientConfig.ServerName), else the host.
    server_name: str = ""

    @property
    def hostport(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def failure(exc: OSError | ValueError, conn: Connection) -> str:
    """What failed on `conn`, in Go's words (net/http, net, crypto/tls): `dial tcp ...:
    connect: connection refused`, `net/http: TLS handshake timeout`, `x509: certificate
    signed by unknown authority`, `... (Client.Timeout exceeded while reading body)`."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"tls: failed to verify certificate: x509: {_x509(exc)}"
    if isinstance(exc, TimeoutError):
        return conn.timeout_detail()
    if isinstance(exc, ConnectionRefusedError):
        return f"dial tcp {conn.endpoint.hostport}: connect: connection refused"
    if isinstance(exc, HttpProtocolError):
        return str(exc)
    if isinstance(exc, _NothingReceived | StaleConnection | _UnexpectedEof):
        return "unexpected EOF" if isinstance(exc, _UnexpectedEof) else "EOF"
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).lower()


class HttpProtocolError(ValueError):
    """The server's answer is not HTTP/1.1 as cnibox reads it, or is over a limit; `str()`
    says what, naming the limit (core/limits.py)."""


class StaleConnection(ConnectionError):
    """A reused keep-alive connection that the server had closed: nothing of a response
    arrived. An idempotent request is retried once on a new connection (Go's transport)."""


class _NothingReceived(ConnectionResetError):
    """The connection ended before the first byte of a response."""


class _UnexpectedEof(ConnectionError):
    """The connection ended inside a response."""


class Connection:
    """One HTTP/1.1 keep-alive connection: requests, Content-Length or chunked bodies.

    Time: `deadline` (monotonic) bounds everything. Name resolution runs in a helper thread
    joined with the time left; each connect gets the time left; the TLS handshake and
    `sendall` get it as a whole (CPython applies one deadline per call); every read of the
    buffered `reader` sets the socket timeout to the time left first (`_DeadlineReader`), so a
    server sending one byte at a time cannot stretch a request past its deadline. Callers
    that stream (a watch) move `deadline` as their own semantics require.
    """

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.stage = "dial"
        self.sock: socket.socket | None = None
        self.reader: BinaryIO | None = None
        self.deadline = 0.0
        self.completed = 0  # responses read in full on this connection
        self.warm = False  # adopted (`adopt`): reused, as a kept-alive one is
        self.between = False  # the last response was read in full, no request since

    def adopt(self, sock: socket.socket, deadline: float) -> None:
        """Use `sock`, connected (and TLS done) earlier, a warm connection that nothing was
        read on yet (effects/kube/warm.py): a request on it is one on a reused keep-alive
        connection (rule 3)."""
        self.deadline = deadline
        # A new reader: every read is bounded by this connection's deadline, not the
        # warm-up's. Nothing was read on it yet, so nothing is lost.
        self.sock, self.warm = sock, True
        self.reader = io.BufferedReader(_DeadlineReader(self), READ_SIZE)
        self.stage = "request"

    def open(
        self, deadline: float, tls: ssl.SSLContext | Callable[[], ssl.SSLContext] | None
    ) -> None:
        """Connect (and TLS: with `tls`, or the context it makes when called) by `deadline`,
        unless connected already. `tls` is only used for an https endpoint.

        A kept-alive connection on which the server sent something (or its end) while no
        request was out is closed first and a new one made, as Go's transport closes it
        ("Unsolicited response received on idle HTTP channel"): what arrived belongs to no
        request (a stray CRLF after a response, a 204's body), and read as the next
        response it would turn a good answer into "malformed HTTP response"."""
        if self.sock is not None:
            if not (self.between and self.unsolicited()):
                return
            self.close()
        self.deadline = deadline
        import socket

        host = _wire_host(self.endpoint.host)
        self.stage = "resolve"
        addresses = _resolve(host, self.endpoint.port, deadline)
        self.stage = "dial"
        raw = _dial(addresses, deadline)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = raw
        if self.endpoint.scheme == "https":
            self.stage = "tls"
            raw.settimeout(_remaining(deadline))
            context = tls() if callable(tls) else tls
            assert context is not None, "an https endpoint needs a TLS context"
            name = _wire_host(self.endpoint.server_name) if self.endpoint.server_name else host
            self.sock = context.wrap_socket(raw, server_hostname=name)
        self.reader = io.BufferedReader(_DeadlineReader(self), READ_SIZE)
        self.stage = "request"

    def request(
        self, method: str, path: str, headers: str, body: bytes, deadline: float
    ) -> tuple[int, Head]:
        """Send one request and read the response head (informational 1xx ones skipped, as
        Go's transport skips them); the body is the caller's to read.

        StaleConnection when a reused connection turns out closed before any response byte.
        """
        assert self.sock is not None
        assert self.reader is not None
        self.deadline = deadline
        self.stage = "request"
        self.between = False
        reused = self.completed > 0 or self.warm
        try:
            self.sock.settimeout(_remaining(deadline))
            self.sock.sendall(f"{method} {path} HTTP/1.1\r\n{headers}\r\n".encode("latin-1") + body)
        except (BrokenPipeError, ConnectionResetError):
            if reused:
                raise StaleConnection from None
            raise
        try:
            head = _read_head(self.reader, method=method)
        except _NothingReceived:
            if reused:
                raise StaleConnection from None
            raise
        return head.status, head

    def exchange(
        self,
        method: str,
        path: str,
        headers: str,
        body: bytes,
        deadline: float,
        *,
        body_deadline: float | None = None,
        max_body: int = MAX_BODY,
    ) -> tuple[int, bytes]:
        """One request and its whole response: the head by `deadline`, the body (at most
        `max_body`) by `body_deadline` (default: the same). Closes the connection when the
        server says so; StaleConnection as `request`."""
        status, fields = self.request(method, path, headers, body, deadline)
        assert self.reader is not None
        self.stage = "body"
        self.deadline = deadline if body_deadline is None else body_deadline
        data = read_body(self.reader, fields, max_body)
        self.completed += 1
        self.between = True
        if not fields.keep_alive:  # Connection: close, HTTP/1.0, a body to the end, a 101
            self.close()
        return status, data

    def get(
        self, path: str, headers: str, deadline: float, *, max_body: int = MAX_BODY
    ) -> tuple[int, bytes]:
        return self.exchange("GET", path, headers, b"", deadline, max_body=max_body)

    def timeout_detail(self) -> str:
        if self.stage == "body":
            return "context deadline exceeded (Client.Timeout exceeded while reading body)"
        if self.stage == "request":
            return "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        if self.stage == "tls":
            return "net/http: TLS handshake timeout"
        if self.stage == "resolve":
            return f"dial tcp: lookup {self.endpoint.host}: i/o timeout"
        return f"dial tcp {self.endpoint.hostport}: i/o timeout"

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        # A connection made next is a fresh one: a failure on it is not retried (rule 3).
        self.completed, self.warm, self.between = 0, False, False

    def unsolicited(self) -> bool:
        """Whether anything (bytes, or the end) is waiting to be read,
        in the reader's buffer or on the socket (`select`, no wait). On TLS a readable socket
        after a complete response is a record the server sent out of turn too: session
        tickets arrive before the first response, and were read with it."""
        import select

        assert self.sock is not None
        reader = self.reader
        assert isinstance(reader, io.BufferedReader)
        assert isinstance(reader.raw, _DeadlineReader)
        reader.raw.peeking = True  # a read the buffer cannot answer returns "nothing yet"
        try:
            if reader.peek(1):
                return True
        except OSError:
            return True
        finally:
            reader.raw.peeking = False
        pending = getattr(self.sock, "pending", None)  # an SSLSocket's decrypted bytes
        if pending is not None and pending():
            return True
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def detach_idle(self) -> socket.socket | None:
        """The socket, taken from this connection, when it sits between two exchanges: every
        response was read in full and nothing more is buffered (bytes the server sent out of
        turn: the connection is closed instead, as Go's transport closes it). Else None."""
        if self.sock is None or self.reader is None or not self.between:
            return None
        if self.unsolicited():
            return None
        sock, self.sock = self.sock, None
        self.reader = None  # (its raw reader closes nothing)
        return sock


class _DeadlineReader(io.RawIOBase):
    """The connection's socket as a raw stream whose every read is bounded by the time left
    until the connection's deadline (TimeoutError once it has passed)."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self.conn = conn
        self.peeking = False  # `detach_idle`: report what is buffered, read nothing

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int | None:  # type: ignore[override]
        if self.peeking:
            return None
        sock = self.conn.sock
        assert sock is not None
        sock.settimeout(_remaining(self.conn.deadline))
        return sock.recv_into(buffer)


def _resolve(host: str | bytes, port: int, deadline: float) -> list[tuple[object, ...]]:
    """getaddrinfo within the deadline: numeric hosts at once, names in a helper thread
    joined with the time left (a resolver that never answers costs the deadline, not glibc's
    retries). The thread is a daemon: one stuck in the resolver does not keep us alive."""
    import socket

    try:
        return list(
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
        )
    except socket.gaierror:
        pass  # a name, not an address
    import threading

    outcome: list[object] = []

    def lookup() -> None:
        try:
            outcome.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=lookup, name="cnibox-resolve", daemon=True)
    worker.start()
    worker.join(_remaining(deadline))
    if not outcome:
        raise TimeoutError
    found = outcome[0]
    if isinstance(found, socket.gaierror):
        name = host.decode() if isinstance(host, bytes) else host
        reason = "no such host" if found.errno == socket.EAI_NONAME else found.strerror
        raise HttpProtocolError(f"dial tcp: lookup {name}: {reason}")
    if isinstance(found, OSError):
        raise found
    assert isinstance(found, list)
    return found


def _dial(addresses: list[tuple[object, ...]], deadline: float) -> socket.socket:
    """Connect to the first address that answers, each try bounded by the time left."""
    import socket

    error: OSError = ConnectionRefusedError(111, "connection refused")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)  # type: ignore[arg-type]
        try:
            sock.settimeout(_remaining(deadline))
            sock.connect(address)  # type: ignore[arg-type]
        except OSError as exc:
            sock.close()
            if isinstance(exc, TimeoutError):
                raise
            error = exc
            continue
        return sock
    raise error


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    return remaining


def _read_head(reader: BinaryIO, limit: int = API_HEAD, method: str = "GET") -> Head:
    """The final response head to a `method` request, read as Go's net/http reads it
    (http.ReadResponse, the transport's 1xx loop): informational 1xx heads before it are
    skipped (at most MAX_1XX of them), all heads together at most `limit` bytes.
    _NothingReceived when the connection ends before the first byte."""
    budget = [limit - 1]
    try:
        first = reader.read(1)
    except ConnectionResetError:
        first = b""
    if not first:
        raise _NothingReceived(104, "EOF")
    informational = 0
    while True:
        head = _one_head(reader, budget, first, method)
        first = b""
        # 101 is final (a protocol switch cnibox never asks for); the other 1xx announce one.
        if not 100 <= head.status <= 199 or head.status == 101:
            return head
        informational += 1
        if informational > MAX_1XX:
            raise HttpProtocolError("net/http: too many 1xx informational responses")


def _one_head(reader: BinaryIO, budget: list[int], first: bytes, method: str) -> Head:
    status_line = (first + _line(reader, budget, "response head")).decode("latin-1")
    status_line = status_line.removesuffix("\n").removesuffix("\r")
    version, space, rest = status_line.partition(" ")
    if not space:
        raise HttpProtocolError(f"malformed HTTP response {go_quote(status_line)}")
    code = rest.lstrip(" ").partition(" ")[0]
    if len(code) != 3 or not code.isascii() or not code.isdigit():
        raise HttpProtocolError(f"malformed HTTP status code {go_quote(code)}")
    minor = _http_version(version)
    head = Head(int(code))
    raw: dict[str, list[str]] = {}
    last = ""
    while True:
        line = _line(reader, budget, "response head").decode("latin-1").rstrip("\r\n")
        if not line:
            break
        if line[0] in " \t":  # obs-fold: a continuation of the previous field's value
            if not last:
                raise HttpProtocolError(f"malformed MIME header initial line: {go_quote(line)}")
            raw[last][-1] += " " + line.strip(" \t")
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise HttpProtocolError(f"malformed MIME header: missing colon: {go_quote(line)}")
        last = name.strip(" \t").lower()
        raw.setdefault(last, []).append(value.strip(" \t"))
    for name, values in raw.items():
        head[name] = ", ".join(values)
    _framing(head, raw, minor, method)
    return head


def _http_version(version: str) -> int:
    """The minor version of `HTTP/1.x` (http.ParseHTTPVersion: one digit each)."""
    if len(version) != 8 or not version.startswith("HTTP/") or version[6] != ".":
        raise HttpProtocolError(f"malformed HTTP version {go_quote(version)}")
    major, minor = version[5], version[7]
    if not (major + minor).isascii() or not (major + minor).isdigit():
        raise HttpProtocolError(f"malformed HTTP version {go_quote(version)}")
    return int(minor) if major == "1" else (99 if major > "1" else -1)


def _framing(head: Head, raw: Mapping[str, list[str]], minor: int, method: str) -> None:
    """How long the body is and whether the connection stays open, as Go's readTransfer
    decides it: one Transfer-Encoding field, exactly `chunked`, overrides any length
    (others are refused: request smuggling); Content-Length fields must agree; a HEAD
    response, 1xx, 204 and 304 have no body whatever they say; without either, the body
    runs to the end of the connection, which then closes."""
    tokens = {t.strip().lower() for t in head.get("connection", "").split(",")}
    if minor == 0:  # HTTP/1.0: closes unless it says keep-alive
        head.keep_alive = "keep-alive" in tokens and "close" not in tokens
    else:
        head.keep_alive = minor > 0 and "close" not in tokens
    encodings = raw.get("transfer-encoding") if minor >= 1 else None  # 1.0: ignored
    if encodings is not None:
        if len(encodings) != 1:
            raise HttpProtocolError(f"too many transfer encodings: {go_quote_list(encodings)}")
        if encodings[0].lower() != "chunked":
            raise HttpProtocolError(f"unsupported transfer encoding: {go_quote(encodings[0])}")
    lengths = raw.get("content-length", [])
    if any(value != lengths[0] for value in lengths[1:]):
        raise HttpProtocolError(
            "http: message cannot contain multiple Content-Length headers; "
            f"got {go_quote_list(lengths)}"
        )
    if head.status == 101:
        head.keep_alive = False  # what follows a switch is not HTTP/1.1
    if method == "HEAD" or 100 <= head.status <= 199 or head.status in (204, 304):
        head.length = 0
    elif encodings is not None:
        head.length = CHUNKED
    elif lengths and lengths[0]:
        text = lengths[0]
        if not (text.isascii() and text.isdigit()) or int(text) >= 1 << 63:
            raise HttpProtocolError(f"bad Content-Length {go_quote(text[:40])}")
        head.length = int(text)
    else:
        head.length = TO_CLOSE
        head.keep_alive = False


def _line(reader: BinaryIO, budget: list[int], what: str) -> bytes:
    """One line, charged to `budget` (bytes left for all lines of `what`)."""
    line = reader.readline(budget[0] + 1)
    budget[0] -= len(line)
    if budget[0] < 0:
        raise HttpProtocolError(f"the {what} is larger than {_limit(API_HEAD)}")
    if not line.endswith(b"\n"):
        raise _UnexpectedEof
    return line


def read_body(reader: BinaryIO, head: Head, limit: int = MAX_BODY) -> bytes:
    """A response body as `head` frames it: chunked (the chunks in total, not each, within
    `limit`), of a Content-Length (refused up front when over `limit`), none, or up to the
    end of the connection."""
    if head.length == CHUNKED:
        return _read_chunked(reader, limit)
    if head.length >= 0:
        if head.length > limit:
            raise HttpProtocolError(f"the response body is larger than {_limit(limit)}")
        return _exactly(reader, head.length)
    data = reader.read(limit + 1)
    if len(data) > limit:
        raise HttpProtocolError(f"the response body is larger than {_limit(limit)}")
    return data


def _read_chunked(reader: BinaryIO, limit: int) -> bytes:
    """Go's chunked reader: a hex size line (core/go/chunked.py), the data, then CRLF
    exactly; trailers after the last chunk are read and dropped."""
    chunks: list[bytes] = []
    total = 0
    budget = [API_HEAD]  # chunk-size lines and trailers: framing, charged like a head
    while True:
        try:
            size = chunk_size(_line(reader, budget, "chunked framing"))
        except ChunkError as exc:
            raise HttpProtocolError(str(exc)) from None
        if size == 0:
            while _line(reader, budget, "chunked framing").strip():
                pass  # trailers
            return b"".join(chunks)
        total += size
        if total > limit:
            raise HttpProtocolError(f"the response body is larger than {_limit(limit)}")
        chunks.append(_exactly(reader, size))
        if _exactly(reader, 2) != b"\r\n":
            raise HttpProtocolError("malformed chunked encoding")


def _exactly(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise _UnexpectedEof
    return data


def _limit(size: int) -> str:
    return f"{describe_size(size)}, the limit for it (docs/hardening.md)"


def _wire_host(host: str) -> str | bytes:
    """An ASCII host as bytes: socket and ssl encode a str host with the idna codec, whose
    import (encodings.idna, stringprep, unicodedata) cost every ADD ~2.5 ms."""
    return host.encode("ascii") if host.isascii() else host


def new_client_context(spare: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """ssl.create_default_context()'s client context before it loads certificates (a
    PROTOCOL_TLS_CLIENT context: hostname checked, certificate required): `spare`, one made
    ahead of time (effects/kube/warm.py), or a new one."""
    import os
    import ssl

    ctx = spare if spare is not None else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if keylog := os.environ.get("SSLKEYLOGFILE"):  # as create_default_context honours it
        ctx.keylog_filename = keylog
    return ctx


def _x509(exc: ssl.SSLCertVerificationError) -> str:
    if exc.verify_code in (18, 19, 20, 21):
        return "certificate signed by unknown authority"
    return str(exc.verify_message or exc.reason or exc)
