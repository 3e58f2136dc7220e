"""The plugin's log lines on stderr, in logrus's text format as upstream prints them."""

from __future__ import annotations

import time
from typing import BinaryIO

from multicall.effects.streams import write_text

LEVELS = {"debug": 0, "info": 1, "warning": 2, "error": 3}
_BARE = frozenset("-._/@^+")


class Logger:
    """logrus's text format on stderr; the level follows `log_level` once the config is read."""

    def __init__(self, stream: BinaryIO, level: str = "info") -> None:
        self.stream = stream
        self.level = level
        self.fields: dict[str, str] = {}

    def set_level(self, level: str) -> None:
        self.level = "warning" if level == "warn" else level

    def log(self, level: str, message: str) -> None:
        if LEVELS[level] < LEVELS[self.level]:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        extra = "".join(f" {k}={_logfmt(v)}" for k, v in sorted(self.fields.items()))
        write_text(
            self.stream, f"time={_logfmt(stamp)} level={level} msg={_logfmt(message)}{extra}\n"
        )

    def debug(self, message: str) -> None:
        self.log("debug", message)

    def info(self, message: str) -> None:
        self.log("info", message)

    def error(self, message: str) -> None:
        self.log("error", message)


def _logfmt(value: str) -> str:
    """A field value: bare when logrus leaves it bare, else %q-quoted (strconv.Quote)."""
    if value and all(c.isalnum() or c in _BARE for c in value):
        return value
    from multicall.core.go.strconv import go_quote

    return go_quote(value)
