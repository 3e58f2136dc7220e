"""The locks the legacy backend holds from reading a nat table to committing the change planned
from it: the xtables lock that iptables takes, and a lock on the pod's network namespace.

Rules of this module:
1. The xtables lock is iptables 1.8's (xshared.c `xtables_lock`): an exclusive flock(2) on
   the file `$XTABLES_LOCKFILE` names, else `/run/xtables.lock`, opened with O_CREAT and
   mode 0600. Holding it keeps iptables-legacy, kube-proxy and every other polite x_tables
   writer out while cnibox reads, plans and commits, so a commit never overwrites a change it
   did not plan from.
2. `use-wait-flag: true` is upstream's `-w` (wait for the lock); false is iptables without
   `-w`: fail at once, with iptables' message, when another program holds it (iptables 1.8.9
   alone waits forever without `-w`, a bug fixed in 1.8.10). Unlike `-w`, cnibox's wait is
   bounded: `WAIT_LIMIT` seconds (Istio's `--wait=30`), then the ADD fails and changed nothing.
3. The netns lock is an flock on the pod's network namespace (nsfs) file, always waited for
   (bounded by the same limit) and taken first: two cnibox ADDs for one pod line up behind
   each other instead of failing each other, with or without the wait flag. It is the same
   lock Istio's CNI uses as its pod-scoped xtables lock (`XTABLES_LOCKFILE=<netns path>`).
   Only then is the host-wide xtables lock taken, so cnibox holds it for one commit's time.
4. The lock file is a path in the caller's mount namespace (the host's /run for the plugin the
   runtime execs). A node agent's worker has the caller open it (`XtablesLock(files=
   AskedFiles(...))`, agent/caller_files.py) with the caller's `XTABLES_LOCKFILE`
   (`XtablesLock(env=...)`),
   so it takes exactly the lock the one-shot plugin in its place would take, whatever the
   agent's own filesystem is (docs/agent.md "Privileges"). `XtablesLock(path=...)` injects
   another path: the repair controller, which runs in a pod, passes the host's lock as that
   pod sees it (`/host/run/xtables.lock`), or it would lock a private file that nobody else
   uses (docs/hardening.md §5).
   When the lock file's directory does not exist in this mount namespace, no program here can
   take the lock either (iptables itself would fail to start); cnibox says so in the log and
   goes on with the netns lock alone.
5. Waits poll with LOCK_NB every 10 ms to 100 ms: no SIGALRM as iptables uses, because the
   agent takes the locks on its worker threads. Every acquisition opens its own file
   description, so threads of one process exclude each other as separate processes do.
6. Opening never blocks (O_NONBLOCK, in case of a FIFO at the path) and only a regular file
   is accepted as the lock file; the fds are close-on-exec.
"""

from __future__ import annotations

import errno as errno_mod
import fcntl
import os
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from multicall.core.logs import MessageLog, quiet
from multicall.effects.caller import OWN_FILES, Files, exists
from multicall.effects.ns import OWN_NETNS
from multicall.errors import FirewallError

XT_LOCK_NAME = "/run/xtables.lock"
LOCKFILE_ENV = "XTABLES_LOCKFILE"
WAIT_LIMIT = 30.0
_POLL_FIRST, _POLL_MAX = 0.01, 0.1


@dataclass(frozen=True, slots=True)
class XtablesLock:
    """Where the xtables lock is and how long to wait for it (rules 1, 2, 4).

    `path` None: `$XTABLES_LOCKFILE` of `env` (the process environment when None) as iptables
    reads it, else /run/xtables.lock.
    """

    path: str | None = None
    wait_limit: float = WAIT_LIMIT
    env: Mapping[str, str] | None = None
    files: Files = OWN_FILES  # whose filesystem `path` is in (rule 4)

    def lock_path(self) -> str:
        if self.path:
            return self.path
        env = os.environ if self.env is None else self.env
        return env.get(LOCKFILE_ENV) or XT_LOCK_NAME


@contextmanager
def legacy_locks(lock: XtablesLock, *, wait: bool, log: MessageLog = quiet) -> Iterator[None]:
    """The netns lock of the netns the calling thread is in, then the xtables lock (rule 3)."""
    with netns_lock(lock.wait_limit), xtables_lock(lock, wait=wait, log=log):
        yield


@contextmanager
def netns_lock(wait_limit: float = WAIT_LIMIT) -> Iterator[None]:
    """An exclusive flock on the calling thread's current network namespace (rule 3)."""
    try:
        fd = os.open(OWN_NETNS, os.O_RDONLY | os.O_CLOEXEC)  # a new open file description
    except OSError as exc:
        raise FirewallError(
            f"cannot lock this pod's network namespace: {exc.strerror}", errno=exc.errno
        ) from exc
    try:
        if not _flock(fd, wait_limit):
            raise FirewallError(
                "another program is still changing this pod's rules (it holds the lock on "
                f"its network namespace); stopped waiting after {wait_limit:g}s"
            )
        yield
    finally:
        os.close(fd)


@contextmanager
def xtables_lock(lock: XtablesLock, *, wait: bool, log: MessageLog = quiet) -> Iterator[None]:
    """iptables' xtables lock (rules 1, 2, 4); FirewallError with iptables' texts."""
    path = lock.lock_path()
    fd = _open_lock_file(path, lock.files, log)
    if fd is None:
        yield
        return
    try:
        if not _flock(fd, lock.wait_limit if wait else 0.0):
            reason = (
                f"Stopped waiting after {lock.wait_limit:g}s."
                if wait
                else "Perhaps you want to use the -w option?"
            )
            raise FirewallError(
                f"Another app is currently holding the xtables lock. {reason}",
                details=f"Can't lock {path}: {os.strerror(errno_mod.EAGAIN)}",
                hint="set use-wait-flag: true to wait for it" if not wait else None,
            )
        yield
    finally:
        os.close(fd)


def _open_lock_file(path: str, files: Files, log: MessageLog) -> int | None:
    flags = os.O_RDONLY | os.O_CREAT | os.O_NONBLOCK
    try:
        fd = files.open_fd(path, flags, 0o600)
    except OSError as exc:
        directory = os.path.dirname(path) or "."
        if exc.errno == errno_mod.ENOENT and not exists(files, directory):
            log(f"no {directory} in this mount namespace: nobody here can hold the xtables lock")
            return None
        raise FirewallError(
            f"Fatal: can't open lock file {path}: {exc.strerror}", path=path, errno=exc.errno
        ) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FirewallError(f"Fatal: the lock file {path} is not a regular file", path=path)
    return fd


def _flock(fd: int, wait_limit: float) -> bool:
    """LOCK_EX on `fd` within `wait_limit` seconds (0: one try); False when it stayed busy."""
    deadline = time.monotonic() + wait_limit
    pause = _POLL_FIRST
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX)
        except OSError as exc:  # ENOLCK and the like: say so, never the exception
            raise FirewallError(f"cannot take a lock: {exc.strerror}", errno=exc.errno) from exc
