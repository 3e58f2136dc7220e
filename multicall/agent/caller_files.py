"""The caller's files, opened by the caller: a node agent's worker asks the launcher for each
file a request needs (the kubeconfig, its token, CA and client files, the xtables lock, the
config's log_file and its rotation) with a FILE frame, and gets back a descriptor the
launcher opened with its own authority, or an errno, or a refusal (core/agent_protocol.py).

Why (issue 24, "hand over only what a request needs"): protocol version 1 handed the agent
the caller's root directory, so whoever answered on the socket could read any file the
caller could. Now the launcher opens only paths the request itself named (its stdin, its
environment, the files it already handed over: build/agent_client.c `agent_file_allowed`),
with flags of its own per operation, and never hands a directory. A refusal (or a launcher
that stops answering) hands the whole request back: the caller's one-shot run decides.

`AskedFiles` is a `Files` (effects/caller.py): the code that reads and writes those files is
the one-shot plugin's, with the same bounds and messages.
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass

from multicall.core import agent_protocol as proto
from multicall.effects.caller import FileStat
from multicall.errors import ServeElsewhere

ANSWER_TIMEOUT = 5.0  # the launcher answers at once; one that does not is gone or stuck
# The fallback reasons (metric labels: core/agent_metrics.py FALLBACK_REASONS).
REFUSED = "caller refused a file"
SILENT = "caller stopped answering files"


@dataclass(slots=True)
class AskedFiles:
    """Files of the process at the other end of `conn`, opened by it on request."""

    conn: socket.socket
    asked: int = 0

    def open_fd(self, path: str, flags: int, mode: int = 0o666) -> int:
        op = _operation(flags)
        answer, fd = self._ask(op, path)
        if fd is not None:
            return fd
        if op in (proto.FILE_READ, proto.FILE_READ_NOFOLLOW) and stat.S_ISDIR(answer.mode):
            # The launcher never hands a directory (a descriptor to resolve paths from):
            # the one-shot reader would refuse it as this, after opening it.
            from multicall.effects.inputs import NotRegularFile

            raise NotRegularFile(path, "a directory")
        raise ServeElsewhere(REFUSED)

    def lstat(self, path: str) -> FileStat:
        answer, _ = self._ask(proto.FILE_STAT, path)
        return FileStat(answer.mode, answer.dev, answer.ino)

    def rotate(self, path: str) -> None:
        self._ask(proto.FILE_ROTATE, path)

    def _ask(self, op: int, path: str) -> tuple[proto.FileAnswer, int | None]:
        """The caller's answer and descriptor; OSError as the caller's own call failed,
        ServeElsewhere when it refused or stopped answering."""
        if len(os.fsencode(path)) > proto.MAX_FILE_PATH or "\0" in path or not path:
            raise ServeElsewhere(REFUSED)
        self.asked += 1
        if self.asked > proto.MAX_FILE_OPS:
            raise ServeElsewhere(REFUSED)
        try:
            self.conn.settimeout(ANSWER_TIMEOUT)
            self.conn.sendall(proto.file_frame(op, path))
            data, fds = _receive(self.conn)
        except (OSError, proto.ProtocolError):
            raise ServeElsewhere(SILENT) from None
        try:
            answer = proto.parse_file_answer(data)
        except proto.ProtocolError:
            _close(fds)
            raise ServeElsewhere(SILENT) from None
        if answer.refused:
            _close(fds)
            raise ServeElsewhere(REFUSED)
        if len(fds) != int(answer.has_fd) or (fds and answer.errno):
            _close(fds)
            raise ServeElsewhere(SILENT)
        if answer.errno:
            raise OSError(answer.errno, os.strerror(answer.errno), path)
        return answer, fds[0] if fds else None


def _operation(flags: int) -> int:
    """The FILE operation that stands for an open(2) with `flags` by the code the worker runs
    (effects/inputs.py, effects/log.py, effects/firewall/locks.py); the caller chooses the
    actual flags itself."""
    access = flags & os.O_ACCMODE
    if flags & os.O_CREAT:
        if access == os.O_WRONLY and flags & os.O_APPEND and flags & os.O_NOFOLLOW:
            return proto.FILE_APPEND
        if access == os.O_RDONLY:
            return proto.FILE_LOCK
    elif access == os.O_RDONLY and not flags & os.O_PATH:
        return proto.FILE_READ_NOFOLLOW if flags & os.O_NOFOLLOW else proto.FILE_READ
    raise ServeElsewhere(REFUSED)


def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """One FILE_ANSWER and the descriptor that rides on its first byte."""
    data, fds, _flags, _addr = socket.recv_fds(
        conn, proto.FILE_ANSWER.size, 1, socket.MSG_CMSG_CLOEXEC
    )
    if not data:
        raise proto.ProtocolError("closed")
    while len(data) < proto.FILE_ANSWER.size:
        chunk = conn.recv(proto.FILE_ANSWER.size - len(data))
        if not chunk:
            _close(fds)
            raise proto.ProtocolError("closed")
        data += chunk
    return data, fds


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
