"""The installer's pid file: which process `install-cni --uninstall` may stop, and stopping
exactly that one.

Rules of this module:
1. The pid file lives in a directory only root can change (`fs.private_dir`: the installer's
   state dir by default), never in a shared /tmp: a pid file anyone can write lets anyone
   choose what gets SIGTERM.
2. It records the process identity, not just a pid: the pid, its start time (field 22 of
   /proc/PID/stat), its executable (/proc/PID/exe) and a SHA-256 of its command line. A pid
   reused by another process, or the same pid in a new container's pid namespace, does not
   match all four.
3. The signal goes through a pidfd opened *before* the identity is compared, so the process
   compared is the process signalled (no pid-reuse window between check and kill).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
from dataclasses import asdict, dataclass

from multicall.core.limits import PID_FILE
from multicall.effects import fs
from multicall.errors import ConfigError

LIMIT = PID_FILE  # core/limits.py


@dataclass(frozen=True, slots=True)
class Identity:
    """What tells a process apart from a later one with the same pid."""

    pid: int
    start: str
    exe: str
    cmdline: str  # SHA-256 of /proc/PID/cmdline


def identity(pid: int) -> Identity | None:
    """What /proc says about `pid` now; None when it is gone or cannot be read."""
    try:
        stat_line = fs.read_file(f"/proc/{pid}/stat", LIMIT)
        cmdline = fs.read_file(f"/proc/{pid}/cmdline", LIMIT)
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, ConfigError):
        return None
    if stat_line is None or cmdline is None:
        return None
    # Field 22 (starttime), counted after the ')' that closes comm (comm may hold spaces).
    fields = stat_line.rsplit(b")", 1)[-1].split()
    if len(fields) < 20:
        return None
    return Identity(pid, fields[19].decode(), exe, hashlib.sha256(cmdline).hexdigest())


def write(path: str) -> None:
    """Record this process in the pid file at `path` (its directory must be private)."""
    me = identity(os.getpid())
    if me is None:
        raise ConfigError("cannot read this process's own identity from /proc")
    fs.private_dir(os.path.dirname(path) or ".", create=True)
    fs.write_atomic(path, (json.dumps(asdict(me), sort_keys=True) + "\n").encode(), 0o600)


def recorded(path: str) -> Identity | None:
    """The identity in the pid file; None when there is none (or it is not ours to trust)."""
    if not fs.private_dir(os.path.dirname(path) or ".", create=False):
        return None
    data = fs.read_file(path, LIMIT, what="pid file", follow=False)
    if data is None:
        return None
    try:
        doc = json.loads(data)
        found = Identity(int(doc["pid"]), str(doc["start"]), str(doc["exe"]), str(doc["cmdline"]))
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return found if found.pid > 0 else None


def running(path: str) -> Identity | None:
    """The process the pid file names, if that very process still runs (and is not us)."""
    found = recorded(path)
    if found is None or found.pid == os.getpid() or identity(found.pid) != found:
        return None
    return found


def stop(path: str, wait: float) -> int | None:
    """SIGTERM the process the pid file names (rule 3) and wait up to `wait` seconds for it
    to exit; the pid signalled, or None when no matching process runs."""
    found = recorded(path)
    if found is None or found.pid == os.getpid():
        return None
    try:
        pidfd = os.pidfd_open(found.pid)
    except OSError:
        return None
    try:
        if identity(found.pid) != found:
            return None
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        select.select([pidfd], [], [], wait)
    except ProcessLookupError:
        pass
    finally:
        os.close(pidfd)
    return found.pid
