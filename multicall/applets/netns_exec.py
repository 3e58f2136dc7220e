"""usage: netns-exec [options] [<program> [<argument>...]]

Run a program with namespaces of other processes: util-linux 2.38 nsenter, also answering
to the name `nsenter`. Without a program, runs $SHELL (or /bin/sh).

Options:
 -a, --all              enter all namespaces of the target
 -t, --target <pid>     target process to get namespaces from
 -m, --mount[=<file>]   enter mount namespace
 -u, --uts[=<file>]     enter UTS namespace (hostname etc)
 -i, --ipc[=<file>]     enter System V IPC namespace
 -n, --net[=<file>]     enter network namespace
 -p, --pid[=<file>]     enter pid namespace
 -C, --cgroup[=<file>]  enter cgroup namespace
 -U, --user[=<file>]    enter user namespace
 -T, --time[=<file>]    enter time namespace
 -S, --setuid <uid>     set uid in entered namespace
 -G, --setgid <gid>     set gid in entered namespace
     --preserve-credentials do not touch uids or gids
 -r, --root[=<dir>]     set the root directory
 -w, --wd[=<dir>]       set the working directory
 -W, --wdns <dir>       set the working directory in namespace
 -F, --no-fork          do not fork before exec'ing <program>
 -Z, --follow-context   set SELinux context according to --target PID
                        (accepted only where SELinux is disabled, where it does nothing)

 -h, --help             display this help
 -V, --version          display version

A file must be attached to its option (`--net=FILE`, `-nFILE`): `-n FILE` takes the
namespace from --target and runs FILE. Exit status: the program's; 1 for nsenter's own
errors; 126 when the program cannot be executed, 127 when it does not exist.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import BinaryIO, NoReturn

from multicall.core import netns_exec as na
from multicall.core.netns_exec import FileOpen, Invocation, NsenterError
from multicall.core.usage import Show
from multicall.effects import bundle, ns, process
from multicall.effects.streams import write_text
from multicall.errors import ExecFailed, ExecNotFound


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int | Show:
    argv0 = argv[0] if argv else "netns-exec"
    prog = argv0.rsplit("/", 1)[-1]
    parsed = na.parse_args(list(argv[1:]))
    fds: dict[str, int] = {}
    open_all(fds, parsed.opens)
    outcome = parsed.outcome
    if isinstance(outcome, na.ArgError):
        if not outcome.getopt:
            raise NsenterError(outcome.message)
        write_text(
            stderr, f"{argv0}: {outcome.message}\nTry '{prog} --help' for more information.\n"
        )
        return 1
    if isinstance(outcome, Show):
        return outcome  # the dispatcher prints help or version (as util-linux, on stdout)
    assert isinstance(outcome, Invocation)
    return run(outcome, parsed, fds, env)


def open_all(fds: dict[str, int], opens: Sequence[FileOpen]) -> None:
    """Open each file into its slot; a later file for the same slot replaces the earlier."""
    for step in opens:
        if step.slot in fds:
            process.close(fds.pop(step.slot))
        try:
            fds[step.slot] = process.open_readonly(step.path)
        except OSError as exc:
            raise NsenterError(f"cannot open {step.path}: {exc.strerror}") from exc


def run(
    invocation: Invocation, parsed: na.Parsed, fds: dict[str, int], env: Mapping[str, str]
) -> int:
    """util-linux's main() after the option loop, step by step."""
    check_follow_context(invocation)
    na.check_all(invocation)
    extra = all_namespaces(invocation, parsed) if invocation.all_namespaces else frozenset()
    open_all(fds, na.target_opens(invocation, extra))
    entering = frozenset(slot for slot in fds if slot in na.NS_BY_SLOT)
    creds = na.plan_credentials(invocation, entering)
    groups_dropped_early = drop_groups_early(creds)
    enter_namespaces(fds)
    change_root_and_cwd(fds, invocation.wdns)
    process.restore_default_signals()
    if na.should_fork(invocation, entering):
        status = process.continue_as_child()
        if status is not None:
            return status
    switch_ids(creds, groups_dropped_early)
    return execute(invocation.argv, env)


