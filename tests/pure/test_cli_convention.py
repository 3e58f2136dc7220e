"""Every applet of the applet table against the one command-line convention (docs/cli.md):
`--help`, `--version`, an unknown option, a missing option argument, an argument given to
a flag. New rows of the table are picked up as they land; an applet that keeps another
program's command line must be listed in FOREIGN with the reason, and is checked against
that program's convention instead. Running without arguments: tests/netns/test_cli_bare.py.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest

from multicall import __version__
from multicall.applet import Applet
from multicall.applets import APPLETS
from multicall.core import usage
from multicall.core.usage import version_text
from multicall.dispatch import run_applet

UNKNOWN = "--no-such-option"


@dataclass(frozen=True)
class Foreign:
    """An applet that keeps another program's command line (`parses_help=True`)."""

    why: str
    usage_exit: int  # that program's exit status for a bad command line
    unknown: str  # what its stderr holds for UNKNOWN
    needs_argument: str  # one of its options that takes an argument
    missing: str  # what its stderr holds when that argument is missing


FOREIGN = {
    "netns-exec": Foreign(
        why="a drop-in for util-linux 2.38.1 nsenter, byte for byte (scripts and the "
        "differential test rely on it): getopt's messages, exit 1",
        usage_exit=1,
        unknown=f"netns-exec: unrecognized option '{UNKNOWN}'\n"
        "Try 'netns-exec --help' for more information.\n",
        needs_argument="--target",
        missing="netns-exec: option '--target' requires an argument\n"
        "Try 'netns-exec --help' for more information.\n",
    ),
    "linkerd-cni-repair-controller": Foreign(
        why="upstream's Rust binary (clap): the same flags, LINKERD_CNI_REPAIR_CONTROLLER_* "
        "variables and exit statuses, so upstream's chart and docs apply unchanged",
        usage_exit=2,
        unknown=f"error: unexpected argument '{UNKNOWN}' found",
        needs_argument="--node-name",
        missing="error: a value is required for '--node-name <NODE_NAME>' but none was supplied",
    ),
}


def run(applet: Applet, *args: str) -> tuple[int, str, str]:
    """The applet through the dispatcher's boundary, as `NAME ARGS...` (nothing runs that
    the command line does not reach: every case here stops at the command line)."""
    out, err = io.BytesIO(), io.BytesIO()
    env = {"PATH": "/nonexistent"}
    status = run_applet(applet, [applet.name, *args], env, (io.BytesIO(), out, err))
    return status, out.getvalue().decode(), err.getvalue().decode()


def try_line(name: str) -> str:
    return f"Try '{name} --help' for more information.\n"


def own_convention(applet: Applet) -> bool:
    if applet.parses_help:
        assert applet.name in FOREIGN, (
            f"{applet.name} parses its own command line: follow the convention "
            "(core/usage.py) or list it in FOREIGN and docs/cli.md with the reason"
        )
        return False
    return True


@pytest.fixture(params=APPLETS, ids=lambda applet: applet.name)
def applet(request: pytest.FixtureRequest) -> Applet:
    chosen: Applet = request.param
    return chosen


def test_help(applet: Applet) -> None:
    """-h and --help: the usage text on stdout naming the program, exit 0, nothing else."""
    for flag in ("--help", "-h"):
        status, out, err = run(applet, flag)
        assert (status, err) == (0, "")
        assert out.startswith(f"usage: {applet.name}")


def test_version(applet: Applet) -> None:
    """--version: `NAME from cnibox VERSION` (and the compatibility note), exit 0."""
    status, out, err = run(applet, "--version")
    assert (status, err) == (0, "")
    assert out == version_text(applet.name, __version__, applet.version_note)


def test_unknown_option(applet: Applet) -> None:
    """An unknown option: getopt's words, the Try line, exit 2, nothing on stdout."""
    status, out, err = run(applet, UNKNOWN)
    assert out == ""
    if own_convention(applet):
        assert status == 2
        assert err == f"{applet.name}: unrecognized option '{UNKNOWN}'\n{try_line(applet.name)}"
    else:
        foreign = FOREIGN[applet.name]
        assert status == foreign.usage_exit
        assert foreign.unknown in err


def test_missing_option_argument(applet: Applet) -> None:
    """The first option that takes an argument, given without one: getopt's words, exit 2
    (an applet whose options take none has nothing to miss: see the flag case below)."""
    if not own_convention(applet):
        foreign = FOREIGN[applet.name]
        status, out, err = run(applet, foreign.needs_argument)
        assert (status, out) == (foreign.usage_exit, "")
        assert foreign.missing in err
        return
    declared = usage.options(applet.load().__doc__ or "")
    with_argument = [option for option in declared if option.metavar]
    if not with_argument:
        return  # e.g. linkerd-cni (a runtime passes no arguments): nothing to miss
    name = with_argument[0].key
    status, out, err = run(applet, name)
    assert (status, out) == (2, "")
    assert err == f"{applet.name}: option '{name}' requires an argument\n{try_line(applet.name)}"


def test_argument_to_a_flag(applet: Applet) -> None:
    """`--version=x`: getopt's "doesn't allow an argument", exit 2 (every applet has
    --version, so this reaches every applet of the convention)."""
    if not own_convention(applet):
        return
    status, out, err = run(applet, "--version=x")
    assert (status, out) == (2, "")
    assert err == (
        f"{applet.name}: option '--version' doesn't allow an argument\n{try_line(applet.name)}"
    )


def test_options_in_the_usage_text_are_the_parser_s() -> None:
    """The usage text is the one declaration: each applet's help lists what it parses, and
    nothing is declared twice with different argument needs (usage.options would raise)."""
    for applet in APPLETS:
        if applet.parses_help:
            continue
        doc = applet.load().__doc__ or ""
        for option in usage.options(doc):
            assert all(name in doc for name in option.names), (applet.name, option)
