"""usage: cnibox [--list | --install [-s] DIR | --help | --version | APPLET [ARGS...]]

cnibox is a multi-call binary: it runs the applet named by the name it was invoked as
(a symlink or hard link named `linkerd-cni`, `netns-exec`, `nsenter`, ...), or by its first
argument when invoked as `cnibox`. Without arguments it prints this text.

  --list            print every applet name, one per line
  --install [-s] DIR
                    create a link named after every applet in DIR (hard links, or
                    symbolic links with -s); existing names are left alone
  --help            this text, or `cnibox APPLET --help` for an applet's own
  --version         print the version

Rules of this module: it is the only exit-code boundary for plain applets (the CNI applet
prints CNI error JSON itself); nothing raised by an applet reaches the user as a traceback;
it is the one place that prints an applet's help and version and reports a bad command line
(`run_applet`, with core/usage.py: docs/cli.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import BinaryIO, NoReturn

from multicall import __version__
from multicall.applet import Applet
from multicall.applets import APPLETS, all_names, find_applet
from multicall.core import usage
from multicall.core.usage import Show, help_text, try_help, version_text
from multicall.effects.streams import write_text
from multicall.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CniboxError,
    UsageError,
)

MULTIPLEXER_NAMES = frozenset({"cnibox", "cnibox.bin", "multicall", "__main__.py"})


def invocation_name() -> str:
    """argv[0] as the caller spelled it.

    Nuitka replaces sys.argv[0] with the resolved binary path; the name the binary was
    invoked by survives only in `__compiled__.original_argv0`.
    """
    compiled = globals().get("__compiled__")
    original = getattr(compiled, "original_argv0", None)
    if isinstance(original, str) and original:
        return original
    return sys.argv[0] if sys.argv else "cnibox"


def applet_name(argv0: str) -> str:
    """The applet an argv[0] names: basename, one leading '-' stripped (login-shell style)."""
    name = os.path.basename(argv0)
    if name.startswith("-"):
        name = name[1:]
    return name.removesuffix(".pyz")


def is_multiplexer(name: str) -> bool:
    return name in MULTIPLEXER_NAMES


def format_list() -> str:
    return "".join(f"{name}\n" for name in all_names())


def format_help() -> str:
    assert __doc__ is not None
    lines = __doc__.split("\n\nRules of this module")[0].rstrip()
    width = max(18, *(len(applet.name) + 2 for applet in APPLETS))
    table = "\n".join(f"  {applet.name:<{width}}{applet.summary}" for applet in APPLETS)
    return f"{lines}\n\nApplets:\n{table}\n"


def suggest(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, all_names(), n=1)
    return f"did you mean '{close[0]}'?\n" if close else ""


def run_applet(
    applet: Applet,
    argv: Sequence[str],
    env: Mapping[str, str],
    streams: tuple[BinaryIO, BinaryIO, BinaryIO],
) -> int:
    """Run one applet and map whatever it raises to an exit code (the one boundary); print
    its help or version when its command line asks for them, and report a bad command line
    in getopt's words (the one place: core/usage.py)."""
    stdin, stdout, stderr = streams
    prog = applet_name(argv[0]) if argv else applet.name
    try:
        module = applet.load()
        show = None if applet.parses_help else _requested(module, argv[1:])
        outcome = show or module.main(argv, env, stdin, stdout, stderr)
        if isinstance(outcome, Show):
            return _show(outcome, applet, module.__doc__ or "", argv, stdout)
        return outcome
    except KeyboardInterrupt:
        # An uncaught KeyboardInterrupt segfaults Nuitka binaries at exit.
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except CniboxError as exc:
        return _report(exc, applet, prog, stderr)
    except Exception as exc:  # the boundary: a bug must not print a traceback
        if env.get("CNIBOX_DEBUG"):
            raise
        write_text(stderr, f"{prog}: internal error: {type(exc).__name__}: {exc}\n")
        return EXIT_INTERNAL


def _report(exc: CniboxError, applet: Applet, prog: str, stderr: BinaryIO) -> int:
    """An expected failure: one line (and its hint); a usage error of an applet of the
    convention gets the Try line and exit 2 instead, and one of an applet with another
    program's convention is printed as that convention words it, whole (clap's
    `error: ...` and `For more information, try '--help'.`)."""
    if isinstance(exc, UsageError) and applet.parses_help:
        write_text(stderr, f"{exc.message}\n")
        return exc.exit_code
    write_text(stderr, f"{prog}: {exc.message}\n")
    if isinstance(exc, UsageError):
        write_text(stderr, try_help(prog))
        return EXIT_USAGE
    if exc.hint:
        write_text(stderr, f"{prog}: hint: {exc.hint}\n")
    return exc.exit_code


def _requested(module: object, args: Sequence[str]) -> Show | None:
    """`--help`/`--version` as getopt meets them; a bad option raises UsageError before the
    applet runs. Operands are the applet's to judge."""
    if not args:
        return None  # the common case (a runtime runs linkerd-cni so): nothing to parse
    doc = getattr(module, "__doc__", None)
    if not doc:
        return usage.requested(args)
    return usage.parse(args, usage.options(doc), operands=True).show


