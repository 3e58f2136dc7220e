"""The nsenter command-line parser: util-linux 2.38.1 getopt_long behaviour, as data."""

from __future__ import annotations

import io

import pytest

from multicall import __version__
from multicall.applets import APPLETS
from multicall.core import netns_exec as na
from multicall.core.netns_exec import ArgError, FileOpen, Invocation, NsenterError
from multicall.core.usage import Show
from multicall.dispatch import run_applet

NET = "/var/run/netns/pod"
NETNS_EXEC = next(a for a in APPLETS if a.name == "netns-exec")

# (arguments, opens done while parsing, expected outcome)
CASES: list[tuple[list[str], tuple[FileOpen, ...], Invocation | Show | ArgError]] = [
    # Linkerd's call, and the attached short form.
    (
        ["--net=" + NET, "--", "iptables-save", "-t", "nat"],
        (FileOpen("ns/net", NET),),
        Invocation(argv=("iptables-save", "-t", "nat")),
    ),
    (["-n" + NET, "ip", "a"], (FileOpen("ns/net", NET),), Invocation(argv=("ip", "a"))),
    # A detached file is the program; the namespace then comes from the target.
    (["-n", NET], (), Invocation(from_target=frozenset({"ns/net"}), argv=(NET,))),
    (["--net", NET, "x"], (), Invocation(from_target=frozenset({"ns/net"}), argv=(NET, "x"))),
    # `-n=FILE` keeps the '=' (2.38.1 opens "=FILE").
    (["-n=" + NET, "true"], (FileOpen("ns/net", "=" + NET),), Invocation(argv=("true",))),
    (["--net=", "true"], (FileOpen("ns/net", ""),), Invocation(argv=("true",))),
    # Every namespace option, short and long, with and without a file.
    (
        ["-t", "42", "-m", "-u", "-i", "-n", "-p", "-U", "-C", "-T", "sh"],
        (),
        Invocation(
            target_pid=42,
            from_target=frozenset(ns.slot for ns in na.NAMESPACES),
            argv=("sh",),
        ),
    ),
    (
        ["--mount=/m", "--uts=/u", "--ipc=/i", "--pid=/p", "--user=/U", "--cgroup=/C", "--time=/T"],
        tuple(
            FileOpen(slot, path)
            for slot, path in [
                ("ns/mnt", "/m"),
                ("ns/uts", "/u"),
                ("ns/ipc", "/i"),
                ("ns/pid", "/p"),
                ("ns/user", "/U"),
                ("ns/cgroup", "/C"),
                ("ns/time", "/T"),
            ]
        ),
        Invocation(),
    ),
    # Istio's user-namespace pod call.
    (
        ["--user=/proc/7/fd/3", "--net=" + NET, "iptables-restore"],
        (FileOpen("ns/user", "/proc/7/fd/3"), FileOpen("ns/net", NET)),
        Invocation(argv=("iptables-restore",)),
    ),
    # Clusters: flags then an option that takes the rest of the word.
    (["-Fn" + NET, "x"], (FileOpen("ns/net", NET),), Invocation(no_fork=True, argv=("x",))),
    (["-Ft7", "x"], (), Invocation(no_fork=True, target_pid=7, argv=("x",))),
    (["-Ft", "7", "x"], (), Invocation(no_fork=True, target_pid=7, argv=("x",))),
    (["-tF"], (), ArgError("failed to parse pid: 'F'")),
    # Long options: '=' or next word for required arguments; unique prefixes.
    (["--target=9", "-n"], (), Invocation(target_pid=9, from_target=frozenset({"ns/net"}))),
    (["--target", "9"], (), Invocation(target_pid=9)),
    (["--tar", "9"], (), Invocation(target_pid=9)),
    (["--ne=" + NET], (FileOpen("ns/net", NET),), Invocation()),
    (["--pre"], (), Invocation(preserve_credentials=True)),
    (["--wd=/tmp"], (FileOpen("cwd", "/tmp"),), Invocation()),
    # Credentials and the rest of the flags.
    (["-S", "1000", "-G", "100"], (), Invocation(uid=1000, gid=100)),
    (["--setuid=0", "--setgid", "0"], (), Invocation(uid=0, gid=0)),
    (["-S", "-1"], (), Invocation(uid=0xFFFFFFFF)),
    (["-G", "99999999999"], (), Invocation(gid=99999999999 & 0xFFFFFFFF)),
    (["-S", " +5"], (), Invocation(uid=5)),
    (
        ["--preserve-credentials", "-F", "-a", "-Z"],
        (),
        Invocation(
            preserve_credentials=True, no_fork=True, all_namespaces=True, follow_context=True
        ),
    ),
    (["-r", "-w"], (), Invocation(from_target=frozenset({"root", "cwd"}))),
    (["-r/", "-w/tmp"], (FileOpen("root", "/"), FileOpen("cwd", "/tmp")), Invocation()),
    (["-W", "/srv"], (), Invocation(wdns="/srv")),
    # Parsing stops at the first non-option and at `--`; `-` is a program.
    (["true", "-n", "--x"], (), Invocation(argv=("true", "-n", "--x"))),
    (["--", "-n"], (), Invocation(argv=("-n",))),
    (["-"], (), Invocation(argv=("-",))),
    ([], (), Invocation()),
    (["--"], (), Invocation()),
    # pid_t is signed 32-bit; 0 means "no target".
    (["-t", "0"], (), Invocation()),
    (["-t", "-5"], (), Invocation(target_pid=-5)),
    (["-t", "4294967297"], (), Invocation(target_pid=1)),
    (["-t", "1", "-t", "2"], (), Invocation(target_pid=2)),
    # A slot given twice: every file is opened, the flag form still counts.
    (["-n/a", "-n/b"], (FileOpen("ns/net", "/a"), FileOpen("ns/net", "/b")), Invocation()),
    (
        ["-n/a", "-n"],
        (FileOpen("ns/net", "/a"),),
        Invocation(from_target=frozenset({"ns/net"})),
    ),
    # Help and version stop parsing where they stand.
    (["-h", "-x"], (), Show.HELP),
    (["-n/a", "--help"], (FileOpen("ns/net", "/a"),), Show.HELP),
    (["-V", "-h"], (), Show.VERSION),
    (["-h5"], (), Show.HELP),
    # getopt errors, worded as glibc words them.
    (["-x", "-h"], (), ArgError("invalid option -- 'x'", getopt=True)),
    (["-e"], (), ArgError("invalid option -- 'e'", getopt=True)),
    (["-n/a", "-x"], (FileOpen("ns/net", "/a"),), ArgError("invalid option -- 'x'", getopt=True)),
    (["--bogus=x"], (), ArgError("unrecognized option '--bogus=x'", getopt=True)),
    (["--user-parent"], (), ArgError("unrecognized option '--user-parent'", getopt=True)),
    (["-t"], (), ArgError("option requires an argument -- 't'", getopt=True)),
    (["-W"], (), ArgError("option requires an argument -- 'W'", getopt=True)),
    (["--target"], (), ArgError("option '--target' requires an argument", getopt=True)),
    (["--no-fork=x"], (), ArgError("option '--no-fork' doesn't allow an argument", getopt=True)),
    (["--help=x"], (), ArgError("option '--help' doesn't allow an argument", getopt=True)),
    (
        ["--p"],
        (),
        ArgError(
            "option '--p' is ambiguous; possibilities: '--pid' '--preserve-credentials'",
            getopt=True,
        ),
    ),
    (
        ["--n=x"],
        (),
        ArgError("option '--n=x' is ambiguous; possibilities: '--net' '--no-fork'", getopt=True),
    ),
    (
        ["--u"],
        (),
        ArgError("option '--u' is ambiguous; possibilities: '--uts' '--user'", getopt=True),
    ),
    (
        ["--w"],
        (),
        ArgError("option '--w' is ambiguous; possibilities: '--wd' '--wdns'", getopt=True),
    ),
    # strtoul_or_err errors.
    (["-t", "abc"], (), ArgError("failed to parse pid: 'abc'")),
    (["-t", ""], (), ArgError("failed to parse pid: ''")),
    (["-t", "5 "], (), ArgError("failed to parse pid: '5 '")),
    (["-t", "-"], (), ArgError("failed to parse pid: '-'")),
    (["-S", "follow"], (), ArgError("failed to parse uid: 'follow'")),
    (["-G", "x1"], (), ArgError("failed to parse gid: 'x1'")),
    (
        ["-t", "99999999999999999999"],
        (),
        ArgError("failed to parse pid: '99999999999999999999': Numerical result out of range"),
    ),
    (["-t", "abc", "-n/a"], (), ArgError("failed to parse pid: 'abc'")),
]


