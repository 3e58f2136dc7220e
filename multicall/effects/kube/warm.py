"""Warm API connections: what a node agent's worker makes before its request arrives, so the
TCP and TLS handshakes (and OpenSSL's SSL_CTX_new, ~4 ms) are off the pod's critical path.

A `WarmConnections` is one process's pool: the agent creates it, a worker inherits it at
fork (each process its own), and it reaches the request's client through
`KubeClient(..., warm=...)` (plugin/ports.py `RealKube`). A one-shot process has none: its
client dials, and makes its TLS context, itself.

Rules (docs/agent.md, "Warm API connections"):
1. An idle worker dials the API server (`warm_up`) with the endpoint and CA of the previous
   request (`warm_hint`, never its token: a warm connection sends nothing).
2. A request's client adopts that connection only for the same server and trust settings,
   young (WARM_MAX_AGE) and still open, and treats it as a reused keep-alive connection
   (effects/http.py rule 3: retried once if the server closed it, never after a timeout).
3. A worker that serves several requests (`park_connections`) keeps the connection a
   request ended with, when it is intact, as the next request's warm one. A kubeconfig that
   trusts a CA file (read per request, opened by the caller) neither leaves nor adopts
   one.
4. The TLS client context of a trust setting (CA data, or insecure) is made once per
   process and used by every later request and warm-up with exactly the same setting
   (`tls_context`): making it (SSL_CTX_new, loading the CA) was ~0.8 ms of each ADD a
   reused worker served. A context holds only trust (no client identity: bearer tokens
   only), and nothing of a connection's is set on it, so one caller's context is another's
   with the same CA bytes. A CA file is read and its context made per request.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.core.kube.kubeconfig import KubeConfig
from multicall.effects.caller import OWN_FILES, Files
from multicall.effects.http import Connection, Endpoint, new_client_context
from multicall.effects.kube.config import endpoint as server_endpoint
from multicall.effects.kube.config import tls_context
from multicall.errors import KubeError

if TYPE_CHECKING:
    import socket
    import ssl

WARM_MAX_AGE = 60.0  # older: not trusted to be alive (idle-connection reapers in between)
MAX_HINT_CA = 16 * 1024
MAX_CONTEXTS = 4  # trust settings kept (rule 4); a node's callers share one

_WarmKey = tuple[str, str, int, str, bytes, str, bool]


@dataclass
class _Warm:
    """A kept-alive connection and what it was made for."""

    key: _WarmKey
    sock: socket.socket
    made: float


def _warm_key(endpoint: Endpoint, config: KubeConfig) -> _WarmKey:
    # ca_file is part of the key: a warm connection (always made from CA data or the system
    # roots) must not serve a request that trusts a CA file instead.
    return (endpoint.scheme, endpoint.host, endpoint.port, endpoint.server_name, config.ca_data,
            config.ca_file, config.insecure_skip_tls_verify)  # fmt: skip


class WarmConnections:
    """One process's warm connection (at most one), the TLS context made ahead of time, and
    the configuration of its last request (for `warm_hint`)."""

    def __init__(self) -> None:
        self._warm: _Warm | None = None
        self._spare: ssl.SSLContext | None = None
        self._last_config: KubeConfig | None = None
        self._parking = False  # `park_connections`
        self._contexts: dict[tuple[bytes, bool], ssl.SSLContext] = {}  # rule 4

    # ------------------------------------------------------------------ the agent's side

    def keep_spare_tls_context(self) -> None:
        """Make one client context now, for the next request of this process (or its forks):
        OpenSSL 3's SSL_CTX_new costs ~4 ms, which a worker inherits already paid."""
        import ssl

        self._spare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

    def park_connections(self) -> None:
        """A worker that serves several requests (rule 3): a request's connection, intact
        when its client closes, becomes the next request's warm connection."""
        self._parking = True

    def warm_hint(self) -> dict[str, object] | None:
        """What `warm_up` needs to reach the API server of this process's last request (not
        its token: a warm connection sends nothing); None when it used a CA file (read per
        request, opened by the caller) or CA data over MAX_HINT_CA."""
        config = self._last_config
        if config is None:
            return None
        if config.ca_file or len(config.ca_data) > MAX_HINT_CA:
            return None
        return {"server": config.server, "ca_data": config.ca_data.decode("ascii", "replace"),
                "insecure": config.insecure_skip_tls_verify,
                "tls_server_name": config.tls_server_name}  # fmt: skip

    def warm_up(self, hint: Mapping[str, object], timeout: float = 2.0) -> None:
        """Dial and handshake now, for the next request; failures are the request's to see."""
        server, ca_data = hint.get("server"), hint.get("ca_data")
        if not isinstance(server, str) or not isinstance(ca_data, str):
            return
        name = hint.get("tls_server_name")
        config = KubeConfig(server=server, ca_data=ca_data.encode("ascii", "replace"),
                            insecure_skip_tls_verify=hint.get("insecure") is True,
                            tls_server_name=name if isinstance(name, str) else "")  # fmt: skip
        try:
            endpoint = server_endpoint(server, config.tls_server_name)
        except (KubeError, ValueError):
            return
        warm = self._warm
        if (
            warm is not None
            and warm.key == _warm_key(endpoint, config)
            and (time.monotonic() - warm.made < WARM_MAX_AGE / 2)
        ):
            return  # the previous request's connection, kept (`park_connections`)
        self.drop_warm()  # one at a time
        try:
            conn = Connection(endpoint)
            tls = self.tls_context(config) if endpoint.scheme == "https" else None
            conn.open(time.monotonic() + timeout, tls)
        except (KubeError, OSError, ValueError):
            return
        finally:
            if self._spare is None:  # the warm-up took it: the request's own is made now, not then
                self.keep_spare_tls_context()
        assert conn.sock is not None
        sock, conn.sock = conn.sock, None
        conn.close()  # its reader only: the socket goes to the request that adopts it
        self._warm = _Warm(_warm_key(endpoint, config), sock, time.monotonic())

    def warm_fds(self) -> frozenset[int]:
        """The descriptor of the warm connection, if there is one (kept open on purpose)."""
        return frozenset() if self._warm is None else frozenset([self._warm.sock.fileno()])

    def drop_warm(self) -> None:
        """Forget the warm connection (the request runs from another netns than it was made in)."""
        warm, self._warm = self._warm, None
        if warm is not None:
            warm.sock.close()

    # ------------------------------------------------------------------ the client's side

    def new_client_context(self) -> ssl.SSLContext:
        """A client context: the spare one when there is one (taken), else a new one."""
        spare, self._spare = self._spare, None
        return new_client_context(spare)

    def tls_context(self, config: KubeConfig, files: Files = OWN_FILES) -> ssl.SSLContext:
        """The client context for `config`'s trust settings (rule 4): the one this process
        made for the same CA data (or insecure), else a new one, kept."""
        if config.ca_file:
            return tls_context(config, self.new_client_context, files)
        key = (config.ca_data, config.insecure_skip_tls_verify)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = tls_context(config, self.new_client_context, files)
            if len(self._contexts) >= MAX_CONTEXTS:
                self._contexts.clear()
            self._contexts[key] = ctx
        return ctx

    def remember(self, config: KubeConfig) -> None:
        """A client of this process was made for `config` (what `warm_hint` says)."""
        self._last_config = config

    def adopt(self, endpoint: Endpoint, config: KubeConfig) -> socket.socket | None:
        """The warm connection's socket if a request to `endpoint` with `config`'s trust may
        use it (rule 2), taken from the pool; else None, and the warm one is closed."""
        warm, self._warm = self._warm, None
        if warm is None:
            return None
        fresh = time.monotonic() - warm.made < WARM_MAX_AGE
        if warm.key == _warm_key(endpoint, config) and fresh and _still_open(warm.sock):
            return warm.sock
        warm.sock.close()
        return None

    def keep(self, endpoint: Endpoint, config: KubeConfig, conn: Connection) -> bool:
        """A client is done with `conn`: True when it became the warm connection (parking,
        not a CA-file kubeconfig, intact between two exchanges; rule 3); False: the caller
        closes it."""
        if not self._parking or config.ca_file:
            return False
        sock = conn.detach_idle()
        if sock is None:
            return False
        self.drop_warm()
        self._warm = _Warm(_warm_key(endpoint, config), sock, time.monotonic())
        return True


def _still_open(sock: socket.socket) -> bool:
    """Nothing but TLS housekeeping (TLS 1.3 session tickets) arrived since the handshake:
    no EOF, no unexpected bytes. (Its timeout is set again by every use: http.py rule 1.)"""
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
