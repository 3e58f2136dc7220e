"""The dispatcher: BusyBox conventions, the registry and the README agree."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import pytest

from multicall import __version__, applets, dispatch
from multicall.applet import Applet, AppletModule
from multicall.core.usage import Show
from multicall.errors import CniboxError, UsageError
from tests.support import REPO, cnibox_argv

APPLET_DIR = REPO / "multicall" / "applets"


def streams() -> tuple[io.BytesIO, io.BytesIO, io.BytesIO]:
    return io.BytesIO(), io.BytesIO(), io.BytesIO()


class TestNames:
    def test_basename_is_the_applet(self) -> None:
        """A path's basename names the applet."""
        assert dispatch.applet_name("/opt/cni/bin/linkerd-cni") == "linkerd-cni"

    def test_one_leading_dash_is_stripped(self) -> None:
        """Login-shell style `-name` runs `name`; only one dash goes."""
        assert dispatch.applet_name("-netns-exec") == "netns-exec"
        assert dispatch.applet_name("--x") == "-x"

    def test_multiplexer_names(self) -> None:
        """The binary's own names and `python -m` run the multiplexer."""
        for argv0 in ("/usr/local/bin/cnibox", "/x/multicall/__main__.py", "cnibox.pyz"):
            assert dispatch.is_multiplexer(dispatch.applet_name(argv0))


class TestRegistry:
    def test_readme_lists_every_applet(self) -> None:
        """The README's applet table names exactly the registered applets."""
        readme = (REPO / "README.md").read_text()
        table = re.findall(r"^\| `([a-z0-9-]+)` \|", readme, re.MULTILINE)
        assert sorted(table) == sorted(applet.name for applet in applets.APPLETS)


class TestMultiplexer:
    def test_list(self) -> None:
        """--list prints one applet name per line, only existing applets."""
        i, o, e = streams()
        assert dispatch.run_multiplexer(["--list"], {}, (i, o, e)) == 0
        assert o.getvalue().decode().splitlines() == applets.all_names()

    def test_unknown_applet(self) -> None:
        """An unknown applet name is `NAME: applet not found`, exit 127."""
        i, o, e = streams()
        assert dispatch.run_multiplexer(["frobnicate"], {}, (i, o, e)) == 127
        assert e.getvalue().decode().splitlines()[0] == "frobnicate: applet not found"

    def test_version_and_help(self) -> None:
        """--version and --help print to stdout and exit 0."""
        i, o, e = streams()
        assert dispatch.run_multiplexer(["--version"], {}, (i, o, e)) == 0
        assert o.getvalue().startswith(b"cnibox ")
        i, o, e = streams()
        assert dispatch.run_multiplexer(["--help"], {}, (i, o, e)) == 0
        assert b"--install" in o.getvalue()

    def test_no_arguments_is_help(self) -> None:
        """Bare `cnibox` prints its usage to stdout and exits 0, as BusyBox does."""
        i, o, e = streams()
        assert dispatch.run_multiplexer([], {}, (i, o, e)) == 0
        assert o.getvalue().startswith(b"usage: cnibox")
        assert e.getvalue() == b""

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--list", "extra"], "extra operand 'extra'"),
            (["--frob"], "unrecognized option '--frob'"),
            (["--install"], "option '--install' requires an argument"),
            (["--install", "-s"], "option '--install' requires an argument"),
            (["--install", "/a", "/b"], "extra operand '/b'"),
            (["--list", "--install", "/a"], "--list and --install exclude each other"),
            (["-s"], "-s goes with --install DIR"),
        ],
    )
    def test_usage_errors(self, args: list[str], message: str) -> None:
        """The multiplexer's own options follow the applets' convention: exit 2, one line,
        then the Try line."""
        i, o, e = streams()
        assert dispatch.run_multiplexer(args, {}, (i, o, e)) == 2
        assert e.getvalue().decode() == (
            f"cnibox: {message}\nTry 'cnibox --help' for more information.\n"
        )
        assert o.getvalue() == b""


class _Module:
    """An applet module stand-in: usage docstring, and a main that does what it is told."""

    __name__ = "boom"

    def __init__(self, outcome: BaseException | int | Show) -> None:
        self.__doc__ = "usage: boom [-x]\n\nBoom.\n\n  -x   explode\n"
        self.outcome = outcome

    def main(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        stdin: BinaryIO,
        stdout: BinaryIO,
        stderr: BinaryIO,
    ) -> int | Show:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def _applet(outcome: BaseException | int | Show, **kw: object) -> Applet:
    module: AppletModule = _Module(outcome)
    return Applet("boom", (), "", lambda: module, **kw)  # type: ignore[arg-type]  # kw: flags


def _failing(exc: BaseException) -> Applet:
    return _applet(exc)


