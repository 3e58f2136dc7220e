"""Kubernetes list/watch as kube-rs's `watcher` does it, as pure state: the request paths, the
newline-delimited JSON of a watch body (chunked or not), and what each answer means.

Rules of this module:
1. Memory is bounded by one event, never by one connection: `BodyLines` keeps at most
   `max_line` bytes of the line being assembled, across any number of chunks, and drops (and
   reports as `None`) a line that grows past it. Chunk framing is checked strictly.
2. `WatchCursor` is kube-rs's watcher state machine (kube-runtime `watcher.rs`, ListWatch
   strategy): paginated LIST (`limit`, `continue`), `Init`/`InitApply`/`InitDone`, then WATCH
   from the list's resourceVersion with bookmarks; a watch that ends cleanly resumes from the
   last resourceVersion seen (bookmarks included); `410 Gone` (an ERROR event, or the HTTP
   status of the watch or list request) starts over with a fresh LIST.
3. Nothing here does I/O or keeps time: the caller owns connections, deadlines and backoff.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlencode

from multicall.core.go.chunked import MAX_LINE, ChunkError, chunk_size
from multicall.core.limits import API_JSON_VALUES, too_many_json_values
from multicall.errors import KubeError

MAX_EVENT_BYTES = 4 * 1024 * 1024  # kube-apiserver refuses objects above ~1.5 MiB (etcd)
DEFAULT_PAGE_SIZE = 500  # kube-rs's (and client-go's pager's) default
DEFAULT_WATCH_TIMEOUT = 290  # kube-rs's timeoutSeconds for a watch (kubernetes#6513)
GONE = 410

Json = Mapping[str, object]


class BodyLines:
    """The lines of an HTTP response body as it arrives; feed() returns each complete line
    (without its newline), or None where a line longer than `max_line` was dropped."""

    def __init__(self, *, chunked: bool, max_line: int = MAX_EVENT_BYTES) -> None:
        self.chunked = chunked
        self.max_line = max_line
        self.done = False  # the terminating chunk (and trailers) were read
        self._line = bytearray()
        self._dropping = False
        # chunked framing state
        self._head = bytearray()  # size line or trailer line being read
        self._left = 0  # payload bytes left in the current chunk
        self._state = "size"  # size | data | crlf | trailer

    def feed(self, data: bytes) -> list[bytes | None]:
        if not self.chunked:
            return self._payload(data)
        out: list[bytes | None] = []
        pos, size = 0, len(data)
        while pos < size and not self.done:
            if self._state == "data":
                take = min(self._left, size - pos)
                out += self._payload(data[pos : pos + take])
                self._left -= take
                pos += take
                if self._left == 0:
                    self._state = "crlf"
                continue
            end = data.find(b"\n", pos)
            stop = size if end < 0 else end + 1
            self._head += data[pos:stop]
            pos = stop
            if len(self._head) >= MAX_LINE:
                raise KubeError("header line too long")
            if end >= 0:
                self._framing_line(bytes(self._head))
                self._head.clear()
        return out

    def finish(self) -> list[bytes | None]:
        """At end of stream: the last line if it had no newline (never for a watch)."""
        if self.chunked and not self.done:
            raise KubeError("unexpected EOF in a chunked response body")
        if self._dropping:
            return [None]
        return [bytes(self._line)] if self._line.strip() else []

    def _framing_line(self, line: bytes) -> None:
        if self._state == "crlf":
            if line != b"\r\n":  # Go reads two bytes and wants CRLF: a bare LF is refused
                raise KubeError("malformed chunked encoding")
            self._state = "size"
        elif self._state == "size":
            try:
                size = chunk_size(line)
            except ChunkError as exc:
                raise KubeError(str(exc)) from None
            if size == 0:
                self._state = "trailer"
            else:
                self._left, self._state = size, "data"
        elif self._state == "trailer" and line.strip() == b"":
            self.done = True

    def _payload(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._extend(data[start:])
                return out
            self._extend(data[start:end])
            out.append(None if self._dropping else bytes(self._line))
            self._line.clear()
            self._dropping = False
            start = end + 1

    def _extend(self, part: bytes) -> None:
        if self._dropping:
            return
        if len(self._line) + len(part) > self.max_line:
            self._line.clear()
            self._dropping = True
            return
        self._line += part


# ----------------------------------------------------------------------------- watch events


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One line of a watch stream."""

    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK | ERROR
    object: Json


