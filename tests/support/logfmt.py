"""Reading log lines back: logrus's text format (`key=value`, values bare or Go-quoted)."""

from __future__ import annotations

import ast
import re

_PAIR = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|\S*)')


def parse_line(line: str) -> dict[str, str]:
    """The fields of one logrus text line; Go's %q escapes are Python's too."""
    fields = {}
    for key, value in _PAIR.findall(line):
        fields[key] = ast.literal_eval(value) if value.startswith('"') else value
    return fields


def records(text: str) -> list[dict[str, str]]:
    """Every line of a log, parsed."""
    return [parse_line(line) for line in text.splitlines() if line.strip()]


def errors(text: str) -> list[dict[str, str]]:
    """The error-level records of a log."""
    return [record for record in records(text) if record.get("level") == "error"]
