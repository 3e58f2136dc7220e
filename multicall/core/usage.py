"""cnibox's one command-line convention: the options an applet's usage text declares, parsed
as GNU getopt_long does, with its messages, and the help and version texts.

The convention (docs/cli.md), for every applet whose row does not set `parses_help`:
- the options are the usage docstring's option lines (two spaces, then `-x, --name ARG`):
  the text a user reads is the one declaration, so help and parser cannot disagree;
- `-h`/`--help` and `--version` always exist; `--name=value` and `--name value`, unambiguous
  prefixes (`--conf` for `--config`), short clusters (`-vs`);
- a bad command line is a `UsageError` with getopt's words (`unrecognized option '--foo'`,
  `option '--bar' requires an argument`), which the dispatcher prints as `PROG: message`
  and `Try 'PROG --help' for more information.`, exit status 2.
netns-exec (util-linux's getopt order) and the repair controller (upstream's clap) parse
their own command lines and report help and version as the same `Show`. Either way the
dispatcher prints the texts built here, on stdout, and exits 0 (dispatch.run_applet).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from multicall.errors import UsageError


class Show(Enum):
    HELP = "help"
    VERSION = "version"


def requested(args: Sequence[str]) -> Show | None:
    """The first `-h`/`--help`/`--version` before `--`, if any (for a module without a
    usage docstring; every applet module has one)."""
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


def try_help(prog: str) -> str:
    """The line that follows a usage error (getopt's programs, coreutils, util-linux)."""
    return f"Try '{prog} --help' for more information.\n"


@dataclass(frozen=True, slots=True)
class Option:
    """One option of a usage text: its spellings (`-v`, `--verbose`) and argument name."""

    names: tuple[str, ...]
    metavar: str = ""  # "" for a flag

    @property
    def key(self) -> str:
        """How applets name it: the first long spelling (`--verbose`), else the short one."""
        return next((n for n in self.names if n.startswith("--")), self.names[0])


HELP = Option(("-h", "--help"))
VERSION = Option(("--version",))
_OPTION_LINE = re.compile(r"^  -")
_TOKEN = re.compile(r"[^\s,]+")


@functools.lru_cache(maxsize=16)
def options(doc: str) -> tuple[Option, ...]:
    """The options a usage docstring declares: each line indented by exactly two spaces
    that starts with `-`, up to the first run of two spaces. `-t, --target PID` is one
    option with an argument; `--namespace NS --pod NAME` declares two."""
    found: dict[str, Option] = {}
    for line in doc.splitlines():
        if not _OPTION_LINE.match(line):
            continue
        spec = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names: list[str] = []
        for token in _TOKEN.findall(spec):
            if token.startswith("-"):
                names.append(token.split("=", 1)[0])
                continue
            if names:
                _declare(found, Option(tuple(names), token))
            names = []
        if names:
            _declare(found, Option(tuple(names)))
    return (HELP, VERSION, *found.values())


def _declare(found: dict[str, Option], option: Option) -> None:
    known = found.get(option.key)
    if known is not None and bool(known.metavar) != bool(option.metavar):
        raise ValueError(f"{option.key} is declared both with and without an argument")
    found.setdefault(option.key, option)


@dataclass(frozen=True, slots=True)
class CommandLine:
    """A parsed command line: the options in the order given, and the operands."""

    given: tuple[tuple[str, str], ...] = ()  # (option key, value; "" for a flag)
    operands: tuple[str, ...] = ()
    show: Show | None = None  # `--help` or `--version` met (parsing stopped there)

    def has(self, key: str) -> bool:
        return any(k == key for k, _ in self.given)

    def value(self, key: str, default: str | None = None) -> str | None:
        """The last value given for `key`, as getopt programs let a later one win."""
        values = self.values(key)
        return values[-1] if values else default

    def values(self, key: str) -> list[str]:
        return [v for k, v in self.given if k == key]


def parse(
    args: Sequence[str], declared: Sequence[Option], *, operands: bool = False
) -> CommandLine:
    """getopt_long over `args` (argv without argv[0]); UsageError in getopt's words.

    Operands are refused (`extra operand`) unless `operands`; `--` ends the options.
    """
    given: list[tuple[str, str]] = []
    rest: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            rest.extend(args[index:])
            break
        if not arg.startswith("-") or arg == "-":
            rest.append(arg)
            continue
        if arg.startswith("--"):
            option, value, index = _long(arg, args, index, declared)
            hits = [(option, value)]
        else:
            hits, index = _short(arg, args, index, declared)
        for option, value in hits:
            if option is HELP:
                return CommandLine(tuple(given), tuple(rest), Show.HELP)
            if option is VERSION:
                return CommandLine(tuple(given), tuple(rest), Show.VERSION)
            given.append((option.key, value))
    if rest and not operands:
        raise UsageError(f"extra operand '{rest[0]}'")
    return CommandLine(tuple(given), tuple(rest))


def _long(
    arg: str, args: Sequence[str], index: int, declared: Sequence[Option]
) -> tuple[Option, str, int]:
    name, eq, inline = arg.partition("=")
    option = _match_long(name, arg, declared)
    full = name if name in option.names else _spelled(name, option)
    if not option.metavar:
        if eq:
            raise UsageError(f"option '{full}' doesn't allow an argument")
        return option, "", index
    if eq:
        return option, inline, index
    if index >= len(args):
        raise UsageError(f"option '{full}' requires an argument")
    return option, args[index], index + 1


def _spelled(prefix: str, option: Option) -> str:
    """The long spelling an abbreviation stands for (getopt names the full option)."""
    return next(n for n in option.names if n.startswith(prefix))


def _match_long(name: str, arg: str, declared: Sequence[Option]) -> Option:
    exact = [o for o in declared if name in o.names]
    if exact:
        return exact[0]
    matches = {
        spelling: o
        for o in declared
        for spelling in o.names
        if spelling.startswith("--") and spelling.startswith(name)
    }
    distinct = {id(o): o for o in matches.values()}
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    if distinct:
        listed = " ".join(f"'{spelling}'" for spelling in matches)
        raise UsageError(f"option '{name}' is ambiguous; possibilities: {listed}")
    raise UsageError(f"unrecognized option '{arg}'")


def _short(
    arg: str, args: Sequence[str], index: int, declared: Sequence[Option]
) -> tuple[list[tuple[Option, str]], int]:
    hits: list[tuple[Option, str]] = []
    for position, letter in enumerate(arg[1:], start=1):
        option = next((o for o in declared if f"-{letter}" in o.names), None)
        if option is None:
            raise UsageError(f"invalid option -- '{letter}'")
        if not option.metavar:
            hits.append((option, ""))
            continue
        attached = arg[position + 1 :]
        if attached:
            hits.append((option, attached))
        elif index < len(args):
            hits.append((option, args[index]))
            index += 1
        else:
            raise UsageError(f"option requires an argument -- '{letter}'")
        break
    return hits, index