def _show(what: Show, applet: Applet, doc: str, argv: Sequence[str], stdout: BinaryIO) -> int:
    """Help or version on stdout, naming the program as it was invoked (as util-linux does)."""
    prog = argv[0].rsplit("/", 1)[-1] if argv else applet.name
    if what is Show.HELP:
        write_text(stdout, help_text(doc, prog))
    else:
        write_text(stdout, version_text(prog, __version__, applet.version_note))
    return EXIT_OK


def _silence_stdout() -> None:
    # Later flushes of a closed pipe would raise again at interpreter exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def run_multiplexer(
    args: Sequence[str],
    env: Mapping[str, str],
    streams: tuple[BinaryIO, BinaryIO, BinaryIO],
) -> int:
    """`cnibox ...`: its own options, or `cnibox APPLET ARGS...`. Without arguments, the
    usage on stdout and exit 0, as BusyBox does."""
    _, stdout, stderr = streams
    if not args:
        write_text(stdout, format_help())
        return EXIT_OK
    first = args[0]
    if first.startswith("-"):
        try:
            return _option(args, stdout, stderr)
        except UsageError as exc:
            write_text(stderr, f"cnibox: {exc.message}\n{try_help('cnibox')}")
            return EXIT_USAGE
    applet = find_applet(applet_name(first))
    if applet is None:
        write_text(stderr, f"{first}: applet not found\n{suggest(first)}")
        return EXIT_NOT_FOUND
    return run_applet(applet, list(args), env, streams)


MULTIPLEXER_OPTIONS = (
    usage.HELP,
    usage.VERSION,
    usage.Option(("--list",)),
    usage.Option(("--install",), "DIR"),
    usage.Option(("-s",)),
)


def _option(args: Sequence[str], stdout: BinaryIO, stderr: BinaryIO) -> int:
    """The multiplexer's own options (UsageError for a bad command line)."""
    if list(args[:2]) == ["--install", "-s"]:  # the documented order: -s is no DIR
        args = ["-s", "--install", *args[2:]]
    line = usage.parse(args, MULTIPLEXER_OPTIONS)
    if line.show is Show.HELP:
        write_text(stdout, format_help())
    elif line.show is Show.VERSION:
        write_text(stdout, f"cnibox {__version__}\n")
    elif line.has("--list") and line.has("--install"):
        raise UsageError("--list and --install exclude each other")
    elif line.has("--install"):
        return _install(line.value("--install") or "", line.has("-s"), stdout, stderr)
    elif line.has("-s"):
        raise UsageError("-s goes with --install DIR")
    else:
        write_text(stdout, format_list())
    return EXIT_OK


def _install(directory: str, symbolic: bool, stdout: BinaryIO, stderr: BinaryIO) -> int:
    from multicall.effects.links import install_links

    try:
        report = install_links(directory, all_names(), symbolic=symbolic)
    except CniboxError as exc:
        write_text(stderr, f"cnibox: {exc.message}\n")
        return exc.exit_code
    write_text(stdout, report)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the binary, the console script and `python -m multicall`."""
    args = list(sys.argv[1:] if argv is None else argv)
    argv0 = invocation_name()
    env = os.environ
    streams = standard_streams()
    try:
        name = applet_name(argv0)
        if is_multiplexer(name):
            return run_multiplexer(args, env, streams)
        applet = find_applet(name)
        if applet is None:
            write_text(streams[2], f"{name}: applet not found\n")
            return EXIT_NOT_FOUND
        return run_applet(applet, [argv0, *args], env, streams)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def standard_streams() -> tuple[BinaryIO, BinaryIO, BinaryIO]:
    """stdin, stdout and stderr as binary streams. One the caller closed (`<&-`) is opened
    on /dev/null first: Python leaves it None, and a later open(2) (a netns, a file) would
    otherwise take its number and be read or written as that stream by children."""
    streams: list[BinaryIO] = []
    for fd, stream in enumerate((sys.stdin, sys.stdout, sys.stderr)):
        if stream is not None:
            streams.append(stream.buffer)
            continue
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:  # pragma: no cover - open(2) takes the lowest free number
                os.dup2(null, fd)
                os.close(null)
        streams.append(os.fdopen(fd, "rb" if fd == 0 else "wb", closefd=False))
    return streams[0], streams[1], streams[2]


def exit_now(code: int) -> NoReturn:
    """End the process without interpreter teardown, after flushing the standard streams.

    Teardown (module and GC cleanup) costs a `linkerd-cni` ADD 15-30 ms (docs/benchmarks.md).
    Nothing in cnibox relies on it: no atexit hooks, finalizers or threads, and applets flush
    or close what they write. For the entry points only, never in-process.
    """
    import contextlib

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: the status tells
            if stream is not None:  # None: the caller closed it (standard_streams)
                stream.flush()
    os._exit(code)
