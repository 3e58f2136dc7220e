"""The repair controller's logger: upstream's tracing-subscriber lines (core/tracing_log.py)
written to its stdout, as the Rust controller logs.

It is an object called with a level, a target and fields, not the plugin's `(str) -> None`
log sink (core/logs.MessageLog): the controller hands the in-place repair a sink bound to one
level and target (applets/linkerd_cni_repair_controller.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import BinaryIO

from multicall.core.tracing_log import LogFilter, format_line
from multicall.effects.streams import write_text


class TracingLogger:
    """tracing-subscriber's output on stdout, one line per call (level, target, message,
    fields), from any thread; lines the filter disables are not formatted."""

    def __init__(self, stream: BinaryIO, filt: LogFilter, fmt: str) -> None:
        self.stream = stream
        self.filter = filt
        self.fmt = fmt
        self._lock = threading.Lock()

    def __call__(self, level: int, target: str, message: str, **fields: object) -> None:
        if not self.filter.enabled(target, level):
            return
        line = format_line(
            self.fmt,
            time.time_ns(),
            level,
            target,
            message,
            fields=[(k, str(v)) for k, v in fields.items()],
        )
        # a closed stdout must not stop the controller
        with self._lock, contextlib.suppress(OSError, ValueError):
            write_text(self.stream, line)
