"""netns-exec against Debian's util-linux 2.38.1 nsenter, the oracle, case by case.

Each case runs three times: `/usr/bin/nsenter`, cnibox as `netns-exec`, and cnibox through a
symlink named `nsenter`. Exit status and stdout must be identical, and stderr too once the
program name in front of each message is normalised. Every namespace entered is a rig netns
or belongs to a holder process started inside one.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import cnibox_argv, require_root, require_tool, skip_or_fail
from tests.support.rig import Netns, Rig

pytestmark = pytest.mark.netns

TIMEOUT = 60
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


@dataclass(frozen=True)
class Outcome:
    rc: int
    stdout: str
    stderr: str


def normalise(stderr: str) -> str:
    """Replace the program name util-linux (or cnibox) puts before its messages."""
    out = re.sub(r"^\S*(?:nsenter|netns-exec): ", "PROG: ", stderr, flags=re.MULTILINE)
    return re.sub(r"Try '(?:nsenter|netns-exec) --help'", "Try 'PROG --help'", out)


def run_argv(argv: list[str], env: dict[str, str], stdin: str, cwd: Path) -> Outcome:
    proc = subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=TIMEOUT,
        check=False,
    )
    return Outcome(proc.returncode, proc.stdout, normalise(proc.stderr))


@dataclass
class World:
    """The namespaces and processes the cases point nsenter at."""

    rig: Rig
    tmp: Path
    a: Netns
    b: Netns
    holders: dict[str, int] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def holder(self, kind: str) -> int:
        """A process whose namespaces a case targets with -t (started once per test)."""
        if kind not in self.holders:
            self.holders[kind] = self._start(kind)
        return self.holders[kind]

    def _start(self, kind: str) -> int:
        unshare = {
            "plain": [],
            "user": ["unshare", "-U", "-r", "-u", "-i", "-C", "-m"],
            "unmapped": ["unshare", "-U"],
            "pid": ["unshare", "-p", "-f"],
            "time": ["unshare", "-T", "-f", "--boottime", "1000"],
        }[kind]
        script = "hostname cbx-uts; " if kind == "user" else ""
        argv = ["ip", "netns", "exec", self.a.name, *unshare, "sh", "-c", f"{script}exec sleep 600"]
        proc = subprocess.Popen(argv, cwd=self.tmp, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        pid = child_of(proc.pid) if kind in ("pid", "time") else proc.pid
        wait_for_sleep(pid)
        return pid

    def stop(self) -> None:
        for proc in self.procs:
            # Kill the whole holder: with --fork the sleep is unshare's child.
            for pid in [*descendants(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=TIMEOUT)


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def descendants(pid: int) -> list[int]:
    found = []
    for child in children(pid):
        found += [*descendants(child), child]
    return found


def child_of(pid: int) -> int:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        kids = children(pid)
        if kids:
            return kids[0]
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never forked")


def wait_for_sleep(pid: int) -> None:
    """Until the holder has exec'd sleep, its namespaces may not all exist yet."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"holder {pid} did not start")


