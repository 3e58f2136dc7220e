"""What an applet is: a row of the applet table (`Applet`) and the shape of its module.

An applet module starts with its usage text as the docstring (first line `usage: NAME ...`,
then option lines `  -x, --name ARG   what it does`, which are also what the parser accepts:
docs/cli.md) and defines `main(argv, env, stdin, stdout, stderr)`, which returns the exit
status, or a `Show` for the dispatcher to print help or the version (multicall/core/usage.py).
Streams are binary so the CNI applet controls every byte it prints. Applet modules import heavy
libraries (iptc, ssl, yaml) inside functions, not at module level: the module is imported
on every start of its applet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:
    from multicall.core.usage import Show


class AppletModule(Protocol):
    """An applet's module: its `__doc__` is the usage text."""

    __name__: str

    def main(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdin: BinaryIO,
        stdout: BinaryIO,
        stderr: BinaryIO,
    ) -> int | Show: ...


@dataclass(frozen=True, slots=True)
class Applet:
    """One row of the applet table (BusyBox's applet table, pip's commands_dict)."""

    name: str
    aliases: tuple[str, ...]
    summary: str  # one line, for `cnibox --help`
    # The module, as a function with a static import (Nuitka follows it): called only when
    # the applet runs, so a start imports no other applet.
    load: Callable[[], AppletModule]
    # True: the applet keeps another program's command line (netns-exec: util-linux's
    # nsenter; docs/cli.md "Exceptions") and finds help/version requests itself; False: the
    # dispatcher parses it by the convention (core/usage.py) before `main` runs.
    parses_help: bool = False
    version_note: str = ""  # shown after `--version`'s text, in parentheses

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)
