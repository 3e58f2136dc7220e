"""A Python client of the node agent that does what the launcher's (build/agent_client.c)
does: the tests' second implementation of the protocol, for the cases the launcher never
produces (another build, a malformed request, a client that is not root, a client killed
mid-request) and for driving an agent run from source.

    python -m tests.support.agent_client SOCKET   (CNI_* env, config on stdin; prints the reply)
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from multicall.core import agent_protocol as proto

NSFS_MAGIC = 0x6E736673


@dataclass
class Call:
    sock: socket.socket
    fds: list[int]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.sock.close()


def caller_fds(env: Mapping[str, str], *, netlink: bool = True) -> tuple[int, list[int]]:
    """The descriptors the launcher would send for this environment: (flags, fds)."""
    flags, fds = 0, []
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    flags, fds = proto.FD_ROOT | proto.FD_CALLER_NETNS, [root, home]
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
    return Call(sock, fds)


def read_reply(sock: socket.socket) -> proto.Reply | None:
    """The next frame, or None at EOF (the agent closed without a complete frame)."""
    head = _exactly(sock, proto.FRAME.size)
    if head is None:
        return None
    kind, length = proto.FRAME.unpack(head)
    payload = _exactly(sock, length) if length else b""
    if payload is None:
        return None
    return proto.parse_reply(kind, payload)


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
        while (reply := read_reply(c.sock)) is not None:
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
