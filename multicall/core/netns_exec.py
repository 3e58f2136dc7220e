"""The nsenter command line (util-linux 2.38.1), parsed into a plan without touching anything.

Rules of this module:
1. The grammar is glibc `getopt_long` with util-linux's option string
   `+ahVt:m::u::i::n::p::C::U::T::S:G:r::w::W:FZ`: parsing stops at the first non-option
   (`+`), long names may be abbreviated to any unambiguous prefix, and an optional argument
   only counts when attached (`--net=FILE`, `-nFILE`): `-n FILE` means "no file", and FILE is
   the program.
2. util-linux opens a namespace, root or cwd file the moment it parses it, so an unopenable
   file wins over a later bad option. `Parsed.opens` lists those opens in command-line order;
   `Parsed.outcome` is what comes after them (run, help, version, or an argument error).
3. Numbers are read like util-linux `strtoul_or_err` (leading blanks and a sign accepted,
   negative values wrap) and then truncated to the C type (pid_t, uid_t, gid_t).
4. Everything that depends on the filesystem (`--all`, opening, entering) is the applet's job;
   `target_opens` only says which `/proc/PID/...` files are still to be opened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from multicall.core.usage import Show
from multicall.errors import CniboxError

VERSION_COMPAT = "2.38.1"
ULONG_MAX = 2**64 - 1
ERANGE_TEXT = "Numerical result out of range"


class ArgKind(Enum):
    NONE = 0
    REQUIRED = 1
    OPTIONAL = 2


@dataclass(frozen=True, slots=True)
class Namespace:
    """One namespace kind, in util-linux's table order (user first, see `NAMESPACES`)."""

    slot: str  # util-linux's name for it: the file under /proc/PID/, e.g. "ns/net"
    flag: int  # CLONE_NEW* (setns nstype)
    short: str
    long: str


# Order matters: util-linux enters namespaces in this order, in two passes (all but user,
# then user and whatever failed), so both raising and dropping privileges work.
NAMESPACES: tuple[Namespace, ...] = (
    Namespace("ns/user", 0x10000000, "U", "user"),
    Namespace("ns/cgroup", 0x02000000, "C", "cgroup"),
    Namespace("ns/ipc", 0x08000000, "i", "ipc"),
    Namespace("ns/uts", 0x04000000, "u", "uts"),
    Namespace("ns/net", 0x40000000, "n", "net"),
    Namespace("ns/pid", 0x20000000, "p", "pid"),
    Namespace("ns/mnt", 0x00020000, "m", "mount"),
    Namespace("ns/time", 0x00000080, "T", "time"),
)
NS_BY_SLOT = {ns.slot: ns for ns in NAMESPACES}
ROOT = "root"
CWD = "cwd"


@dataclass(frozen=True, slots=True)
class Option:
    """One nsenter option: its names, its argument and what it sets."""

    short: str | None
    long: str | None
    arg: ArgKind
    key: str


# glibc lists ambiguous long options in this (util-linux's longopts) order.
OPTIONS: tuple[Option, ...] = (
    Option("a", "all", ArgKind.NONE, "all"),
    Option("h", "help", ArgKind.NONE, "help"),
    Option("V", "version", ArgKind.NONE, "version"),
    Option("t", "target", ArgKind.REQUIRED, "target"),
    Option("m", "mount", ArgKind.OPTIONAL, "ns/mnt"),
    Option("u", "uts", ArgKind.OPTIONAL, "ns/uts"),
    Option("i", "ipc", ArgKind.OPTIONAL, "ns/ipc"),
    Option("n", "net", ArgKind.OPTIONAL, "ns/net"),
    Option("p", "pid", ArgKind.OPTIONAL, "ns/pid"),
    Option("U", "user", ArgKind.OPTIONAL, "ns/user"),
    Option("C", "cgroup", ArgKind.OPTIONAL, "ns/cgroup"),
    Option("T", "time", ArgKind.OPTIONAL, "ns/time"),
    Option("S", "setuid", ArgKind.REQUIRED, "setuid"),
    Option("G", "setgid", ArgKind.REQUIRED, "setgid"),
    Option("r", "root", ArgKind.OPTIONAL, ROOT),
    Option("w", "wd", ArgKind.OPTIONAL, CWD),
    Option("W", "wdns", ArgKind.REQUIRED, "wdns"),
    Option("F", "no-fork", ArgKind.NONE, "no-fork"),
    Option(None, "preserve-credentials", ArgKind.NONE, "preserve-credentials"),
    Option("Z", "follow-context", ArgKind.NONE, "follow-context"),
)
SHORT = {o.short: o for o in OPTIONS if o.short}


@dataclass(frozen=True, slots=True)
class FileOpen:
    """An `open(path, O_RDONLY)` into a slot (a namespace, "root" or "cwd")."""

    slot: str
    path: str


