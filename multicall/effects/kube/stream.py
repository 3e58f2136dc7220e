"""What a controller needs from the Kubernetes API beyond the plugin's GETs: LIST pages,
WATCH streams, DELETE and POST, and its configuration (a kubeconfig, or the pod's service
account as client-go's and kube-rs's in-cluster config read it).

Rules of this module:
1. It shares the plugin client's primitives: the connection (effects/http.py `Connection`:
   dial, TLS, HTTP/1.1 head parsing), the TLS context (effects/kube/config.py), and
   client-go's wording of transport errors (effects/kube/client.py). It adds no second HTTP
   implementation.
2. Every request has a deadline: the response head must arrive within the headers timeout
   (kubert's `--kube-api-response-headers-timeout`, default 9 s) or the caller's shorter one;
   a LIST body within `LIST_BODY_TIMEOUT`; a WATCH as a whole within the server's
   timeoutSeconds plus `WATCH_GRACE`, so a silent connection ends, and TCP keepalive notices
   a peer that vanished long before that.
3. Memory is bounded: a response body by MAX_BODY (LIST pages are `limit`ed too), a watch by
   one event (core/kube_watch.BodyLines). A watch is read in 64 KiB slices and never buffered.
   Every read is bounded by the connection's deadline (effects/http.py `Connection`): a
   request moves it from the head's to the body's, a watch to its own end; a server that
   drips bytes cannot stretch either. Kubeconfig, token and CA files are read bounded and
   non-blocking (effects/inputs.py), and a GET on a connection the server closed while idle
   is retried once, as Go's transport does.
4. The bearer token is re-read whenever its file changes (kubelet rotates projected service
   account tokens), so a long-running controller never goes `Unauthorized`.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from multicall.core.installer.config import server_host
from multicall.core.kube import paths
from multicall.core.kube.kubeconfig import KubeConfig, parse_kubeconfig
from multicall.core.kube.watch import BodyLines
from multicall.core.limits import KUBECONFIG
from multicall.effects.http import (
    CHUNKED,
    MAX_BODY,
    Connection,
    StaleConnection,
    read_body,
)
from multicall.effects.kube.client import decode_object, status_message, transport_error
from multicall.effects.kube.config import endpoint, read_text_file, read_token, tls_context
from multicall.errors import ConfigError, KubeError

if TYPE_CHECKING:
    from io import BufferedReader

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_HEADERS_TIMEOUT = 9.0  # kubert's ResponseHeadersTimeout default
LIST_BODY_TIMEOUT = 60.0
WATCH_GRACE = 30.0  # beyond timeoutSeconds (at most as much again) before a watch is dead
READ_SIZE = 64 * 1024
IDLE_TIMEOUT = 90.0  # Go's http.Transport IdleConnTimeout
USER_AGENT = "cnibox/linkerd-cni-repair-controller"


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """kubert's ClientArgs: where the configuration comes from, and impersonation."""

    kubeconfig: str = ""
    context: str = ""
    cluster: str = ""
    user: str = ""
    impersonate_user: str = ""
    impersonate_groups: tuple[str, ...] = ()
    headers_timeout: float = DEFAULT_HEADERS_TIMEOUT

    @property
    def customized(self) -> bool:
        return bool(
            self.kubeconfig
            or self.context
            or self.cluster
            or self.user
            or self.impersonate_user
            or self.impersonate_groups
        )


