"""usage: netns-exec [OPTIONS] [PROGRAM [ARGS...]]

Run a program with namespaces of other processes (util-linux nsenter compatible).
Also answers to the name `nsenter`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import BinaryIO

from multicall.applet import AppletSpec
from multicall.errors import CniboxError


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int:
    raise CniboxError("not implemented yet")


SPEC = AppletSpec(
    name="netns-exec",
    summary="run a program in other namespaces (nsenter drop-in)",
    help=__doc__ or "",
    main=main,
    aliases=("nsenter",),
    needs_root="setns(2) needs CAP_SYS_ADMIN in the target namespace's user namespace",
)