class TestBoundary:
    @pytest.mark.parametrize(
        ("exc", "code", "message"),
        [
            (CniboxError("bad thing"), 1, "boom: bad thing"),
            (KeyboardInterrupt(), 130, ""),
            (ValueError("oops"), 70, "boom: internal error: ValueError: oops"),
        ],
    )
    def test_exceptions_map_to_exit_codes(
        self, exc: BaseException, code: int, message: str
    ) -> None:
        """Errors become one stderr line and an exit code; never a traceback."""
        i, o, e = streams()
        assert dispatch.run_applet(_failing(exc), ["boom"], {}, (i, o, e)) == code
        assert e.getvalue().decode().strip() == message


class TestUsageErrors:
    def test_convention_adds_the_try_line(self) -> None:
        """A UsageError of an applet of the convention: `NAME: message`, the Try line, 2."""
        i, o, e = streams()
        assert dispatch.run_applet(_failing(UsageError("bad")), ["boom"], {}, (i, o, e)) == 2
        assert e.getvalue() == b"boom: bad\nTry 'boom --help' for more information.\n"

    def test_foreign_convention_is_printed_whole(self) -> None:
        """An applet with another program's convention (clap) words its errors whole."""
        i, o, e = streams()
        clap = "error: unexpected argument '-x' found\n\nFor more information, try '--help'."
        applet = _applet(UsageError(clap), parses_help=True)
        assert dispatch.run_applet(applet, ["boom", "-x"], {}, (i, o, e)) == 2
        assert e.getvalue().decode() == clap + "\n"


class TestCommandLine:
    def test_python_m_lists(self) -> None:
        """`python -m multicall --list` works like the binary."""
        out = subprocess.run([*cnibox_argv(), "--list"], capture_output=True, text=True, check=True)
        assert "netns-exec" in out.stdout.split()

    def test_unknown_exits_127(self) -> None:
        """An unknown applet through the real entry point exits 127."""
        proc = subprocess.run([*cnibox_argv(), "nope"], capture_output=True, text=True, check=False)
        assert proc.returncode == 127
        assert proc.stderr.startswith("nope: applet not found")

    def test_install_symlinks_work(self, tmp_path: Path) -> None:
        """--install -s DIR makes symlinks that dispatch by their name."""
        exe = Path(sys.executable).parent / "cnibox"
        if os.environ.get("CNIBOX"):
            exe = Path(os.environ["CNIBOX"])
        if not exe.exists():
            pytest.skip("the cnibox console script is not installed in this environment")
        proc = subprocess.run(
            [str(exe), "--install", "-s", str(tmp_path)], capture_output=True, text=True, check=True
        )
        assert "netns-exec" in proc.stdout
        link = tmp_path / "netns-exec"
        assert link.is_symlink()
        again = subprocess.run(
            [str(exe), "--install", "-s", str(tmp_path)], capture_output=True, text=True, check=True
        )
        assert "exists, skipped" in again.stdout
        help_run = subprocess.run(
            [str(link), "--help"], capture_output=True, text=True, check=False
        )
        assert "usage: netns-exec" in help_run.stdout + help_run.stderr


class TestHelpAndVersion:
    """One place prints every applet's help and version (dispatch.run_applet)."""

    @pytest.mark.parametrize(
        ("args", "out"),
        [
            (["--help"], "usage: boom [-x]\n\nBoom.\n\n  -x   explode\n"),
            (["-x", "-h"], "usage: boom [-x]\n\nBoom.\n\n  -x   explode\n"),
            (["--version"], f"boom from cnibox {__version__}\n"),
        ],
    )
    def test_common_rule(self, args: list[str], out: str) -> None:
        """-h/--help/--version anywhere before `--`: printed on stdout, exit 0, main not run."""
        i, o, e = streams()
        applet = _applet(RuntimeError("main must not run"))
        assert dispatch.run_applet(applet, ["/bin/boom", *args], {}, (i, o, e)) == 0
        assert (o.getvalue().decode(), e.getvalue()) == (out, b"")

    def test_after_double_dash_is_an_argument(self) -> None:
        i, o, e = streams()
        assert dispatch.run_applet(_applet(7), ["boom", "--", "--help"], {}, (i, o, e)) == 7

    def test_help_names_the_program_as_invoked(self) -> None:
        i, o, e = streams()
        assert dispatch.run_applet(_applet(0), ["/x/kaboom", "-h"], {}, (i, o, e)) == 0
        assert o.getvalue().startswith(b"usage: kaboom [-x]")

    def test_own_parser_returns_show(self) -> None:
        """An applet with its own grammar (parses_help) returns Show; the text is the same."""
        i, o, e = streams()
        applet = _applet(
            Show.VERSION, parses_help=True, version_note="util-linux 2.38.1 compatible"
        )
        assert dispatch.run_applet(applet, ["boom", "--anything"], {}, (i, o, e)) == 0
        assert o.getvalue().decode() == (
            f"boom from cnibox {__version__} (util-linux 2.38.1 compatible)\n"
        )
        i, o, e = streams()
        assert dispatch.run_applet(_applet(3, parses_help=True), ["boom", "-h"], {}, (i, o, e)) == 3