def check_follow_context(invocation: Invocation) -> None:
    # util-linux ignores -Z where SELinux is disabled; elsewhere we cannot honour it.
    if invocation.follow_context and process.selinux_enabled():
        raise NsenterError("--follow-context is not supported: SELinux is enabled here")


def all_namespaces(invocation: Invocation, parsed: na.Parsed) -> frozenset[str]:
    """--all: the target's namespaces this kernel has, minus a user namespace we are in
    already (setns refuses to re-enter one's own user namespace)."""
    chosen = set()
    for namespace in na.all_candidates(parsed):
        try:
            mine = process.inode(f"/proc/{process.own_pid()}/{namespace.slot}")
        except FileNotFoundError:  # the kernel lacks this namespace type
            continue
        except OSError:  # util-linux then compares against inode 0
            mine = 0
        if namespace.slot == "ns/user" and mine == target_inode(invocation, namespace.slot):
            continue
        chosen.add(namespace.slot)
    return frozenset(chosen)


def target_inode(invocation: Invocation, slot: str) -> int:
    path = f"/proc/{invocation.target_pid}/{slot}"
    try:
        return process.inode(path)
    except OSError as exc:
        raise NsenterError(f"stat of {path} failed: {exc.strerror}") from exc


def enter_namespaces(fds: dict[str, int]) -> None:
    """Two passes: everything but the user namespace with errors ignored, then the user
    namespace and whatever failed before, so raising and dropping privileges both work."""
    for first_pass in (True, False):
        skip = {"ns/user"} if first_pass else set()
        for namespace in na.NAMESPACES:
            fd = fds.get(namespace.slot)
            if fd is None or namespace.slot in skip:
                continue
            try:
                ns.setns(fd, namespace.flag)
            except OSError as exc:
                if first_pass:
                    continue
                msg = f"reassociate to namespace '{namespace.slot}' failed: {exc.strerror}"
                raise NsenterError(msg) from exc
            process.close(fds.pop(namespace.slot))


def change_root_and_cwd(fds: dict[str, int], wdns: str | None) -> None:
    root = fds.pop(na.ROOT, None)
    cwd = fds.pop(na.CWD, None)
    if root is not None and cwd is None and wdns is None:
        # chroot must not lose the directory we are in: come back to it by fd.
        with step("cannot open current working directory"):
            cwd = process.open_readonly(".")
    if root is not None:
        with step("change directory by root file descriptor failed"):
            process.fchdir(root)
        with step("chroot failed"):
            process.chroot_here()
        with step("cannot change directory to /"):
            process.chdir("/")
        process.close(root)
    if wdns is not None:
        with step("cannot open current working directory"):
            cwd = process.open_readonly(wdns)
    if cwd is not None:
        with step("change directory by working directory file descriptor failed"):
            process.fchdir(cwd)
        process.close(cwd)


@contextmanager
def step(message: str) -> Iterator[None]:
    """Word an OSError of the body the way util-linux's err() does."""
    try:
        yield
    except OSError as exc:
        raise NsenterError(f"{message}: {exc.strerror}") from exc


def drop_groups_early(creds: na.Credentials) -> bool:
    """Whether groups are already dropped (a user namespace may forbid it later)."""
    if not creds.drop_groups_early:
        return True
    try:
        process.drop_groups()
    except OSError:
        return False
    return True


def switch_ids(creds: na.Credentials, groups_dropped_early: bool) -> None:
    if creds.drop_groups:
        try:
            process.drop_groups()
        except OSError as exc:
            if not groups_dropped_early:
                raise NsenterError(f"setgroups failed: {exc.strerror}") from exc
    if creds.gid is not None:
        with step("setgid failed"):
            process.setgid(creds.gid)
    if creds.uid is not None:
        with step("setuid failed"):
            process.setuid(creds.uid)


def execute(program: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """exec the program (or the shell) with the caller's environment, as nsenter does: minus
    the LOCPATH the binary's launcher set for itself (bundle.child_environ)."""
    name = program[0] if program else env.get("SHELL", process.BOURNE_SHELL)
    child = bundle.child_environ(env)
    try:
        if program:
            process.exec_program(program, child)
        process.exec_shell(child)
    except OSError as exc:
        error = ExecNotFound if exc.errno == errno.ENOENT else ExecFailed
        raise error(f"failed to execute {name}: {exc.strerror}", errno=exc.errno) from exc
