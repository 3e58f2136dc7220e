"""Process-level effects for running a program the way util-linux nsenter does: open files,
change root and directory, switch ids, fork-and-wait, and exec with glibc's execvp rules.

Rules of this module:
1. Failures are `OSError`s carrying errno; callers word them (nsenter's messages differ by
   step), so nothing here prints.
2. No host binaries and no /etc: program lookup walks $PATH itself (default "/bin:/usr/bin",
   as glibc), so it works in an empty root.
3. Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec;
   `restore_default_signals` must run before forking or exec'ing someone else's program.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Mapping, Sequence
from typing import NoReturn

DEFAULT_PATH = "/bin:/usr/bin"  # glibc's _CS_PATH, used when PATH is unset
BOURNE_SHELL = "/bin/sh"
# errno values after which glibc's execvp keeps searching $PATH.
_TRY_NEXT = frozenset({errno.ENOENT, errno.ESTALE, errno.ENOTDIR, errno.ENODEV, errno.ETIMEDOUT})


def look_path(name: str, env: Mapping[str, str]) -> str:
    """Go's exec.LookPath as `exec.Command(name).String()` shows it: the first executable
    `name` in $PATH when that is an absolute path, else `name` unchanged (not found, or
    found relative to the working directory, which Go refuses with ErrDot)."""
    import shutil

    found = shutil.which(name, path=env.get("PATH", ""))
    return found if found is not None and os.path.isabs(found) else name


def open_readonly(path: str) -> int:
    # Non-blocking: a FIFO given as a namespace, root or directory must not hang the open
    # (util-linux waits forever there); setns or fchdir then refuses it with its errno.
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)


def close(fd: int) -> None:
    os.close(fd)


def inode(path: str) -> int:
    return os.stat(path).st_ino


def own_pid() -> int:
    return os.getpid()


def fchdir(fd: int) -> None:
    os.fchdir(fd)


def chroot_here() -> None:
    """chroot(".") after fchdir to the new root, as util-linux does with the root fd."""
    os.chroot(".")


def chdir(path: str) -> None:
    os.chdir(path)


def drop_groups() -> None:
    """setgroups(0, NULL)."""
    os.setgroups([])


def setgid(gid: int) -> None:
    os.setgid(gid)


def setuid(uid: int) -> None:
    os.setuid(uid)


def selinux_enabled() -> bool:
    return os.path.exists("/sys/fs/selinux/enforce")


def restore_default_signals() -> None:
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)


def continue_as_child() -> int | None:
    """Fork. The child gets None and carries on; the parent waits and returns the child's
    exit status, or dies by the signal that killed the child (util-linux's
    continue_as_child, including stop/continue forwarding)."""
    child = os.fork()
    if child == 0:
        return None
    while True:
        _, status = os.waitpid(child, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            break
        os.kill(os.getpid(), signal.SIGSTOP)
        os.kill(child, signal.SIGCONT)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    if os.WIFSIGNALED(status):
        die_by_signal(os.WTERMSIG(status))
    return 1


def die_by_signal(sig: int) -> None:
    """Re-raise a child's terminating signal on ourselves; returns only if it did not kill."""
    # SIGKILL and SIGSTOP cannot be reset, and need not be.
    with contextlib.suppress(OSError, ValueError):
        signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)


def exec_program(argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """glibc execvpe(): a name with '/' runs as is, else each $PATH entry is tried; EACCES
    from any entry wins over a final ENOENT; a file without #! runs under /bin/sh."""
    file = argv[0]
    if not file:
        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), file)
    if "/" in file:
        _execve(file, argv, env)
    got_eacces = False
    last: OSError | None = None
    for directory in env.get("PATH", DEFAULT_PATH).split(":"):
        candidate = f"{directory}/{file}" if directory else file
        try:
            _execve(candidate, argv, env)
        except OSError as exc:
            if exc.errno == errno.EACCES:
                got_eacces = True
            elif exc.errno not in _TRY_NEXT:
                raise
            last = exc
    if got_eacces:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), file)
    assert last is not None  # split() yields at least one entry
    raise last


def exec_shell(env: Mapping[str, str]) -> NoReturn:
    """util-linux exec_shell(): $SHELL (no $PATH search) or /bin/sh, as a login shell."""
    shell = env.get("SHELL", BOURNE_SHELL)
    argv0 = "-" + shell.rsplit("/", 1)[-1]
    _execve(shell, [argv0], env, script_fallback=False)


def _execve(
    path: str, argv: Sequence[str], env: Mapping[str, str], *, script_fallback: bool = True
) -> NoReturn:
    args = list(argv)
    try:
        os.execve(path, args, dict(env))  # noqa: S606 - replacing ourselves is the point
    except OSError as exc:
        if exc.errno != errno.ENOEXEC or not script_fallback:
            raise
    # glibc runs a file the kernel cannot (no #! line) as a /bin/sh script.
    os.execve(BOURNE_SHELL, [BOURNE_SHELL, path, *args[1:]], dict(env))  # noqa: S606 - as glibc