@pytest.mark.parametrize(("args", "opens", "outcome"), CASES, ids=lambda v: repr(v)[:60])
def test_parse(
    args: list[str], opens: tuple[FileOpen, ...], outcome: Invocation | Show | ArgError
) -> None:
    """Each command line gives the opens util-linux does while parsing, then the outcome."""
    parsed = na.parse_args(args)
    assert parsed.opens == opens
    assert parsed.outcome == outcome


class TestTargetOpens:
    @pytest.mark.parametrize(
        ("args", "paths"),
        [
            (
                ["-t", "5", "-n", "-m", "-U"],
                ["/proc/5/ns/user", "/proc/5/ns/net", "/proc/5/ns/mnt"],
            ),
            (["-t", "5", "-w", "-r", "-T"], ["/proc/5/ns/time", "/proc/5/root", "/proc/5/cwd"]),
            (["-t", "5", "-n/x"], []),
            (["-t", "5", "-n/x", "-n"], ["/proc/5/ns/net"]),
            (["-t", "-5", "-p"], ["/proc/-5/ns/pid"]),
        ],
    )
    def test_table_order(self, args: list[str], paths: list[str]) -> None:
        """Target files are opened in util-linux's table order: user first, root, cwd last."""
        invocation = na.parse_args(args).outcome
        assert isinstance(invocation, Invocation)
        assert [op.path for op in na.target_opens(invocation)] == paths

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["-n", "/bin/true"], "neither filename nor target pid supplied for ns/net"),
            (["-m", "-u"], "neither filename nor target pid supplied for ns/uts"),
            (["-r"], "neither filename nor target pid supplied for root"),
            (["-w"], "neither filename nor target pid supplied for cwd"),
            (["-n/a", "-n"], "neither filename nor target pid supplied for ns/net"),
            (["-t", "0", "-U"], "neither filename nor target pid supplied for ns/user"),
        ],
    )
    def test_needs_a_target(self, args: list[str], message: str) -> None:
        """A slot without a file and without --target is nsenter's own error (exit 1)."""
        invocation = na.parse_args(args).outcome
        assert isinstance(invocation, Invocation)
        with pytest.raises(NsenterError) as info:
            na.target_opens(invocation)
        assert info.value.message == message
        assert info.value.exit_code == 1

    def test_all_needs_a_target(self) -> None:
        """--all without --target is refused before anything is opened."""
        invocation = na.parse_args(["-a"]).outcome
        assert isinstance(invocation, Invocation)
        with pytest.raises(NsenterError, match="no target PID specified for --all"):
            na.check_all(invocation)

    def test_all_candidates_skip_given_files(self) -> None:
        """--all adds only namespaces that were not given a file."""
        parsed = na.parse_args(["-a", "-t", "3", "--net=/x"])
        assert "ns/net" not in {ns.slot for ns in na.all_candidates(parsed)}
        assert len(na.all_candidates(parsed)) == len(na.NAMESPACES) - 1


