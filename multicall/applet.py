"""What an applet is: its spec (name, help, install policy) and its entry point's shape.

An applet module starts with its usage text as the docstring (first line `usage: NAME ...`),
defines `SPEC = AppletSpec(...)` and a `main(argv, env, stdin, stdout, stderr) -> int`.
Streams are binary so the CNI applet controls every byte it prints. Applet modules import
heavy libraries (pyroute2, iptc, ssl) inside functions, never at module level: the dispatcher
imports every applet module on every start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

AppletMain = Callable[[Sequence[str], Mapping[str, str], BinaryIO, BinaryIO, BinaryIO], int]


@dataclass(frozen=True, slots=True)
class AppletSpec:
    """Registration data for one applet (BusyBox's `//applet:` line, toybox's NEWTOY)."""

    name: str
    summary: str
    help: str
    main: AppletMain
    aliases: tuple[str, ...] = ()
    install_dir: str = "/usr/local/bin"
    # Why root is needed, or "" when it is not (BusyBox requires SUID policies be justified).
    needs_root: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def usage(self) -> str:
        return self.help.strip().splitlines()[0]
