"""What a command line may ask for besides running (`Show`), and the texts that answer it.

cnibox's own applets follow one rule, `requested`: `-h`/`--help` or `--version` anywhere
before `--`. netns-exec, an nsenter drop-in, finds them with util-linux's getopt instead
(core/netns_exec.py) and reports the same `Show`. Either way the dispatcher prints the text
built here, on stdout, and exits 0 (multicall/dispatch.py `run_applet`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum


class Show(Enum):
    HELP = "help"
    VERSION = "version"


def requested(args: Sequence[str]) -> Show | None:
    """The first `-h`/`--help`/`--version` before `--`, if any."""
    for arg in args:
        if arg == "--":
            return None
        if arg in ("-h", "--help"):
            return Show.HELP
        if arg == "--version":
            return Show.VERSION
    return None


def help_text(doc: str, prog: str) -> str:
    """An applet's usage docstring, its `usage: NAME` naming the program as it was invoked."""
    name = doc.split(None, 2)[1]
    return doc.replace(f"usage: {name}", f"usage: {prog}", 1)


def version_text(prog: str, version: str, note: str = "") -> str:
    """`PROG from cnibox VERSION`, with the applet's compatibility note in parentheses."""
    return f"{prog} from cnibox {version}{f' ({note})' if note else ''}\n"