class TestPlan:
    @pytest.mark.parametrize(
        ("args", "entering", "creds"),
        [
            ([], set(), na.Credentials(None, None, False, False)),
            (["-S", "5"], set(), na.Credentials(5, None, False, False)),
            (["-G", "6"], {"ns/net"}, na.Credentials(None, 6, True, False)),
            (["-U"], {"ns/user"}, na.Credentials(0, 0, True, True)),
            (["-U", "-S", "7"], {"ns/user", "ns/net"}, na.Credentials(7, 0, True, True)),
            (
                ["--preserve-credentials", "-U"],
                {"ns/user"},
                na.Credentials(None, None, False, False),
            ),
        ],
    )
    def test_credentials(self, args: list[str], entering: set[str], creds: na.Credentials) -> None:
        """A user namespace makes us root in it unless --preserve-credentials."""
        invocation = na.parse_args(args).outcome
        assert isinstance(invocation, Invocation)
        assert na.plan_credentials(invocation, frozenset(entering)) == creds

    @pytest.mark.parametrize(
        ("args", "entering", "fork"),
        [
            ([], {"ns/net"}, False),
            ([], {"ns/pid"}, True),
            ([], {"ns/time", "ns/net"}, True),
            (["-F"], {"ns/pid"}, False),
            (["--no-fork"], {"ns/time"}, False),
        ],
    )
    def test_fork_only_for_pid_and_time(
        self, args: list[str], entering: set[str], fork: bool
    ) -> None:
        """Only pid and time namespaces apply to children, so only they need a fork."""
        invocation = na.parse_args(args).outcome
        assert isinstance(invocation, Invocation)
        assert na.should_fork(invocation, frozenset(entering)) is fork


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("42", 42),
        ("+3", 3),
        ("\t 7", 7),
        ("-1", 2**64 - 1),
        ("18446744073709551615", 2**64 - 1),
        ("-18446744073709551615", 1),
    ],
)
def test_parse_ulong(text: str, value: int) -> None:
    """Numbers read like C strtoul: blanks and a sign before the digits, negatives wrap."""
    assert na.parse_ulong(text, "pid") == value


