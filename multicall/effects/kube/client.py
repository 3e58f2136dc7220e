"""The plugin's Kubernetes API client: three GETs (pod, namespace, service) with a bearer
token, on one HTTP/1.1 connection (effects/http.py), bounded in time and memory; and the
reading of API answers that every client of cnibox shares (client-go's error texts).

Rules of this module:
1. One deadline per client (`timeout` seconds from its creation, CNIBOX_KUBE_TIMEOUT) covers
   everything: name resolution, connect, TLS, every read of every head and body of every
   GET (effects/http.py rule 1).
2. Memory: a body is at most API_OBJECT, refused with the limit named (effects/http.py).
3. What goes on the wire is checked first: the server URL and the token
   (core/kube/kubeconfig.py `parse_server`, `check_token`) cannot inject headers.
4. Errors read like client-go's: the API's `Status.message` (`Unauthorized`,
   `pods "x" not found`), or `Get "URL": dial tcp ...: connect: connection refused`.
5. One keep-alive connection serves all GETs of an invocation; if the server closed it while
   idle (nothing of a response arrives), a GET is retried once on a new connection, as Go's
   transport retries idempotent requests.
6. With `warm` (a node agent's worker only, never a one-shot process) the connection may have
   been made before the request arrived, and the connection a request ended with may be
   kept for the next one: effects/kube/warm.py says when. Files the client reads
   (kubeconfig, token, CA) are read by effects/inputs.py, which a worker points at its
   caller (agent/caller_files.py: the launcher opens them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from multicall.core.kube import paths
from multicall.core.kube.kubeconfig import KubeConfig
from multicall.core.kube.objects import (
    Namespace,
    Pod,
    Service,
    parse_namespace,
    parse_pod,
    parse_service,
)
from multicall.core.limits import API_JSON_VALUES, API_OBJECT, too_many_json_values
from multicall.effects.caller import OWN_FILES, Files
from multicall.effects.http import Connection, StaleConnection, failure, new_client_context
from multicall.effects.kube.config import DEFAULT_TIMEOUT, endpoint, read_token, tls_context
from multicall.errors import KubeError

if TYPE_CHECKING:
    import ssl

    from multicall.effects.kube.warm import WarmConnections


class KubeClient:
    """GET pods, namespaces and services with a bearer token: one connection, and one
    deadline for everything the client does (rule 1), from its creation on. `warm`: the
    node agent worker's warm connections (rule 6); None in a one-shot process."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        warm: WarmConnections | None = None,
        files: Files = OWN_FILES,
    ) -> None:
        self.config = config
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.endpoint = endpoint(config.server, config.tls_server_name)
        self.warm = warm
        self._token = read_token(config, files)  # `files`: whose filesystem the files are in
        # The CA is read now: a file that cannot be one fails before any connection.
        https = self.endpoint.scheme == "https"
        if not https:
            self._tls: ssl.SSLContext | None = None
        elif warm is None:
            self._tls = tls_context(config, new_client_context, files)
        else:
            self._tls = warm.tls_context(config, files)  # one per trust setting (warm.py rule 4)
        self._conn: Connection | None = None
        if warm is not None:
            warm.remember(config)  # for the worker's `warm_hint`

    def close(self) -> None:
        """Done: the connection closes, or (in an agent worker, rule 6) waits for the next
        request when it is intact and trusted as a warm one would be."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self.warm is not None and self.warm.keep(self.endpoint, self.config, conn):
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
        if not 200 <= status <= 206:  # client-go's success range; a 3xx is not the object
            raise KubeError(status_message(status, body, what))
        return decode_object(body, url)

    def _request(self, path: str, url: str, deadline: float) -> tuple[int, bytes]:
        for attempt in (1, 2):
            conn = self._conn or Connection(self.endpoint)
            self._conn = conn
            try:
                if conn.sock is None and self.warm is not None:  # an agent worker (rule 6)
                    self._adopt_warm(conn, deadline)
                conn.open(deadline, self._tls)
                return conn.get(path, self._headers(), deadline, max_body=API_OBJECT)
            except StaleConnection:
                self._discard()  # closed by the server while idle: once more, on a new one
                if attempt == 2:
                    raise KubeError(f'Get "{url}": EOF') from None
            except (OSError, ValueError) as exc:
                self._discard()
                raise transport_error(exc, "Get", url, conn) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _adopt_warm(self, conn: Connection, deadline: float) -> None:
        assert self.warm is not None
        if (sock := self.warm.adopt(self.endpoint, self.config)) is not None:
            conn.adopt(sock, deadline)

    def _headers(self) -> str:
        lines = [
            f"Host: {self.endpoint.hostport}",
            "Accept: application/json",
            "User-Agent: cnibox/linkerd-cni",
        ]
        if self._token:
            lines.append(f"Authorization: Bearer {self._token}")
        return "".join(f"{line}\r\n" for line in lines)


def transport_error(exc: OSError | ValueError, verb: str, url: str, conn: Connection) -> KubeError:
    """A failed request's error in client-go's words: `Get "URL": dial tcp ...: connection
    refused`, `... TLS handshake timeout`, `... x509: certificate signed by unknown authority`,
    `... (Client.Timeout exceeded while reading body)`. Shared by every request and watch."""
    return KubeError(f'{verb} "{url}": {failure(exc, conn)}')


def decode_object(body: bytes, url: str) -> Mapping[str, object]:
    """An API response body as a JSON object; KubeError naming the URL otherwise."""
    refused = too_many_json_values(body, API_JSON_VALUES)
    if refused:
        raise KubeError(
            f"{url}: the server answered with a body that {refused.removeprefix('it ')}"
        )
    try:
        # UTF-8 only, as Go's encoding/json reads it (invalid bytes become U+FFFD): json.loads
        # of bytes would also take UTF-16 and UTF-32, which no Kubernetes client accepts.
        doc = json.loads(body.decode("utf-8", "replace"))
    except RecursionError:
        raise KubeError(f"{url}: the server answered with JSON nested too deeply") from None
    except ValueError:  # UnicodeDecodeError included
        raise KubeError(f"{url}: the server answered with invalid JSON") from None
    if not isinstance(doc, dict):
        raise KubeError(f"{url}: the server answered with a non-object")
    return doc


MAX_ERROR_TEXT = 2048  # client-go's maxUnstructuredResponseTextBytes


def status_message(status: int, body: bytes, what: tuple[str, str], verb: str = "get") -> str:
    """client-go's error text: the Status object's message, else its generic wording."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
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
        400: f"the server rejected our request for an unknown reason ({verb} {resource} {name})",
        409: f"the server reported a conflict ({verb} {resource} {name})",
    }
    if status in generic:
        return generic[status]
    if status < 500:
        return (
            f"the server responded with the status code {status} but did not return more "
            f"information ({verb} {resource} {name})"
        )
    # client-go cuts the body it quotes to 2048 bytes (maxUnstructuredResponseTextBytes):
    # a 3 MiB error page is not a 3 MiB CNI error message.
    text = body[:MAX_ERROR_TEXT].decode("utf-8", "replace").strip()
    return (
        f'an error on the server ("{text}") has prevented the request from succeeding '
        f"({verb} {resource} {name})"
    )