@dataclass(frozen=True, slots=True)
class Invocation:
    """What to do once every option was read: the plan the applet carries out.

    Namespaces, root and cwd come either from a file (`Parsed.opens`, the last one per slot
    wins) or, for the slots in `from_target`, from `/proc/<target_pid>/<slot>`.
    """

    target_pid: int = 0  # 0: no target (util-linux treats 0 as unset)
    from_target: frozenset[str] = frozenset()
    all_namespaces: bool = False
    wdns: str | None = None
    uid: int | None = None
    gid: int | None = None
    preserve_credentials: bool = False
    no_fork: bool = False
    follow_context: bool = False
    argv: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ArgError:
    """A bad command line. `getopt` errors name argv[0] and add a "Try --help" line."""

    message: str
    getopt: bool = False


@dataclass(frozen=True, slots=True)
class Parsed:
    """An nsenter command line: what to open, then what to do."""

    opens: tuple[FileOpen, ...]
    outcome: Invocation | Show | ArgError


class NsenterError(CniboxError):
    """One of nsenter's own failures (exit 1, `nsenter: message`)."""


def parse_args(args: list[str] | tuple[str, ...]) -> Parsed:
    """Parse the arguments after argv[0] the way util-linux 2.38.1 nsenter does."""
    state = _State()
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            index += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        found = _long(args, index) if arg.startswith("--") else _short(args, index)
        if isinstance(found, ArgError):
            return state.finish(found)
        index, hits = found
        for hit in hits:
            # getopt hands over one letter at a time: -h5 shows help before seeing '5'.
            stop = hit if isinstance(hit, ArgError) else state.apply(*hit)
            if stop is not None:
                return state.finish(stop)
    return state.finish(state.invocation(tuple(args[index:])))


def _short(
    args: list[str] | tuple[str, ...], index: int
) -> tuple[int, list[_Hit | ArgError]] | ArgError:
    """One `-abc` cluster: options without argument, until one that takes the rest."""
    cluster = args[index]
    hits: list[_Hit | ArgError] = []
    pos = 1
    while pos < len(cluster):
        letter = cluster[pos]
        option = SHORT.get(letter)
        if option is None:
            hits.append(ArgError(f"invalid option -- '{letter}'", getopt=True))
            return index + 1, hits
        rest = cluster[pos + 1 :]
        if option.arg is ArgKind.NONE:
            hits.append((option, None))
            pos += 1
            continue
        if option.arg is ArgKind.OPTIONAL or rest:
            hits.append((option, rest or None))
            return index + 1, hits
        if index + 1 >= len(args):
            hits.append(ArgError(f"option requires an argument -- '{letter}'", getopt=True))
            return index + 1, hits
        hits.append((option, args[index + 1]))
        return index + 2, hits
    return index + 1, hits


def _long(
    args: list[str] | tuple[str, ...], index: int
) -> tuple[int, list[_Hit | ArgError]] | ArgError:
    body = args[index][2:]
    name, eq, value = body.partition("=")
    option = _match_long(name, body)
    if isinstance(option, ArgError):
        return option
    if eq:
        if option.arg is ArgKind.NONE:
            return ArgError(f"option '--{option.long}' doesn't allow an argument", getopt=True)
        return index + 1, [(option, value)]
    if option.arg is ArgKind.REQUIRED:
        if index + 1 >= len(args):
            return ArgError(f"option '--{option.long}' requires an argument", getopt=True)
        return index + 2, [(option, args[index + 1])]
    return index + 1, [(option, None)]


def _match_long(name: str, body: str) -> Option | ArgError:
    """Exact name, else the one option it abbreviates (glibc's rules and messages)."""
    for option in OPTIONS:
        if option.long == name:
            return option
    prefixed = [o for o in OPTIONS if o.long and o.long.startswith(name)]
    if not prefixed:
        return ArgError(f"unrecognized option '--{body}'", getopt=True)
    if len(prefixed) > 1:
        names = " ".join(f"'--{o.long}'" for o in prefixed)
        return ArgError(f"option '--{body}' is ambiguous; possibilities: {names}", getopt=True)
    return prefixed[0]


_Hit = tuple[Option, str | None]
_NUMBER = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)")


def parse_ulong(text: str, what: str) -> int | ArgError:
    """C `strtoul_or_err`: blanks, a sign, decimal digits and nothing else; -N wraps."""
    match = _NUMBER.fullmatch(text)
    if match is None:
        return ArgError(f"failed to parse {what}: '{text}'")
    digits = match.group(2).lstrip("0")  # int() refuses over 4,300 digits; strtoul does not
    value = int(digits or "0") if len(digits) <= len(str(ULONG_MAX)) else ULONG_MAX + 1
    if value > ULONG_MAX:
        return ArgError(f"failed to parse {what}: '{text}': {ERANGE_TEXT}")
    return (-value) % (ULONG_MAX + 1) if match.group(1) == "-" else value