@pytest.mark.parametrize("text", ["", " ", "1x", "0x10", "١", "18446744073709551616", "1 "])
def test_parse_ulong_rejects(text: str) -> None:
    """Anything strtoul would not consume entirely (or that overflows) is an error."""
    assert isinstance(na.parse_ulong(text, "pid"), ArgError)


def test_version_names_the_invoked_program() -> None:
    """--version says which util-linux it follows, under the name it was called by."""
    rc, out, _ = TestAppletWithoutExec.run("/usr/local/bin/nsenter", "-V")
    assert (rc, out) == (0, f"nsenter from cnibox {__version__} (util-linux 2.38.1 compatible)\n")


def test_version_note_is_the_compatibility_target() -> None:
    """The applet table's note names the util-linux release the parser follows."""
    assert NETNS_EXEC.version_note == f"util-linux {na.VERSION_COMPAT} compatible"


class TestAppletWithoutExec:
    """The applet's answers that come before any namespace is entered (no root needed)."""

    @staticmethod
    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.BytesIO(), io.BytesIO()
        rc = run_applet(NETNS_EXEC, list(argv), {}, (io.BytesIO(), out, err))
        return rc, out.getvalue().decode(), err.getvalue().decode()

    def test_help_uses_the_invoked_name(self) -> None:
        """--help prints the usage under the name it was called by, exit 0."""
        rc, out, _ = self.run("/usr/local/bin/nsenter", "--help")
        assert rc == 0
        assert out.startswith("usage: nsenter [options]")

    def test_getopt_error_names_argv0_and_points_to_help(self) -> None:
        """glibc getopt errors name argv[0] as given; the hint names the short name."""
        rc, out, err = self.run("/usr/local/bin/nsenter", "-x")
        assert (rc, out) == (1, "")
        assert err == (
            "/usr/local/bin/nsenter: invalid option -- 'x'\n"
            "Try 'nsenter --help' for more information.\n"
        )

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["-t", "abc"], "failed to parse pid: 'abc'"),
            (
                ["--net=/nonexistent/x", "true"],
                "cannot open /nonexistent/x: No such file or directory",
            ),
            (["-n", "/bin/true"], "neither filename nor target pid supplied for ns/net"),
            (["-a"], "no target PID specified for --all"),
        ],
    )
    def test_own_errors_exit_1(self, argv: list[str], message: str) -> None:
        """nsenter's own errors: one `NAME: message` line and exit status 1."""
        rc, out, err = self.run("nsenter", *argv)
        assert (rc, out, err) == (1, "", f"nsenter: {message}\n")