@dataclass(frozen=True)
class Case:
    name: str
    args: Callable[[World], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    stdin: str = ""
    exact: bool = True  # False: only the exit status must agree (help, version)
    unset: tuple[str, ...] = ()  # environment variables to remove


def ns(netns: Netns) -> str:
    return netns.path


READ_NS = "readlink /proc/self/ns/net /proc/self/ns/user"

CASES = [
    # Linkerd's call and its spellings.
    Case("linkerd-form", lambda w: [f"--net={ns(w.a)}", "--", "ip", "-o", "link", "show"]),
    Case("net-long-no-dashdash", lambda w: [f"--net={ns(w.a)}", "ip", "-o", "link", "show"]),
    Case("net-short-attached", lambda w: [f"-n{ns(w.a)}", "ip", "-o", "link", "show"]),
    Case("net-abbreviated", lambda w: [f"--ne={ns(w.a)}", "readlink", "/proc/self/ns/net"]),
    Case("net-detached-no-target", lambda w: ["-n", ns(w.a), "true"]),
    Case("net-short-equals", lambda w: [f"-n={ns(w.a)}", "true"]),
    Case("net-empty-file", lambda _: ["--net=", "true"]),
    Case("two-netns-last-wins", lambda w: [f"-n{ns(w.b)}", f"-n{ns(w.a)}", "ip", "-o", "link"]),
    Case("file-and-flag", lambda w: [f"-n{ns(w.a)}", "-n", "true"]),
    # --target, with and without namespace options.
    Case("target-net", lambda w: ["-t", str(w.holder("plain")), "-n", "ip", "-o", "link"]),
    Case("target-no-ns", lambda w: ["-t", str(w.holder("plain")), "echo", "hi"]),
    Case("target-detached-file", lambda w: ["-t", str(w.holder("plain")), "-n", ns(w.a)]),
    Case("target-bad-pid", lambda _: ["-t", "999999999", "-n", "true"]),
    Case("target-not-a-number", lambda _: ["-t", "12x", "-n", "true"]),
    Case("target-missing", lambda _: ["-t"]),
    Case("target-zero", lambda _: ["-t", "0", "-n", "true"]),
    # Program and argument handling.
    Case("args-after-program", lambda w: [f"--net={ns(w.a)}", "echo", "-n", "--net=x", "-t"]),
    Case("dashdash-then-dash-prog", lambda w: [f"--net={ns(w.a)}", "--", "-n"]),
    Case("missing-program", lambda w: [f"--net={ns(w.a)}", "/nonexistent/prog"]),
    Case("missing-program-path", lambda w: [f"--net={ns(w.a)}", "cbx-no-such-program"]),
    Case("empty-program", lambda w: [f"--net={ns(w.a)}", ""]),
    Case("not-executable", lambda w: [f"--net={ns(w.a)}", str(w.tmp / "plain.txt")]),
    Case("directory-program", lambda w: [f"--net={ns(w.a)}", str(w.tmp)]),
    Case("not-executable-no-fork", lambda w: ["-F", f"--net={ns(w.a)}", str(w.tmp / "plain.txt")]),
    Case("exit-status", lambda w: [f"--net={ns(w.a)}", "sh", "-c", "echo out; exit 3"]),
    # $PATH search as glibc's execvp: EACCES is remembered, later entries still tried.
    Case(
        "path-skips-non-executable",
        lambda w: [f"-n{ns(w.a)}", "cbxprog", "arg"],
        env={"PATH": "/nonexistent:{tmp}/path1:{tmp}/path2"},
    ),
    Case(
        "path-only-non-executable",
        lambda w: [f"-n{ns(w.a)}", "cbxprog"],
        env={"PATH": "{tmp}/path1:/nonexistent"},
    ),
    Case("path-unset-default", lambda w: [f"-n{ns(w.a)}", "true"], unset=("PATH",)),
    Case("path-empty-is-cwd", lambda w: [f"-n{ns(w.a)}", "noshebang", "x"], env={"PATH": ""}),
    Case("script-without-shebang", lambda w: [f"-n{ns(w.a)}", str(w.tmp / "noshebang"), "y"]),
    # Bad namespace files.
    Case("bad-path", lambda _: ["--net=/nonexistent/netns", "true"]),
    Case("bad-path-before-bad-option", lambda _: ["-n/nonexistent", "-x"]),
    Case("not-a-namespace", lambda w: [f"--net={w.tmp / 'plain.txt'}", "true"]),
    Case("wrong-namespace-type", lambda w: [f"--uts={ns(w.a)}", "true"]),
    # User namespaces: entered first, root inside unless told otherwise.
    Case(
        "user-and-net-target",
        lambda w: ["-t", str(w.holder("user")), "-U", "-n", "sh", "-c", f"id -u; {READ_NS}"],
    ),
    Case(
        "user-and-net-files",
        lambda w: [
            f"--user=/proc/{w.holder('user')}/ns/user",
            f"--net={ns(w.a)}",
            "sh",
            "-c",
            f"id -u; id -G; {READ_NS}",
        ],
    ),
    Case(
        "user-uts-ipc-cgroup-mnt",
        lambda w: [
            *("-t", str(w.holder("user")), "-U", "-u", "-i", "-C", "-m"),
            *("sh", "-c", "hostname; readlink /proc/self/ns/ipc /proc/self/ns/cgroup"),
        ],
    ),
    Case("user-unmapped", lambda w: ["-t", str(w.holder("unmapped")), "-U", "id", "-u"]),
    Case(
        "user-unmapped-preserve",
        lambda w: ["-t", str(w.holder("unmapped")), "-U", "--preserve-credentials", "id", "-u"],
    ),
    Case("all-namespaces", lambda w: ["-a", "-t", str(w.holder("user")), "hostname"]),
    Case("all-no-target", lambda _: ["-a", "true"]),
    # Credentials without a user namespace.
    Case(
        "setuid-setgid",
        lambda w: [f"-n{ns(w.a)}", "-S", "1000", "-G", "1001", "sh", "-c", "id -u; id -g; id -G"],
    ),
    Case("setgid-drops-groups", lambda w: [f"-n{ns(w.a)}", "-G", "5", "id", "-G"]),
    Case("setuid-invalid", lambda w: [f"-n{ns(w.a)}", "-S", "-1", "true"]),
    Case("setuid-not-a-number", lambda _: ["-S", "follow", "true"]),
    # pid and time namespaces: fork, and pass the child's fate on.
    Case("pid-ns", lambda w: ["-t", str(w.holder("pid")), "-p", "readlink", "/proc/self/ns/pid"]),
    Case("pid-exit-code", lambda w: ["-t", str(w.holder("pid")), "-p", "sh", "-c", "exit 7"]),
    Case(
        "pid-signal-term",
        lambda w: ["-t", str(w.holder("pid")), "-p", "sh", "-c", "kill -TERM $$"],
    ),
    Case(
        "pid-signal-pipe",
        lambda w: ["-t", str(w.holder("pid")), "-p", "sh", "-c", "kill -PIPE $$"],
    ),
    Case(
        "pid-no-fork",
        lambda w: ["-t", str(w.holder("pid")), "-p", "-F", "sh", "-c", "kill -KILL $$"],
    ),
    Case(
        "pid-not-found",
        lambda w: ["-t", str(w.holder("pid")), "--pid", "cbx-no-such-program"],
    ),
    Case(
        "time-ns", lambda w: ["-t", str(w.holder("time")), "-T", "readlink", "/proc/self/ns/time"]
    ),
    Case("time-wrong-type", lambda w: [f"-T{ns(w.a)}", "true"]),
    # Root and working directory.
    Case("root-and-wd", lambda _: ["-r/", "-w/tmp", "pwd"]),
    Case("root-keeps-cwd", lambda _: ["--root=/", "pwd"]),
    Case("wdns", lambda _: ["-r/", "-W", "/usr", "pwd"]),
    Case("wdns-missing", lambda _: ["-W", "/nonexistent", "true"]),
    Case("wd-missing", lambda _: ["-w/nonexistent", "true"]),
    Case("root-no-target", lambda _: ["-r", "true"]),
    Case("target-root-and-wd", lambda w: ["-t", str(w.holder("plain")), "-r", "-w", "pwd"]),
    Case("empty-root", lambda w: [f"-r{w.tmp / 'empty'}", "-w/", "/bin/true"]),
    # No program: $SHELL as a login shell, else /bin/sh.
    Case("shell-from-env", lambda _: [], env={"SHELL": "/bin/sh"}, stdin='echo "$0"; exit 4\n'),
    Case("shell-default", lambda _: [], stdin='echo "$0"\n'),
    Case("shell-missing", lambda _: [], env={"SHELL": "/nonexistent/shell"}),
    Case("shell-empty", lambda _: ["--"], env={"SHELL": ""}),
    # Command-line errors.
    Case("invalid-option", lambda _: ["-x", "true"]),
    Case("unknown-long-option", lambda _: ["--user-parent", "true"]),
    Case("ambiguous-option", lambda _: ["--p", "true"]),
    Case("no-argument-allowed", lambda _: ["--no-fork=yes", "true"]),
    Case("help", lambda _: ["--help"], exact=False),
    Case("version", lambda _: ["-V"], exact=False),
]


@pytest.fixture
def world(rig: Rig, tmp_path: Path) -> Iterator[World]:
    a = rig.netns("a")
    # A link that only netns A has, so `ip link` tells the namespaces apart.
    a.ip("link", "add", "cbxa0", "type", "veth", "peer", "name", "cbxa1")
    b = rig.netns("b")
    (tmp_path / "plain.txt").write_text("not a program\n")
    (tmp_path / "empty").mkdir()
    write_program(tmp_path / "path1" / "cbxprog", '#!/bin/sh\necho one "$@"\n', 0o644)
    write_program(tmp_path / "path2" / "cbxprog", '#!/bin/sh\necho two "$@"\n', 0o755)
    write_program(tmp_path / "noshebang", 'echo "no #! line:" "$0" "$@"\n', 0o755)
    w = World(rig, tmp_path, a, b)
    try:
        yield w
    finally:
        w.stop()


def write_program(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


@pytest.fixture(scope="module")
def nsenter_link(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A symlink named `nsenter` to cnibox (the built binary when $CNIBOX is set)."""
    target = Path(os.environ.get("CNIBOX") or Path(sys.executable).parent / "cnibox")
    if not target.exists():
        skip_or_fail(f"no cnibox executable at {target}")
    link = tmp_path_factory.mktemp("links") / "nsenter"
    link.symlink_to(target)
    return link


def implementations(link: Path) -> dict[str, list[str]]:
    return {
        "util-linux": [require_tool("nsenter")],
        "netns-exec": cnibox_argv("netns-exec"),
        "nsenter-link": [str(link)],
    }


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_same_as_util_linux(case: Case, world: World, nsenter_link: Path) -> None:
    """cnibox behaves like util-linux nsenter: status, stdout, stderr (name normalised)."""
    require_root()
    args = case.args(world)
    env = {**BASE_ENV, **{k: v.format(tmp=world.tmp) for k, v in case.env.items()}}
    for name in case.unset:
        env.pop(name, None)
    results = {
        name: run_argv([*prefix, *args], env, case.stdin, world.tmp)
        for name, prefix in implementations(nsenter_link).items()
    }
    oracle = results["util-linux"]
    for name, got in results.items():
        if case.exact:
            assert got == oracle, f"{name} differs from util-linux for {args}"
        else:
            assert (got.rc, got.stderr) == (oracle.rc, oracle.stderr), name
            assert got.stdout.strip(), name


def test_help_lists_every_util_linux_option(nsenter_link: Path) -> None:
    """--help names each long option util-linux 2.38.1 documents."""
    oracle = subprocess.run(
        [require_tool("nsenter"), "--help"], capture_output=True, text=True, check=True
    )
    ours = subprocess.run([str(nsenter_link), "--help"], capture_output=True, text=True, check=True)
    assert ours.stdout.startswith("usage: nsenter ")
    for option in re.findall(r"--[a-z-]+", oracle.stdout):
        assert option in ours.stdout


def save_nat(netns_path: str, argv0: list[str]) -> str:
    proc = subprocess.run(
        [*argv0, f"--net={netns_path}", "--", "iptables-nft-save", "-t", "nat"],
        capture_output=True,
        text=True,
        check=True,
        timeout=TIMEOUT,
    )
    return "\n".join(line for line in proc.stdout.splitlines() if not line.startswith("#"))


def test_linkerd_call_prints_the_pods_rules(rig: Rig, nsenter_link: Path) -> None:
    """`nsenter --net=<pod> -- iptables-nft-save -t nat` shows that pod's rules, not others'."""
    require_tool("iptables-nft-save")
    pod = rig.pod()
    other = rig.pod()
    pod.netns.exec(["iptables-nft", "-t", "nat", "-N", "PROXY_INIT_REDIRECT"])
    pod.netns.exec(
        ["iptables-nft", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-j", "PROXY_INIT_REDIRECT"]
    )
    ours = save_nat(pod.netns.path, [str(nsenter_link)])
    assert ours == save_nat(pod.netns.path, [require_tool("nsenter")])
    assert "-A PREROUTING -p tcp -j PROXY_INIT_REDIRECT" in ours.splitlines()
    assert "PROXY_INIT_REDIRECT" not in save_nat(other.netns.path, [str(nsenter_link)])