def in_cluster_config(env: Mapping[str, str]) -> KubeConfig:
    """The service account's view of the API: KUBERNETES_SERVICE_HOST/PORT, its token file
    (re-read on rotation) and CA. SERVICE_ACCOUNT_DIR moves the directory (as for install-cni)."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeError(
            "unable to load in-cluster configuration, KUBERNETES_SERVICE_HOST and "
            "KUBERNETES_SERVICE_PORT must be defined"
        )
    directory = env.get("SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT_DIR
    token_file = os.path.join(directory, "token")
    ca_file = os.path.join(directory, "ca.crt")
    for path in (token_file, ca_file):
        if not os.path.isfile(path):
            raise KubeError(f"unable to load in-cluster configuration: {path}: no such file")
    return KubeConfig(
        server=f"https://{server_host(host)}:{port}", token_file=token_file, ca_file=ca_file
    )


def load_config(options: ClientOptions, env: Mapping[str, str]) -> KubeConfig:
    """kubert's order: --kubeconfig, else $KUBECONFIG, else ~/.kube/config; when none can be
    read and no client option was given, the in-cluster configuration."""
    paths = [options.kubeconfig] if options.kubeconfig else _default_kubeconfigs(env)
    first_error: KubeError | None = None
    for path in paths:
        try:
            text = read_text_file(path, limit=KUBECONFIG, what="kubeconfig")
        except KubeError as exc:  # bounded, regular files only (effects/inputs.py)
            first_error = first_error or KubeError(
                f"failed to read kubeconfig {path}: {exc.message}", path=path
            )
            continue
        try:
            return parse_kubeconfig(
                text, options.context or None, cluster_name=options.cluster, user_name=options.user
            )
        except ConfigError as exc:
            raise KubeError(f"{path}: {exc.message}", path=path) from None
    if options.customized and first_error is not None:
        raise first_error
    if options.customized and not paths:
        raise KubeError("no kubeconfig found for the given --context/--cluster/--user")
    return in_cluster_config(env)


def _default_kubeconfigs(env: Mapping[str, str]) -> list[str]:
    if env.get("KUBECONFIG"):
        return [p for p in env["KUBECONFIG"].split(":") if p]
    home = env.get("HOME", "")
    default = os.path.join(home, ".kube", "config") if home else ""
    return [default] if default and os.path.exists(default) else []


class Token:
    """The bearer token: inline, or the token file (the plugin client's reader), read again
    whenever the file changes (inode, mtime, size)."""

    def __init__(self, config: KubeConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        # An inline token is checked at once (core/kube/kubeconfig.check_token); a file's
        # on each read.
        self._value = read_token(config) if config.token or not config.token_file else ""

    def value(self) -> str:
        if self.config.token or not self.config.token_file:
            return self._value
        with self._lock:
            try:
                st = os.stat(self.config.token_file)
            except OSError:
                st = None
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else None
            if stamp is None or stamp != self._stamp:
                try:
                    self._value = read_token(self.config)
                    self._stamp = stamp
                except KubeError:
                    if self._stamp is None:  # never read: nothing to fall back on
                        raise
            return self._value


@dataclass(frozen=True, slots=True)
class Response:
    """A complete API response."""

    status: int
    body: bytes
    url: str = ""

    def json(self) -> Mapping[str, object]:
        return decode_object(self.body, self.url or "the API")


class Session:
    """One connection to the API, for one thread: requests in turn, or one watch."""

    def __init__(self, config: KubeConfig, token: Token, options: ClientOptions) -> None:
        self.config = config
        self.endpoint = endpoint(config.server, config.tls_server_name)
        self.token = token
        self.options = options
        self._conn: Connection | None = None
        self._used = 0.0  # when the keep-alive connection last completed a request
        self._lock = threading.Lock()  # guards _conn against abort() from another thread

    def url(self, path: str) -> str:
        e = self.endpoint
        return f"{e.scheme}://{e.hostport}{e.prefix}{path}"

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def abort(self) -> None:
        """From another thread: end a blocked request or watch now (shutdown)."""
        with self._lock:
            conn = self._conn
        if conn is not None and conn.sock is not None:
            import socket

            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, object] | Sequence[object] | None = None,
        timeout: float | None = None,
        content_type: str = "application/json",
    ) -> Response:
        """One request on the keep-alive connection, its body read whole (≤ MAX_BODY).

        With `timeout`, everything (connect, TLS, head, body) fits in it; without, the head
        gets the headers timeout and the body LIST_BODY_TIMEOUT more."""
        head_deadline = time.monotonic() + (timeout or self.options.headers_timeout)
        verb = method.capitalize()
        payload = _encode(body)
        # Go's transport retries an idempotent request once when a reused connection turns
        # out closed before any of the response (StaleConnection); DELETE and POST are not.
        attempts = 2 if method in ("GET", "HEAD") else 1
        for attempt in range(1, attempts + 1):
            conn = self._connect(head_deadline, verb, path)
            try:
                status, data = conn.exchange(
                    method,
                    self._wire(path),
                    self._headers(payload, content_type),
                    payload,
                    head_deadline,
                    body_deadline=None if timeout else time.monotonic() + LIST_BODY_TIMEOUT,
                )
            except StaleConnection as exc:
                self.close()
                if attempt < attempts:
                    continue
                raise transport_error(exc, verb, self.url(path), conn) from None
            except (OSError, ValueError) as exc:
                self.close()
                raise transport_error(exc, verb, self.url(path), conn) from None
            self._used = time.monotonic()
            return Response(status, data, self.url(path))
        raise AssertionError("unreachable")  # pragma: no cover

    def watch_lines(self, path: str, timeout_seconds: float) -> Iterator[bytes | None]:
        """The lines of a WATCH response as they arrive (None: a dropped oversized line);
        ends when the server ends the watch. StatusError on a non-200 answer, KubeError on a
        broken or silent stream."""
        deadline = time.monotonic() + timeout_seconds + min(WATCH_GRACE, timeout_seconds)
        head_deadline = min(deadline, time.monotonic() + self.options.headers_timeout)
        self.close()  # a watch gets a connection of its own
        conn = self._connect(head_deadline, "Get", path)
        _keepalive(conn)
        streaming = False
        try:
            status, fields = conn.request(
                "GET", self._wire(path), self._headers(b""), b"", head_deadline
            )
            assert conn.reader is not None
            if status != 200:  # its body is read by the head's deadline
                raise StatusError(status, read_body(conn.reader, fields), path)
            lines = BodyLines(chunked=fields.length == CHUNKED)
            streaming = True
            # The stream's own deadline from here on; every read stays bounded by it.
            conn.deadline = deadline
            conn.stage = "body"
            if fields.length >= 0:  # a body of a Content-Length, not a stream: that much only
                yield from lines.feed(read_body(conn.reader, fields))
                yield from lines.finish()
                return
            while not lines.done:
                data = cast("BufferedReader", conn.reader).read1(READ_SIZE)
                if not data:
                    yield from lines.finish()
                    return
                yield from lines.feed(data)
        except TimeoutError:
            if not streaming:
                raise transport_error(TimeoutError(), "Get", self.url(path), conn) from None
            raise KubeError(
                f"watch {self.url(path)}: the stream stayed silent past its "
                f"{timeout_seconds:g}s timeout; dropping the connection"
            ) from None
        except (OSError, ValueError) as exc:
            raise transport_error(exc, "Get", self.url(path), conn) from None
        finally:
            self.close()

    def _wire(self, path: str) -> str:
        return self.endpoint.prefix + path

    def _connect(self, deadline: float, verb: str, path: str) -> Connection:
        if self._conn is not None and _stale(self._conn, time.monotonic() - self._used):
            self.close()
        with self._lock:
            conn = self._conn or Connection(self.endpoint)
            self._conn = conn
        try:
            conn.open(deadline, lambda: tls_context(self.config))
        except (OSError, ValueError) as exc:
            self.close()
            raise transport_error(exc, verb, self.url(path), conn) from None
        return conn

    def _headers(self, payload: bytes, content_type: str = "application/json") -> str:
        lines = [
            f"Host: {self.endpoint.hostport}",
            "Accept: application/json",
            f"User-Agent: {USER_AGENT}",
        ]
        token = self.token.value()
        if token:
            lines.append(f"Authorization: Bearer {token}")
        if self.options.impersonate_user:
            lines.append(f"Impersonate-User: {self.options.impersonate_user}")
        lines += [f"Impersonate-Group: {group}" for group in self.options.impersonate_groups]
        if payload:
            # A PATCH names its kind (JSON patch, strategic merge); everything else is JSON.
            lines += [f"Content-Type: {content_type}", f"Content-Length: {len(payload)}"]
        for line in lines:
            if "\r" in line or "\n" in line:
                raise KubeError("refusing a request header that contains a line break")
        return "".join(f"{line}\r\n" for line in lines)


class StatusError(KubeError):
    """The API answered with an HTTP error status (the Status message is the text)."""

    def __init__(self, status: int, body: bytes, path: str, verb: str = "get") -> None:
        resource, name = _what(path)
        super().__init__(status_message(status, body, (resource, name), verb))
        self.status = status


def _what(path: str) -> tuple[str, str]:
    parts = path.split("?", 1)[0].strip("/").split("/")
    if len(parts) >= 2 and parts[-2] in ("pods", "events"):
        return parts[-2], parts[-1]
    if len(parts) >= 3 and parts[-3] == "nodes":  # nodes/NAME/status
        return "nodes", parts[-2]
    if len(parts) >= 2 and parts[-2] == "nodes":
        return "nodes", parts[-1]
    return parts[-1], ""


def _encode(body: Mapping[str, object] | Sequence[object] | None) -> bytes:
    if body is None:
        return b""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _stale(conn: Connection, idle: float) -> bool:
    """A keep-alive connection not to reuse: idle past IDLE_TIMEOUT, or one the server has
    closed (readable while no request is outstanding: EOF or junk). Reusing it would fail
    the next DELETE, which then waits for the pod's next event to be retried."""
    if conn.sock is None:
        return False
    return idle > IDLE_TIMEOUT or conn.unsolicited()


def _keepalive(conn: Connection) -> None:
    """Probe an idle watch connection: a peer that vanished is noticed in ~1 minute."""
    import socket

    if conn.sock is None:
        return
    sock = conn.sock
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    except OSError:
        pass


# ----------------------------------------------------------------------------- the calls


def delete_pod(session: Session, namespace: str, name: str, timeout: float) -> None:
    """DELETE with `gracePeriodSeconds: 0`, as kube-rs sends DeleteParams (a JSON body)."""
    path = paths.pod(namespace, name)
    answer = session.request("DELETE", path, body={"gracePeriodSeconds": 0}, timeout=timeout)
    if answer.status >= 300:
        raise StatusError(answer.status, answer.body, path, "delete")


def create_event(
    session: Session, namespace: str, event: Mapping[str, object], timeout: float
) -> None:
    path = paths.events(namespace)
    answer = session.request("POST", path, body=event, timeout=timeout)
    if answer.status >= 300:
        raise StatusError(answer.status, answer.body, path, "post")


def list_page(session: Session, path: str) -> Mapping[str, object]:
    answer = session.request("GET", path)
    if answer.status != 200:
        raise StatusError(answer.status, answer.body, path)
    if len(answer.body) >= MAX_BODY:
        raise KubeError("a list page exceeded the response size limit")
    return answer.json()
