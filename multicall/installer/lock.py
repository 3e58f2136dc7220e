"""One installer at a time per host: an exclusive flock(2) on `install-cni.lock` in the
state dir, held from before the first read of the journal until the process exits.

Two installers at once (a DaemonSet rollout where the new pod starts before the old one
has undone) would each patch, journal and undo over the other's changes, leaving configs
converted or re-serialised after both stop. With the lock the second one waits, bounded
(`WAIT_SECONDS`), and then exits 1 naming the lock file, having changed nothing.

A killed holder's lock goes with its file description, so no stale lock outlives it. The
lock file is removed (by its holder, while still holding it) together with the state dir
once nothing else is left in it; a waiter that then gets the lock on the removed file sees
that the path no longer names its file and opens the path again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from multicall.effects import fs
from multicall.effects.log import Logger
from multicall.errors import CniboxError

LOCK_NAME = "install-cni.lock"
WAIT_SECONDS = 60.0  # a rollout's old pod undoes within its grace period (30 s by default)
_POLL_FIRST, _POLL_MAX = 0.01, 0.25


@contextlib.contextmanager
def host_lock(
    state_dir: str, log: Logger, wait: float | None = None, *, create_parents: bool = True
) -> Iterator[None]:
    """Hold the installer's lock in `state_dir` (created, private) for the block. Without
    `create_parents` (`--uninstall`), a state dir whose parent does not exist means there is
    nothing to undo nor anybody to exclude, and no directory is created for the lock."""
    if not create_parents and not os.path.isdir(os.path.dirname(state_dir.rstrip("/")) or "/"):
        yield
        return
    path = os.path.join(state_dir, LOCK_NAME)
    fd = _acquire(state_dir, path, log, WAIT_SECONDS if wait is None else wait)
    try:
        yield
    finally:
        _release(state_dir, path, fd)


def _acquire(state_dir: str, path: str, log: Logger, wait: float) -> int:
    deadline = time.monotonic() + wait
    pause = _POLL_FIRST
    told = False
    while True:
        fs.private_dir(state_dir, create=True)
        # Read-only: flock needs no write access, and a file held open for writing would
        # keep net.d's mount from being remounted read-only.
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            left = deadline - time.monotonic()
            if left <= 0:
                raise CniboxError(
                    f"another install-cni holds {path}; stopped waiting after "
                    f"{wait:g}s and changed nothing",
                    hint="run one installer per node: wait for the other one to stop (its "
                    "undo ends a DaemonSet rollout overlap) and start this one again",
                ) from None
            if not told:
                log.info(f"another install-cni holds {path}: waiting up to {wait:g}s")
                told = True
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX)
            continue
        if _same_file(fd, path):
            return fd
        os.close(fd)  # its holder removed it after we opened it: lock the new one


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _release(state_dir: str, path: str, fd: int) -> None:
    """Remove the lock file and the state dir when nothing else is in it, then unlock."""
    try:
        with contextlib.suppress(OSError):
            if os.listdir(state_dir) == [LOCK_NAME]:
                os.unlink(path)
                os.rmdir(state_dir)
    finally:
        os.close(fd)
