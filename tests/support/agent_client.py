"""A Python client of the node agent that does what the launcher's (build/agent_client.c)
does: the tests' second implementation of the protocol, for the cases the launcher never
produces (another build, a malformed request, a client that is not root, a client killed
mid-request) and for driving an agent run from source. It answers the agent's FILE frames
under the launcher's rule (`file_allowed`: only paths the request named).

    python -m tests.support.agent_client SOCKET   (CNI_* env, config on stdin; prints the reply)
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from multicall.core import agent_protocol as proto

NSFS_MAGIC = 0x6E736673


LOCK_PATH = b"/run/xtables.lock"  # iptables' default lock: a path no request names
MAX_GRANTED = 8  # files whose content names more paths (the launcher's AGENT_MAX_GRANTED)
MAX_GRANTED_BYTES = 1 << 20
READS = (proto.FILE_READ, proto.FILE_READ_NOFOLLOW)


@dataclass
class Call:
    sock: socket.socket
    fds: list[int]
    named: list[bytes] = field(default_factory=list)  # stdin, env strings, the lock path
    granted: list[tuple[bytes, bytes]] = field(default_factory=list)  # (path, content) read
    asked: int = 0

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        self.sock.close()


def file_allowed(path: bytes, named: list[bytes], granted: list[tuple[bytes, bytes]]) -> bool:
    """The launcher's rule (agent_client.c `agent_file_allowed`): a path the request named
    (in its stdin, its environment, iptables' default lock path, or a file already handed
    over, such as the kubeconfig naming its token and CA), or one relative to the directory
    of a file already handed over that names the rest (client-go's relative paths)."""
    if not path:
        return False
    if any(path in text for text in named):
        return True
    for handed, content in granted:
        directory = handed[: handed.rfind(b"/") + 1]
        if path in content:
            return True
        if directory and path.startswith(directory) and path[len(directory) :] in content:
            return True
    return False


def answer_file(call: Call, payload: bytes) -> None:
    """Do what the launcher does with one FILE frame: check, open with its own flags,
    answer (a descriptor beside the answer, never a directory)."""
    op, text = proto.parse_file_frame(payload)
    path = os.fsencode(text)
    call.asked += 1
    if call.asked > proto.MAX_FILE_OPS or not file_allowed(path, call.named, call.granted):
        call.sock.sendall(proto.encode_file_answer(proto.FileAnswer(refused=True)))
        return
    common = os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    flags = {
        proto.FILE_READ: os.O_RDONLY | common,
        proto.FILE_READ_NOFOLLOW: os.O_RDONLY | os.O_NOFOLLOW | common,
        proto.FILE_APPEND: os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | common,
        proto.FILE_LOCK: os.O_RDONLY | os.O_CREAT | common,
    }
    fd = -1
    try:
        if op == proto.FILE_STAT:
            st = os.lstat(path)
            answer = proto.FileAnswer(mode=st.st_mode, dev=st.st_dev, ino=st.st_ino)
        elif op == proto.FILE_ROTATE:
            os.rename(path, path + b".1")
            answer = proto.FileAnswer()
        else:
            fd = os.open(path, flags[op], 0o600)
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                os.close(fd)
                fd = -1
            elif op in READS and stat.S_ISREG(st.st_mode) and len(call.granted) < MAX_GRANTED:
                call.granted.append((path, os.pread(fd, MAX_GRANTED_BYTES, 0)))
            answer = proto.FileAnswer(mode=st.st_mode, dev=st.st_dev, ino=st.st_ino,
                                      has_fd=fd >= 0)  # fmt: skip
    except OSError as exc:
        answer = proto.FileAnswer(errno=exc.errno or 5)
    try:
        socket.send_fds(call.sock, [proto.encode_file_answer(answer)], [fd] if fd >= 0 else [])
    finally:
        if fd >= 0:
            os.close(fd)


def caller_fds(env: Mapping[str, str], *, netlink: bool = True) -> tuple[int, list[int]]:
    """The descriptors the launcher would send for this environment: (flags, fds)."""
    flags, fds = 0, []
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    flags, fds = proto.FD_CALLER_NETNS, [home]
    netns = env.get("CNI_NETNS", "")
    if netns:
        target = os.open(netns, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        flags |= proto.FD_TARGET_NETNS
        fds.append(target)
        if netlink and env.get("CNI_COMMAND") in ("ADD", "CHECK"):
            from multicall.effects.ns import CLONE_NEWNET, setns

            try:
                setns(target, CLONE_NEWNET)
            except PermissionError:  # as the launcher: no socket, the agent decides
                return flags, fds
            try:
                nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 12)
            finally:
                setns(home, CLONE_NEWNET)
            flags |= proto.FD_NETLINK
            fds.append(nl.detach())
    return flags, fds


def start(
    path: str,
    env: Mapping[str, str],
    stdin: bytes,
    *,
    build: str,
    argv: tuple[str, ...] = ("linkerd-cni",),
    netlink: bool = True,
) -> Call:
    """Connect and send a request; the caller reads the replies with `replies`."""
    flags, fds = caller_fds(env, netlink=netlink)
    data = proto.encode_request(build, argv, env, os.getcwd(), stdin, flags)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(30)
        sock.connect(path)
        socket.send_fds(sock, [data[: proto.HEADER.size]], fds)
        sock.sendall(data[proto.HEADER.size :])
    except OSError:  # refused or dropped while sending: nothing of this call stays open
        Call(sock, fds).close()
        raise
    named = [stdin, LOCK_PATH, *(os.fsencode(f"{k}={v}") for k, v in env.items())]
    return Call(sock, fds, named)


def read_reply(sock: socket.socket, call: Call | None = None) -> proto.Reply | None:
    """The next reply, or None at EOF (the agent closed without a complete frame). FILE
    frames on the way are answered for `call` (refused without one: a request made by
    hand names no file)."""
    while True:
        head = _exactly(sock, proto.FRAME.size)
        if head is None:
            return None
        kind, length = proto.FRAME.unpack(head)
        payload = _exactly(sock, length) if length else b""
        if payload is None:
            return None
        if kind != proto.FRAME_FILE:
            return proto.parse_reply(kind, payload)
        answer_file(call or Call(sock, []), payload)


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def call(path: str, env: Mapping[str, str], stdin: bytes, *, build: str) -> list[proto.Reply]:
    """Every frame of one request until the result, a fallback or EOF."""
    c = start(path, env, stdin, build=build)
    frames = []
    try:
        while (reply := read_reply(c.sock, c)) is not None:
            frames.append(reply)
            if reply.kind != proto.FRAME_ACCEPT:
                break
    finally:
        c.close()
    return frames


def main() -> int:
    build = os.environ.get("CNIBOX_TEST_BUILD", proto.SOURCE_BUILD)
    try:
        frames = call(sys.argv[1], dict(os.environ), sys.stdin.buffer.read(), build=build)
    except OSError as exc:  # refused: closed before or while the request was sent
        print(f"no result: {exc}", file=sys.stderr)
        return 98
    for reply in frames:
        if reply.kind == proto.FRAME_RESULT:
            sys.stderr.buffer.write(reply.stderr)
            sys.stdout.buffer.write(reply.stdout)
            return reply.code
        if reply.kind == proto.FRAME_FALLBACK:
            print(f"fallback: {reply.reason}", file=sys.stderr)
            return 99
    print("no result", file=sys.stderr)
    return 98


if __name__ == "__main__":
    sys.exit(main())