def to_pid(value: int) -> int:
    """unsigned long -> pid_t (int32, two's complement)."""
    low = value & 0xFFFFFFFF
    return low - 2**32 if low >= 2**31 else low


def to_id(value: int) -> int:
    """unsigned long -> uid_t/gid_t (uint32)."""
    return value & 0xFFFFFFFF


class _State:
    """The variables util-linux's option loop sets."""

    def __init__(self) -> None:
        self.opens: list[FileOpen] = []
        self.target_pid = 0
        self.from_target: set[str] = set()
        self.flags: set[str] = set()
        self.wdns: str | None = None
        self.uid: int | None = None
        self.gid: int | None = None

    def apply(self, option: Option, value: str | None) -> Show | ArgError | None:
        key = option.key
        if key in NS_BY_SLOT or key in (ROOT, CWD):
            if value is None:
                self.from_target.add(key)
            else:
                self.opens.append(FileOpen(key, value))
            return None
        if key == "help":
            return Show.HELP
        if key == "version":
            return Show.VERSION
        if key in ("target", "setuid", "setgid"):
            assert value is not None  # REQUIRED options always carry one
            return self._number(key, value)
        if key == "wdns":
            self.wdns = value
            return None
        self.flags.add(key)
        return None

    def _number(self, key: str, value: str) -> ArgError | None:
        what = {"target": "pid", "setuid": "uid", "setgid": "gid"}[key]
        number = parse_ulong(value, what)
        if isinstance(number, ArgError):
            return number
        if key == "target":
            self.target_pid = to_pid(number)
        elif key == "setuid":
            self.uid = to_id(number)
        else:
            self.gid = to_id(number)
        return None

    def invocation(self, argv: tuple[str, ...]) -> Invocation:
        return Invocation(
            target_pid=self.target_pid,
            from_target=frozenset(self.from_target),
            all_namespaces="all" in self.flags,
            wdns=self.wdns,
            uid=self.uid,
            gid=self.gid,
            preserve_credentials="preserve-credentials" in self.flags,
            no_fork="no-fork" in self.flags,
            follow_context="follow-context" in self.flags,
            argv=argv,
        )

    def finish(self, outcome: Invocation | Show | ArgError) -> Parsed:
        return Parsed(tuple(self.opens), outcome)


def all_candidates(parsed: Parsed) -> tuple[Namespace, ...]:
    """Namespaces `--all` may add: those not already given a file (the applet then drops
    the ones the kernel lacks and a user namespace the caller is already in)."""
    given = {op.slot for op in parsed.opens}
    return tuple(ns for ns in NAMESPACES if ns.slot not in given)


def target_path(target_pid: int, slot: str) -> str:
    if not target_pid:
        raise NsenterError(f"neither filename nor target pid supplied for {slot}")
    return f"/proc/{target_pid}/{slot}"


def target_opens(
    invocation: Invocation, extra: frozenset[str] = frozenset()
) -> tuple[FileOpen, ...]:
    """The `/proc/PID/...` opens after parsing, in util-linux's order (namespaces in table
    order, then root, then cwd); `extra` are namespaces `--all` added.

    A slot asked for without a file counts even when a file was also given for it, as in
    util-linux (`-n/x -n` needs a target).
    """
    wanted = invocation.from_target | extra
    slots = [ns.slot for ns in NAMESPACES if ns.slot in wanted]
    slots += [s for s in (ROOT, CWD) if s in wanted]
    return tuple(FileOpen(s, target_path(invocation.target_pid, s)) for s in slots)


def check_all(invocation: Invocation) -> None:
    if invocation.all_namespaces and not invocation.target_pid:
        raise NsenterError("no target PID specified for --all")


@dataclass(frozen=True, slots=True)
class Credentials:
    """The ids to switch to after entering; None leaves that id alone."""

    uid: int | None
    gid: int | None
    drop_groups: bool  # setgroups(0, NULL) right before setgid
    # Also drop groups before entering (a user namespace may forbid it afterwards); the
    # later setgroups may then fail only if this early one failed too.
    drop_groups_early: bool


def plan_credentials(invocation: Invocation, entering: frozenset[str]) -> Credentials:
    """Entering a user namespace makes the caller root there (0/0, no groups) unless
    --preserve-credentials; -S/-G pick other ids."""
    into_user = "ns/user" in entering and not invocation.preserve_credentials
    uid = invocation.uid if invocation.uid is not None or not into_user else 0
    gid = invocation.gid if invocation.gid is not None or not into_user else 0
    return Credentials(uid=uid, gid=gid, drop_groups=gid is not None, drop_groups_early=into_user)


def should_fork(invocation: Invocation, entering: frozenset[str]) -> bool:
    """Only a pid or time namespace applies to children, so only then a fork is needed."""
    if invocation.no_fork:
        return False
    return bool(entering & {"ns/pid", "ns/time"})
