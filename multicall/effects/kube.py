"""A minimal Kubernetes API client on `socket` + `ssl`: three GETs, bounded in time and
memory, and the HTTP/1.1 primitives other API clients of cnibox share.

Rules of this module:
1. One deadline per client (`timeout` seconds from its creation, CNIBOX_KUBE_TIMEOUT) covers
   everything: name resolution, connect, TLS, every read of every head and body of every
   GET. A server that never answers, or answers one byte at a time, costs at most that,
   never client-go's unbounded wait (linkerd2 #2875). `_Connection` says how.
2. Memory: a response head is at most API_HEAD, a body (chunked: all chunks together) at
   most the caller's limit (API_OBJECT for the plugin's GETs), refused with the limit named.
3. What goes on the wire is checked first: the server URL and the token
   (core/kube/kubeconfig.py `parse_server`, `check_token`) cannot inject headers.
4. Errors read like client-go's: the API's `Status.message` (`Unauthorized`,
   `pods "x" not found`), or `Get "URL": dial tcp ...: connect: connection refused`.
5. One keep-alive connection serves all GETs of an invocation; if the server closed it while
   idle (nothing of a response arrives), a GET is retried once on a new connection, as Go's
   transport retries idempotent requests. `ssl` and `socket` are imported on first use only
   (start-up time of DEL/VERSION/skipped pods stays low).
6. In a node agent's worker only (never in a one-shot process) the connection may have been
   made before the request arrived (`warm_up`, "warm connections" below): adopted only for
   the same server and trust settings, young and still open, and treated as a reused
   keep-alive connection (rule 5: retried once if the server closed it, never after a
   timeout). A worker that serves several requests keeps the connection a request ended
   with, when it is intact, as the next request's warm one (`park_connections`). Files the
   client reads (kubeconfig, token, CA) are read by effects/inputs.py through the `Files`
   the client is given (effects/caller.py: a worker passes the caller's root).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from multicall.core.kube import paths
from multicall.core.kube.kubeconfig import (
    TOKEN_FIELD,
    KubeConfig,
    check_token,
    parse_kubeconfig,
    parse_server,
)
from multicall.core.kube.objects import (
    Namespace,
    Pod,
    Service,
    parse_namespace,
    parse_pod,
    parse_service,
)
from multicall.core.limits import (
    API_HEAD,
    API_OBJECT,
    CA_FILE,
    KUBE_TIMEOUT_DEFAULT,
    KUBE_TIMEOUT_MAX,
    KUBECONFIG,
    TOKEN_FILE,
    describe_size,
)
from multicall.effects.caller import OWN_FILES, Files
from multicall.errors import CNI_INVALID_ENV, CniError, ConfigError, KubeError, UnreadableInput

if TYPE_CHECKING:
    import socket
    import ssl

DEFAULT_TIMEOUT = KUBE_TIMEOUT_DEFAULT
TIMEOUT_ENV = "CNIBOX_KUBE_TIMEOUT"


def timeout_from_env(env: Mapping[str, str]) -> float:
    """`CNIBOX_KUBE_TIMEOUT`: the seconds all API requests of one invocation may take
    together; the default when unset or empty, clamped to KUBE_TIMEOUT_MAX (`inf` too);
    CniError (invalid environment) for anything that is not a positive number."""
    import math

    raw = env.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value <= 0:
        raise CniError(
            CNI_INVALID_ENV,
            f"{TIMEOUT_ENV}={raw[:40]!r} is not a number of seconds above 0 "
            f"(the default is {DEFAULT_TIMEOUT:g}, at most {KUBE_TIMEOUT_MAX:g} is used)",
        )
    return min(value, KUBE_TIMEOUT_MAX)


def read_kubeconfig(path: str, *, files: Files = OWN_FILES) -> KubeConfig:
    """The kubeconfig at `path` (client-go's ExplicitPath) in `files`' filesystem; KubeError
    when it cannot be used."""
    if not path:
        raise KubeError(
            "invalid configuration: no configuration has been provided, try setting "
            "KUBERNETES_MASTER environment variable"
        )
    # client-go stats an explicit kubeconfig path before opening it.
    text = read_text_file(
        path, limit=KUBECONFIG, what="kubeconfig", missing_verb="stat", files=files
    )
    try:
        return parse_kubeconfig(text)
    except ConfigError as exc:
        raise KubeError(exc.message, path=path) from None


def read_text_file(
    path: str, *, limit: int, what: str, missing_verb: str = "open", files: Files = OWN_FILES
) -> str:
    """A UTF-8 file the client reads (kubeconfig, token), bounded and checked to be a regular
    file (effects/inputs.py); KubeError with client-go's wording of open failures."""
    import errno
    import os

    from multicall.effects.inputs import read_file

    try:
        data = read_file(path, limit=limit, what=what, files=files)
    except UnreadableInput as exc:
        if exc.errno == errno.ENOENT:
            raise KubeError(
                f"{missing_verb} {path}: no such file or directory", path=path
            ) from None
        if exc.errno is not None:
            reason = os.strerror(exc.errno).lower()
            raise KubeError(f"open {path}: {reason}", path=path) from None
        raise KubeError(exc.message, path=path) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KubeError(
            f"{what} {path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            path=path,
        ) from None


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """Where the API server is: scheme, host, port and path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    @property
    def hostport(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _endpoint(server: str) -> _Endpoint:
    try:
        url = parse_server(server)
    except ConfigError as exc:
        raise KubeError(exc.message) from None
    return _Endpoint(url.scheme, url.host, url.port, url.prefix)


MAX_BODY = 64 * 1024 * 1024  # what any caller may ask for (a LIST page); GETs ask API_OBJECT
READ_SIZE = 64 * 1024


class KubeClient:
    """GET pods, namespaces and services with a bearer token: one connection, and one
    deadline for everything the client does (rule 1), from its creation on."""

    def __init__(
        self, config: KubeConfig, *, timeout: float = DEFAULT_TIMEOUT, files: Files = OWN_FILES
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.endpoint = _endpoint(config.server)
        self._token = _token(config, files)
        # The CA is read now: a file that cannot be one fails before any connection.
        self._tls = _tls_context(config, files) if self.endpoint.scheme == "https" else None
        self._conn: _Connection | None = None
        _last_config[:] = [config]  # for an agent worker's `warm_hint`

    def close(self) -> None:
        """Done: the connection closes, or (in an agent worker, rule 6) waits for the next
        request when it is intact and trusted as a warm one would be."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if _parking and not self.config.ca_file and (sock := conn.detach_idle()) is not None:
            drop_warm()
            _warm[:] = [_Warm(_warm_key(self.endpoint, self.config), sock, time.monotonic())]
            return
        conn.close()

    def _discard(self) -> None:
        """The connection failed: closed, never kept."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get_pod(self, namespace: str, name: str) -> Pod:
        return parse_pod(self._get(paths.pod(namespace, name), ("pods", name)))

    def get_namespace(self, name: str) -> Namespace:
        return parse_namespace(self._get(paths.namespace(name), ("namespaces", name)))

    def get_service(self, namespace: str, name: str) -> Service:
        return parse_service(self._get(paths.service(namespace, name), ("services", name)))

    def _url(self, path: str) -> str:
        return f"{self.endpoint.scheme}://{self.endpoint.hostport}{self.endpoint.prefix}{path}"

    def _get(self, path: str, what: tuple[str, str]) -> Mapping[str, object]:
        url = self._url(path)
        status, body = self._request(self.endpoint.prefix + path, url, self.deadline)
        if status >= 400:
            raise KubeError(_status_message(status, body, what))
        return decode_object(body, url)

    def _request(self, path: str, url: str, deadline: float) -> tuple[int, bytes]:
        for attempt in (1, 2):
            conn = self._conn or _Connection(self.endpoint)
            self._conn = conn
            try:
                conn.open(self.config, deadline, self._tls)
                return conn.get(path, self._headers(), deadline, max_body=API_OBJECT)
            except StaleConnection:
                self._discard()  # closed by the server while idle: once more, on a new one
                if attempt == 2:
                    raise KubeError(f'Get "{url}": EOF') from None
            except (OSError, ValueError) as exc:
                self._discard()
                raise transport_error(exc, "Get", url, conn) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _headers(self) -> str:
        lines = [
            f"Host: {self.endpoint.hostport}",
            "Accept: application/json",
            "User-Agent: cnibox/linkerd-cni",
        ]
        if self._token:
            lines.append(f"Authorization: Bearer {self._token}")
        return "".join(f"{line}\r\n" for line in lines)


def transport_error(exc: OSError | ValueError, verb: str, url: str, conn: _Connection) -> KubeError:
    """A failed request's error in client-go's words: `Get "URL": dial tcp ...: connection
    refused`, `... TLS handshake timeout`, `... x509: certificate signed by unknown authority`,
    `... (Client.Timeout exceeded while reading body)`. Shared by every request and watch."""
    return KubeError(f'{verb} "{url}": {_failure(exc, conn)}')


def _failure(exc: OSError | ValueError, conn: _Connection) -> str:
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


def decode_object(body: bytes, url: str) -> Mapping[str, object]:
    """An API response body as a JSON object; KubeError naming the URL otherwise."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise KubeError(f"{url}: the server answered with JSON nested too deeply") from None
    except ValueError:  # UnicodeDecodeError included
        raise KubeError(f"{url}: the server answered with invalid JSON") from None
    if not isinstance(doc, dict):
        raise KubeError(f"{url}: the server answered with a non-object")
    return doc


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


class _Connection:
    """One HTTP/1.1 keep-alive connection: requests, Content-Length or chunked bodies.

    http.client is not used: it imports the email package, about as costly as ssl itself,
    on a path every meshed pod start pays.

    Time: `deadline` (monotonic) bounds everything. Name resolution runs in a helper thread
    joined with the time left; each connect gets the time left; the TLS handshake and
    `sendall` get it as a whole (CPython applies one deadline per call); every read of the
    buffered `reader` sets the socket timeout to the time left first (`_DeadlineReader`), so a
    server sending one byte at a time cannot stretch a request past its deadline. Callers
    that stream (a watch) move `deadline` as their own semantics require.
    """

    def __init__(self, endpoint: _Endpoint) -> None:
        self.endpoint = endpoint
        self.stage = "dial"
        self.sock: socket.socket | None = None
        self.reader: BinaryIO | None = None
        self.deadline = 0.0
        self.completed = 0  # responses read in full on this connection
        self.warm = False  # adopted from `warm_up` (rule 6): reused, as a kept-alive one is
        self.between = False  # the last response was read in full, no request since

    def open(self, config: KubeConfig, deadline: float, tls: ssl.SSLContext | None = None) -> None:
        """Connect (and TLS: with `tls`, else a context made from `config`) by `deadline`."""
        if self.sock is not None:
            return
        self.deadline = deadline
        if (adopted := _adopt_warm(self.endpoint, config)) is not None:
            # A new reader: every read is bounded by this connection's deadline, not the
            # warm-up's. Nothing was read on it yet (`_still_open`), so nothing is lost.
            self.sock, self.warm = adopted, True
            self.reader = io.BufferedReader(_DeadlineReader(self), READ_SIZE)
            self.stage = "request"
            return
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
            context = tls or _tls_context(config)
            self.sock = context.wrap_socket(raw, server_hostname=host)
        self.reader = io.BufferedReader(_DeadlineReader(self), READ_SIZE)
        self.stage = "request"

    def request(
        self, method: str, path: str, headers: str, body: bytes, deadline: float
    ) -> tuple[int, dict[str, str]]:
        """Send one request and read the response head; the body is the caller's to read.

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
            return _read_head(self.reader)
        except _NothingReceived:
            if reused:
                raise StaleConnection from None
            raise

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
        data = _read_body(self.reader, fields, max_body)
        self.completed += 1
        self.between = True
        if fields.get("connection", "").lower() == "close":
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

    def detach_idle(self) -> socket.socket | None:
        """The socket, taken from this connection, when it sits between two exchanges: every
        response was read in full and nothing more is buffered (bytes the server sent out of
        turn: the connection is closed instead, as Go's transport closes it). Else None."""
        if self.sock is None or self.reader is None or not self.between:
            return None
        reader = self.reader
        assert isinstance(reader, io.BufferedReader)
        assert isinstance(reader.raw, _DeadlineReader)
        reader.raw.peeking = True  # a read the buffer cannot answer returns "nothing yet"
        try:
            extra = reader.peek(1)
        except OSError:
            extra = b"?"
        if extra:
            return None
        sock, self.sock = self.sock, None
        self.reader = None  # (its raw reader closes nothing)
        return sock


# ----------------------------------------------------------------------------- warm connections
# A node agent's idle worker dials the API server (TCP + TLS) before its request arrives
# (`warm_up`, with the endpoint and CA of the previous request, `warm_hint`); the request's
# KubeClient adopts that connection when endpoint and TLS settings are the same, so the
# handshake is off the pod's critical path. Never in a one-shot process (rule 6).
WARM_MAX_AGE = 60.0  # older: not trusted to be alive (idle-connection reapers in between)
MAX_HINT_CA = 16 * 1024

_WarmKey = tuple[str, str, int, bytes, str, bool]


@dataclass
class _Warm:
    """A kept-alive connection and what it was made for."""

    key: _WarmKey
    sock: socket.socket
    made: float


_warm: list[_Warm] = []
_last_config: list[KubeConfig] = []
_parking = False  # `park_connections`


def park_connections() -> None:
    """A node agent's worker that serves several requests (rule 6): a request's connection,
    intact when its client closes, becomes the next request's warm connection."""
    global _parking  # noqa: PLW0603 - set once, in a worker
    _parking = True


def _warm_key(endpoint: _Endpoint, config: KubeConfig) -> _WarmKey:
    # ca_file is part of the key: a warm connection (always made from CA data or the system
    # roots) must not serve a request that trusts a CA file instead.
    return (endpoint.scheme, endpoint.host, endpoint.port, config.ca_data, config.ca_file,
            config.insecure_skip_tls_verify)  # fmt: skip


def warm_hint() -> dict[str, object] | None:
    """What `warm_up` needs to reach the API server of this process's last request (not its
    token: a warm connection sends nothing); None when it used a CA file (read per request,
    through the caller's root) or CA data over MAX_HINT_CA."""
    if not _last_config:
        return None
    config = _last_config[0]
    if config.ca_file or len(config.ca_data) > MAX_HINT_CA:
        return None
    return {"server": config.server, "ca_data": config.ca_data.decode("ascii", "replace"),
            "insecure": config.insecure_skip_tls_verify}  # fmt: skip


def warm_up(hint: Mapping[str, object], timeout: float = 2.0) -> None:
    """Dial and handshake now, for the next request; failures are the request's to see."""
    server, ca_data = hint.get("server"), hint.get("ca_data")
    if not isinstance(server, str) or not isinstance(ca_data, str):
        return
    config = KubeConfig(server=server, ca_data=ca_data.encode("ascii", "replace"),
                        insecure_skip_tls_verify=hint.get("insecure") is True)  # fmt: skip
    try:
        endpoint = _endpoint(server)
    except (KubeError, ValueError):
        return
    if (
        _warm
        and _warm[0].key == _warm_key(endpoint, config)
        and (time.monotonic() - _warm[0].made < WARM_MAX_AGE / 2)
    ):
        return  # the previous request's connection, kept (`park_connections`)
    drop_warm()  # one at a time; and `open` below must dial, not adopt
    try:
        conn = _Connection(endpoint)
        tls = _tls_context(config) if endpoint.scheme == "https" else None
        conn.open(config, time.monotonic() + timeout, tls)
    except (KubeError, OSError, ValueError):
        return
    finally:
        if not _spare:  # the warm-up took it: the request's own context is made now, not then
            keep_spare_tls_context()
    assert conn.sock is not None
    sock, conn.sock = conn.sock, None
    conn.close()  # its reader only: the socket goes to the request that adopts it
    _warm[:] = [_Warm(_warm_key(endpoint, config), sock, time.monotonic())]


def warm_fds() -> frozenset[int]:
    """The descriptor of the warm connection, if there is one (kept open on purpose)."""
    return frozenset(w.sock.fileno() for w in _warm)


def drop_warm() -> None:
    """Forget the warm connection (the request runs from another netns than it was made in)."""
    for warm in _warm:
        warm.sock.close()
    _warm.clear()


def _still_open(sock: socket.socket) -> bool:
    """Nothing but TLS housekeeping (TLS 1.3 session tickets) arrived since the handshake:
    no EOF, no unexpected bytes. (Its timeout is set again by every use: rule 1.)"""
    import select
    import ssl

    if not select.select([sock], [], [], 0)[0]:
        return True
    sock.setblocking(False)
    try:
        sock.recv(1)  # b"": closed; a byte: the server is talking out of turn
    except (ssl.SSLWantReadError, BlockingIOError):
        return True
    except OSError:
        return False
    return False


def _adopt_warm(endpoint: _Endpoint, config: KubeConfig) -> socket.socket | None:
    """The warm connection's socket if this request may use it; else it is closed."""
    if not _warm:
        return None
    warm = _warm.pop()
    fresh = time.monotonic() - warm.made < WARM_MAX_AGE
    if warm.key == _warm_key(endpoint, config) and fresh and _still_open(warm.sock):
        return warm.sock
    warm.sock.close()
    return None


class _DeadlineReader(io.RawIOBase):
    """The connection's socket as a raw stream whose every read is bounded by the time left
    until the connection's deadline (TimeoutError once it has passed)."""

    def __init__(self, conn: _Connection) -> None:
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


def _read_head(reader: BinaryIO, limit: int = API_HEAD) -> tuple[int, dict[str, str]]:
    """The status and header fields (lower-case names) of a response, at most `limit` bytes
    in all. _NothingReceived when the connection ends before the first byte."""
    budget = [limit - 1]
    try:
        first = reader.read(1)
    except ConnectionResetError:
        first = b""
    if not first:
        raise _NothingReceived(104, "EOF")
    status_line = (first + _line(reader, budget, "response head")).decode("latin-1")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise HttpProtocolError(f"malformed HTTP response {status_line.strip()[:80]!r}")
    fields: dict[str, str] = {}
    while True:
        line = _line(reader, budget, "response head").decode("latin-1").rstrip("\r\n")
        if not line:
            return int(parts[1][:3]), fields
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()


def _line(reader: BinaryIO, budget: list[int], what: str) -> bytes:
    """One line, charged to `budget` (bytes left for all lines of `what`)."""
    line = reader.readline(budget[0] + 1)
    budget[0] -= len(line)
    if budget[0] < 0:
        raise HttpProtocolError(f"the {what} is larger than {_limit(API_HEAD)}")
    if not line.endswith(b"\n"):
        raise _UnexpectedEof
    return line


def _read_body(reader: BinaryIO, fields: Mapping[str, str], limit: int = MAX_BODY) -> bytes:
    """A response body: chunked (the chunks in total, not each, within `limit`), of a
    Content-Length (refused up front when over `limit`), or up to the end of the connection."""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return _read_chunked(reader, limit)
    length = fields.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise HttpProtocolError(f"bad Content-Length {length[:40]!r}")
        if int(length) > limit:
            raise HttpProtocolError(f"the response body is larger than {_limit(limit)}")
        return _exactly(reader, int(length))
    data = reader.read(limit + 1)
    if len(data) > limit:
        raise HttpProtocolError(f"the response body is larger than {_limit(limit)}")
    return data


def _read_chunked(reader: BinaryIO, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    budget = [API_HEAD]  # chunk-size lines and trailers: framing, charged like a head
    while True:
        size_text = _line(reader, budget, "chunked framing").split(b";")[0].strip()
        if not size_text or len(size_text) > 16 or not all(c in _HEX for c in size_text):
            raise HttpProtocolError(f"malformed chunked encoding {size_text[:20]!r}")
        size = int(size_text, 16)
        if size == 0:
            while _line(reader, budget, "chunked framing").strip():
                pass  # trailers
            return b"".join(chunks)
        total += size
        if total > limit:
            raise HttpProtocolError(f"the response body is larger than {_limit(limit)}")
        chunks.append(_exactly(reader, size))
        if _line(reader, budget, "chunked framing").strip():
            raise HttpProtocolError("malformed chunked encoding: no CRLF after a chunk")


_HEX = frozenset(b"0123456789abcdefABCDEF")


def _exactly(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise _UnexpectedEof
    return data


def _limit(size: int) -> str:
    return f"{describe_size(size)}, the limit for it (docs/hardening.md)"


def _token(config: KubeConfig, files: Files = OWN_FILES) -> str:
    """The bearer token: inline, or read from tokenFile (trimmed, as client-go does); refused
    when it could not be sent as one header value (core/kube/kubeconfig.check_token)."""
    if config.token or not config.token_file:
        token, field = config.token.strip(), TOKEN_FIELD
    else:
        token = read_text_file(
            config.token_file, limit=TOKEN_FILE, what="token file", files=files
        ).strip()
        field = f"the token file {config.token_file} (users[].user.tokenFile)"
    try:
        return check_token(token, field)
    except ConfigError as exc:
        raise KubeError(exc.message) from None


def _wire_host(host: str) -> str | bytes:
    """An ASCII host as bytes: socket and ssl encode a str host with the idna codec, whose
    import (encodings.idna, stringprep, unicodedata) cost every ADD ~2.5 ms."""
    return host.encode("ascii") if host.isascii() else host


def _tls_context(config: KubeConfig, files: Files = OWN_FILES) -> ssl.SSLContext:
    """ssl.create_default_context()'s client context for `config`'s trust settings, on the
    spare context when there is one (`keep_spare_tls_context`)."""
    import ssl

    if config.insecure_skip_tls_verify:
        ctx = _new_client_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if config.ca_data:
        pem = config.ca_data.decode("ascii", "replace")
    elif config.ca_file:
        # Read as every input is (bounded, a regular file, no blocking open; in an agent's
        # worker through the caller's root): OpenSSL's own fopen would wait forever on a
        # FIFO and read /dev/zero without end.
        pem = read_text_file(
            config.ca_file, limit=CA_FILE, what="certificate-authority file", files=files
        )
    else:
        ctx = _new_client_context()
        ctx.load_default_certs()
        return ctx
    ctx = _new_client_context()
    try:
        ctx.load_verify_locations(cadata=pem)
    except (ssl.SSLError, ValueError):
        # Go's x509.CertPool.AppendCertsFromPEM wording, not OpenSSL's error codes.
        raise KubeError(
            "unable to load root certificates: unable to parse bytes as PEM block"
        ) from None
    return ctx


# A client context made ahead of time (`keep_spare_tls_context`): OpenSSL 3's SSL_CTX_new
# costs ~4 ms, which a node agent's worker inherits already paid from its parent.
_spare: list[ssl.SSLContext] = []


def keep_spare_tls_context() -> None:
    """Make one client context now, for the next request of this process (or its forks)."""
    import ssl

    _spare[:] = [ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)]


def _new_client_context() -> ssl.SSLContext:
    """ssl.create_default_context()'s client context before it loads certificates (a
    PROTOCOL_TLS_CLIENT context: hostname checked, certificate required)."""
    import os
    import ssl

    ctx = _spare.pop() if _spare else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if keylog := os.environ.get("SSLKEYLOGFILE"):  # as create_default_context honours it
        ctx.keylog_filename = keylog
    return ctx


def _x509(exc: ssl.SSLCertVerificationError) -> str:
    if exc.verify_code in (18, 19, 20, 21):
        return "certificate signed by unknown authority"
    return str(exc.verify_message or exc.reason or exc)


def _status_message(status: int, body: bytes, what: tuple[str, str], verb: str = "get") -> str:
    """client-go's error text: the Status object's message, else its generic wording."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        message = doc.get("message")
        if isinstance(message, str) and message:
            return message
    resource, name = what
    generic = {
        401: "Unauthorized",
        403: "Forbidden",
        404: f"the server could not find the requested resource ({verb} {resource} {name})",
    }
    if status in generic:
        return generic[status]
    text = body.decode("utf-8", "replace").strip()
    return (
        f'an error on the server ("{text}") has prevented the request from succeeding '
        f"({verb} {resource} {name})"
    )
