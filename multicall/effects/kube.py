"""A minimal Kubernetes API client on `socket` + `ssl`: three GETs, bounded in time.

Rules of this module:
1. Every request has one deadline (`timeout` seconds for connect + TLS + response); a server
   that never answers costs at most that, never client-go's unbounded wait (linkerd2 #2875).
2. Errors read like client-go's: the API's `Status.message` (`Unauthorized`,
   `pods "x" not found`), or `Get "URL": dial tcp ...: connect: connection refused`.
3. One keep-alive connection serves all GETs of an invocation; `ssl` and `socket` are
   imported on first use only (start-up time of DEL/VERSION/skipped pods stays low).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import quote

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
from multicall.core.limits import KUBE_TIMEOUT_DEFAULT, KUBE_TIMEOUT_MAX, KUBECONFIG, TOKEN_FILE
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


def read_kubeconfig(path: str) -> KubeConfig:
    """The kubeconfig at `path` (client-go's ExplicitPath); KubeError when it cannot be used."""
    if not path:
        raise KubeError(
            "invalid configuration: no configuration has been provided, try setting "
            "KUBERNETES_MASTER environment variable"
        )
    # client-go stats an explicit kubeconfig path before opening it.
    text = read_text_file(path, limit=KUBECONFIG, what="kubeconfig", missing_verb="stat")
    try:
        return parse_kubeconfig(text)
    except ConfigError as exc:
        raise KubeError(exc.message, path=path) from None


def read_text_file(path: str, *, limit: int, what: str, missing_verb: str = "open") -> str:
    """A UTF-8 file the client reads (kubeconfig, token), bounded and checked to be a regular
    file (effects/inputs.py); KubeError with client-go's wording of open failures."""
    import errno
    import os

    from multicall.effects.inputs import read_file

    try:
        data = read_file(path, limit=limit, what=what)
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


class KubeClient:
    """GET pods, namespaces and services with a bearer token; one connection, one deadline."""

    def __init__(self, config: KubeConfig, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.config = config
        self.timeout = timeout
        self.endpoint = _endpoint(config.server)
        self._token = _token(config)
        self._conn: _Connection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get_pod(self, namespace: str, name: str) -> Pod:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
        return parse_pod(self._get(path, ("pods", name)))

    def get_namespace(self, name: str) -> Namespace:
        return parse_namespace(
            self._get(f"/api/v1/namespaces/{quote(name, safe='')}", ("namespaces", name))
        )

    def get_service(self, namespace: str, name: str) -> Service:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/services/{quote(name, safe='')}"
        return parse_service(self._get(path, ("services", name)))

    def _url(self, path: str) -> str:
        return f"{self.endpoint.scheme}://{self.endpoint.hostport}{self.endpoint.prefix}{path}"

    def _get(self, path: str, what: tuple[str, str]) -> Mapping[str, object]:
        url = self._url(path)
        deadline = time.monotonic() + self.timeout
        status, body = self._request(self.endpoint.prefix + path, url, deadline)
        if status >= 400:
            raise KubeError(_status_message(status, body, what))
        return decode_object(body, url)

    def _request(self, path: str, url: str, deadline: float) -> tuple[int, bytes]:
        import ssl

        conn = self._conn or _Connection(self.endpoint)
        self._conn = conn
        try:
            conn.open(self.config, deadline)
            return conn.get(path, self._headers(), deadline)
        except ssl.SSLCertVerificationError as exc:
            self.close()
            raise KubeError(
                f'Get "{url}": tls: failed to verify certificate: x509: {_x509(exc)}'
            ) from None
        except TimeoutError:
            detail = conn.timeout_detail()
            self.close()
            raise KubeError(f'Get "{url}": {detail}') from None
        except ConnectionRefusedError:
            self.close()
            raise KubeError(
                f'Get "{url}": dial tcp {self.endpoint.hostport}: connect: connection refused'
            ) from None
        except (OSError, ValueError) as exc:
            self.close()
            reason = (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).lower()
            raise KubeError(f'Get "{url}": {reason}') from None

    def _headers(self) -> str:
        lines = [
            f"Host: {self.endpoint.hostport}",
            "Accept: application/json",
            "User-Agent: cnibox/linkerd-cni",
        ]
        if self._token:
            lines.append(f"Authorization: Bearer {self._token}")
        return "".join(f"{line}\r\n" for line in lines)


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


class _Connection:
    """One HTTP/1.1 keep-alive connection: just GET, Content-Length or chunked bodies.

    http.client is not used: it imports the email package, about as costly as ssl itself,
    on a path every meshed pod start pays.
    """

    def __init__(self, endpoint: _Endpoint) -> None:
        self.endpoint = endpoint
        self.stage = "dial"
        self.sock: socket.socket | None = None
        self.reader: BinaryIO | None = None

    def open(self, config: KubeConfig, deadline: float) -> None:
        if self.sock is not None:
            return
        import socket

        self.stage = "dial"
        host = _wire_host(self.endpoint.host)
        raw = socket.create_connection(
            (host, self.endpoint.port),  # type: ignore[arg-type]  # getaddrinfo takes bytes
            timeout=_remaining(deadline),
        )
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = raw
        if self.endpoint.scheme == "https":
            self.stage = "tls"
            raw.settimeout(_remaining(deadline))
            self.sock = _tls_context(config).wrap_socket(raw, server_hostname=host)
        self.reader = self.sock.makefile("rb")
        self.stage = "request"

    def get(self, path: str, headers: str, deadline: float) -> tuple[int, bytes]:
        assert self.sock is not None
        assert self.reader is not None
        self.sock.settimeout(_remaining(deadline))
        self.sock.sendall(f"GET {path} HTTP/1.1\r\n{headers}\r\n".encode("latin-1"))
        status, fields = _read_head(self.reader)
        body = _read_body(self.reader, fields)
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, body

    def timeout_detail(self) -> str:
        if self.stage == "request":
            return "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        if self.stage == "tls":
            return "net/http: TLS handshake timeout"
        return f"dial tcp {self.endpoint.hostport}: i/o timeout"

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024


def _remaining(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError
    return remaining


def _line(reader: BinaryIO) -> bytes:
    line = reader.readline(MAX_HEAD)
    if not line:
        raise ConnectionResetError(104, "EOF")
    return line


def _read_head(reader: BinaryIO) -> tuple[int, dict[str, str]]:
    status_line = _line(reader).decode("latin-1")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"malformed HTTP response {status_line.strip()!r}")
    fields: dict[str, str] = {}
    while True:
        line = _line(reader).decode("latin-1").rstrip("\r\n")
        if not line:
            return int(parts[1]), fields
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()


def _read_body(reader: BinaryIO, fields: Mapping[str, str]) -> bytes:
    if "chunked" in fields.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        while True:
            size = int(_line(reader).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while _line(reader).strip():
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(_exactly(reader, size))
            _line(reader)
    length = fields.get("content-length")
    if length is not None and length.isdigit():
        return _exactly(reader, int(length))
    return reader.read(MAX_BODY)


def _exactly(reader: BinaryIO, size: int) -> bytes:
    if size > MAX_BODY:
        raise ValueError("response body too large")
    data = reader.read(size)
    if len(data) != size:
        raise ConnectionResetError(104, "short body")
    return data


def _token(config: KubeConfig) -> str:
    """The bearer token: inline, or read from tokenFile (trimmed, as client-go does); refused
    when it could not be sent as one header value (core/kube/kubeconfig.check_token)."""
    if config.token or not config.token_file:
        token, field = config.token.strip(), TOKEN_FIELD
    else:
        token = read_text_file(config.token_file, limit=TOKEN_FILE, what="token file").strip()
        field = f"the token file {config.token_file} (users[].user.tokenFile)"
    try:
        return check_token(token, field)
    except ConfigError as exc:
        raise KubeError(exc.message) from None


def _wire_host(host: str) -> str | bytes:
    """An ASCII host as bytes: socket and ssl encode a str host with the idna codec, whose
    import (encodings.idna, stringprep, unicodedata) cost every ADD ~2.5 ms."""
    return host.encode("ascii") if host.isascii() else host


def _tls_context(config: KubeConfig) -> ssl.SSLContext:
    import ssl

    if config.insecure_skip_tls_verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        if config.ca_data:
            return ssl.create_default_context(cadata=config.ca_data.decode("ascii", "replace"))
        if config.ca_file:
            return ssl.create_default_context(cafile=config.ca_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise KubeError(f"unable to load root certificates: {exc}") from None
    return ssl.create_default_context()


def _x509(exc: ssl.SSLCertVerificationError) -> str:
    if exc.verify_code in (18, 19, 20, 21):
        return "certificate signed by unknown authority"
    return str(exc.verify_message or exc.reason or exc)


def _status_message(status: int, body: bytes, what: tuple[str, str]) -> str:
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
        404: f"the server could not find the requested resource (get {resource} {name})",
    }
    if status in generic:
        return generic[status]
    text = body.decode("utf-8", "replace").strip()
    return (
        f'an error on the server ("{text}") has prevented the request from succeeding '
        f"(get {resource} {name})"
    )