def parse_watch_event(line: bytes) -> WatchEvent:
    """One line of a watch body as kube-rs reads it with serde_json: UTF-8 JSON only (no
    UTF-16 or BOM, which `json.loads` of bytes would detect and take; no encoded
    surrogates), no NaN or Infinity, nesting bounded (a RecursionError would have ended the
    controller's watcher thread); KubeError otherwise."""
    refused = too_many_json_values(line, API_JSON_VALUES)
    if refused:
        raise KubeError(f"the watch stream carried an event that {refused.removeprefix('it ')}")
    try:
        doc = json.loads(line.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError, JSONDecodeError, 4,300 digits
        raise KubeError("the watch stream carried a line that is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("object"), dict):
        raise KubeError("the watch stream carried an event without an object")
    kind = doc.get("type")
    if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"):
        raise KubeError(f"the watch stream carried an unknown event type {kind!r}")
    return WatchEvent(str(kind), doc["object"])


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def resource_version(obj: Json) -> str:
    meta = obj.get("metadata")
    value = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


def status_code(status: Json) -> int:
    code = status.get("code")
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def status_text(status: Json) -> str:
    message = status.get("message")
    reason = status.get("reason")
    text = message if isinstance(message, str) and message else "unknown error"
    return f"{text} ({reason})" if isinstance(reason, str) and reason else text


# ----------------------------------------------------------------------------- the cursor


class Kind(Enum):
    INIT = "Init"  # a (re)list starts: what follows until INIT_DONE is the full set
    INIT_APPLY = "InitApply"  # an object of the list
    INIT_DONE = "InitDone"
    APPLY = "Apply"  # added or modified while watching
    DELETE = "Delete"


@dataclass(frozen=True, slots=True)
class Event:
    """What a watch produced for its consumer."""

    kind: Kind
    object: Json | None = None


@dataclass(frozen=True, slots=True)
class Selector:
    """A watch's label and field selectors."""

    labels: str = ""
    fields: str = ""


class Phase(Enum):
    LIST = "list"
    WATCH = "watch"


class WatchCursor:
    """Where the watch stands: what to request next and what an answer means."""

    def __init__(
        self,
        path: str,
        selector: Selector,
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        timeout_seconds: int = DEFAULT_WATCH_TIMEOUT,
        bookmarks: bool = True,
    ) -> None:
        self.path = path
        self.selector = selector
        self.page_size = page_size
        self.timeout_seconds = timeout_seconds
        self.bookmarks = bookmarks
        self.phase = Phase.LIST
        self.continue_token = ""
        self.resource_version = ""

    def request(self) -> str:
        """The path (with query) of the next LIST page or WATCH."""
        query: list[tuple[str, str]] = []
        if self.phase is Phase.WATCH:
            query += [("watch", "true"), ("timeoutSeconds", str(self.timeout_seconds))]
        if self.selector.fields:
            query.append(("fieldSelector", self.selector.fields))
        if self.selector.labels:
            query.append(("labelSelector", self.selector.labels))
        if self.phase is Phase.LIST:
            query.append(("limit", str(self.page_size)))
            if self.continue_token:
                query.append(("continue", self.continue_token))
        else:
            if self.bookmarks:
                query.append(("allowWatchBookmarks", "true"))
            query.append(("resourceVersion", self.resource_version))
        return f"{self.path}?{urlencode(query)}"

    def list_page(self, doc: Json) -> list[Event]:
        """A LIST page: Init first (on page one), its items, InitDone after the last page."""
        events = [] if self.continue_token else [Event(Kind.INIT)]
        meta = doc.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        version = meta.get("resourceVersion")
        token = meta.get("continue")
        version = version if isinstance(version, str) else ""
        token = token if isinstance(token, str) else ""
        if not version and not token:
            self.relist()
            raise KubeError(
                "no metadata.resourceVersion in watch result (does resource support watch?)"
            )
        items = doc.get("items")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, Mapping):
                events.append(Event(Kind.INIT_APPLY, item))
        if token:
            self.continue_token = token
            return events
        self.phase, self.continue_token, self.resource_version = Phase.WATCH, "", version
        events.append(Event(Kind.INIT_DONE))
        return events

    def watch_event(self, event: WatchEvent) -> list[Event]:
        """One event of the watch stream; raises KubeError for an ERROR event (after
        switching to a fresh LIST when it is 410 Gone)."""
        if event.type == "ERROR":
            if status_code(event.object) == GONE:
                self.relist()
            raise KubeError(
                f"error returned by apiserver during watch: {status_text(event.object)}"
            )
        version = resource_version(event.object)
        if not version:
            self.relist()
            raise KubeError(
                "no metadata.resourceVersion in watch result (does resource support watch?)"
            )
        self.resource_version = version
        if event.type == "BOOKMARK":
            return []
        kind = Kind.DELETE if event.type == "DELETED" else Kind.APPLY
        return [Event(kind, event.object)]

    def request_failed(self, status: int) -> None:
        """A LIST or WATCH request answered `status`: 410 (an expired continue token or a
        resourceVersion the server no longer has) starts over; a failed LIST page restarts
        the list, as kube-rs does; a failed WATCH retries from the same resourceVersion."""
        if status == GONE or self.phase is Phase.LIST:
            self.relist()

    def relist(self) -> None:
        self.phase, self.continue_token, self.resource_version = Phase.LIST, "", ""
