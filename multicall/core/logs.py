"""Log lines as Linkerd's Go components write them (logrus), and what may go into them.

Every cnibox daemon and the plugin log in one format so one log query reads them all:
`plain` is logrus's TextFormatter as it writes to a non-terminal
(`time="2025-01-02T03:04:05Z" level=info msg="..." Key=value`), `json` is logrus's
JSONFormatter (`{"Key":"value","level":"info","msg":"...","time":"..."}`), the two
`--log-format` values of Linkerd's Go controllers (linkerd2 pkg/flags).

Rules of this module:
1. Pure: the caller passes the time; the stream or file it goes to is effects/log.py's.
2. A field value is bare when logrus leaves it bare (ASCII letters, digits and `-._/@^+`,
   or empty), else Go-quoted (`%q`); JSON is Go's encoding/json, HTML-safe, keys sorted.
3. Secrets never reach a log line: `redact` replaces the values of keys that name tokens,
   passwords, keys or kubeconfig contents before a document is logged.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping

from multicall.errors import UsageError

# Where code that reports progress writes a line: one message, its level chosen by the
# receiver (the firewall engine, the xtables locks, the plugin's ports: the plugin's logger
# at info, a repair's tracing logger, a test's list.append).
MessageLog = Callable[[str], None]


def quiet(_message: str) -> None:
    """The `MessageLog` that drops every message."""


# logrus's levels, most severe first; `warn` is accepted for `warning` (logrus.ParseLevel).
LEVELS = ("panic", "fatal", "error", "warning", "info", "debug", "trace")
FORMATS = ("plain", "json")
MAX_MESSAGE = 16 * 1024  # a longer message is cut: one line stays readable and bounded
_BARE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._/@^+")
_OWN_KEYS = frozenset({"time", "level", "msg"})
REDACTED = "[redacted]"
# Keys whose values are secrets wherever they appear in a logged document: bearer tokens,
# passwords, private keys, and kubeconfig/certificate contents (a path is not a secret).
_SECRET_KEY = re.compile(
    r"token|passw|secret|credential|private|client-key|key-data|certificate-authority-data"
    r"|client-certificate-data|authorization",
    re.IGNORECASE,
)


def parse_level(text: str) -> str:
    """logrus.ParseLevel: a level name, case-insensitive (`warn` is `warning`); ValueError
    with logrus's message otherwise."""
    level = text.lower()
    level = "warning" if level == "warn" else level
    if level not in LEVELS:
        raise ValueError(f'not a valid logrus Level: "{text}"')
    return level


def parse_log_options(level: str, log_format: str) -> tuple[str, str]:
    """An applet's `--log-level` and `--log-format` values, checked: the level as
    `parse_level` names it, the format as given; UsageError (exit 2) naming the option."""
    try:
        parsed = parse_level(level)
    except ValueError:
        raise UsageError(f"invalid --log-level '{level}': debug, info, warn or error") from None
    if log_format not in FORMATS:
        raise UsageError(f"invalid --log-format '{log_format}': plain or json")
    return parsed, log_format


def enabled(level: str, threshold: str) -> bool:
    """Whether a line at `level` passes a logger set to `threshold`."""
    return LEVELS.index(level) <= LEVELS.index(threshold)


def timestamp(seconds: float) -> str:
    """RFC 3339 in UTC, seconds precision (logrus's default time format on a UTC node)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def format_line(
    fmt: str, stamp: str, level: str, message: str, fields: Mapping[str, str] | None = None
) -> str:
    """One log line, newline included, in `plain` (logrus text) or `json`."""
    fields = fields or {}
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + f"... ({len(message) - MAX_MESSAGE} more characters)"
    if fmt == "json":
        from multicall.core.go.encoding_json.encode import marshal

        # logrus renames fields that clash with its own keys to fields.KEY
        body = {(f"fields.{k}" if k in _OWN_KEYS else k): v for k, v in fields.items()}
        body |= {"level": level, "msg": message, "time": stamp}
        return marshal(body, sort_keys=True) + "\n"
    extra = "".join(f" {key}={logfmt(value)}" for key, value in sorted(fields.items()))
    return f"time={logfmt(stamp)} level={level} msg={logfmt(message)}{extra}\n"


def logfmt(value: str) -> str:
    """A value as logrus's TextFormatter writes it: bare, or strconv.Quote'd."""
    if all(c in _BARE for c in value):
        return value
    from multicall.core.go.strconv import go_quote

    return go_quote(value)


def redact(document: object) -> object:
    """A copy of a JSON document with every secret-looking key's value replaced, and a
    kubeconfig given inline (not as a path) hidden."""
    if isinstance(document, dict):
        out: dict[str, object] = {}
        for key, value in document.items():
            secret = isinstance(key, str) and _SECRET_KEY.search(key) is not None
            inline_kubeconfig = key == "kubeconfig" and isinstance(value, str) and "\n" in value
            out[key] = REDACTED if secret or inline_kubeconfig else redact(value)
        return out
    if isinstance(document, list):
        return [redact(item) for item in document]
    return document


def loggable_json(data: bytes) -> str:
    """A JSON document's bytes as one compact, redacted line; the bytes' length alone when
    they are not JSON (they may hold anything)."""
    import json

    try:
        document = json.loads(data)
    except ValueError:
        return f"({len(data)} bytes, not JSON)"
    return json.dumps(redact(document), separators=(",", ":"), ensure_ascii=False)


# A log file must not be picked up as a CNI config by the runtime (libcni loads these from
# the conf dir) nor overwrite one.
_CONFIG_SUFFIXES = (".conf", ".conflist", ".json")


def log_file_problem(path: str) -> str | None:
    """Why `path` cannot be a log file, or None: it must be absolute and normalized (no
    `.`/`..`, no `//`, no trailing `/`), printable, and not named like a CNI config."""
    if not path.startswith("/"):
        return "not an absolute path"
    if any(not c.isprintable() for c in path):
        return "contains control characters"
    parts = path.split("/")[1:]
    if any(part in ("", ".", "..") for part in parts):
        return "not a normalized path (empty, '.' or '..' components)"
    if path.endswith(_CONFIG_SUFFIXES):
        return "named like a CNI config (.conf, .conflist, .json): the runtime would load it"
    return None
