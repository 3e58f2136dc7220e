"""The node agent's wire protocol (docs/agent.md "Protocol"): requests, replies, bounds.

The client is the launcher (build/agent_client.c); this module is the agent's half and the
tests' client. Pure: bytes in, values out.

Request: a 48-byte header ("CBXAGNT2", the 16-char build hash, then u32 LE: descriptor flags,
argc, envc, strings length, stdin length, 0), the strings (argv, env "K=V", cwd; each
NUL-terminated), the stdin bytes. The descriptors named by the flags (the caller's netns,
CNI_NETNS, a netfilter netlink socket made inside it) ride on the header's bytes as
SCM_RIGHTS, in flag order. No root directory: version 1 handed the caller's "/" (issue 24
"hand over only what a request needs"); version 2's agent asks for each file instead.
Replies: frames of u32 type, u32 length, payload: ACCEPT (u32 milliseconds the agent gives the
request from its accept, its --request-timeout: the launcher bounds its wait by it, issue 24
#7; empty from agents before it), FALLBACK (reason, ASCII), RESULT (u32 exit code, u32 stdout
length, u32 stderr length, stdout, stderr), FILE (u32 operation, the path): the agent asks
the caller to open, stat or rotate one file, and the caller answers with FILE_ANSWER (fixed
size, its descriptor as SCM_RIGHTS) after checking that the request named that path
(docs/agent.md "Files the caller opens").
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from multicall.core.limits import NETWORK_CONFIG

MAGIC = b"CBXAGNT2"  # 2: no root descriptor, FILE frames instead (1 handed "/")
HEADER = struct.Struct("<8s16sIIIIII")
FRAME = struct.Struct("<II")
ACCEPT_BODY = struct.Struct("<I")  # the request's deadline in ms, from the accept
RESULT_HEAD = struct.Struct("<III")
HASH_LEN = 16
# The build id of an agent run from source (no launcher): no launcher's hash is ever this.
SOURCE_BUILD = "source-tree-----"

FRAME_ACCEPT = 1
FRAME_FALLBACK = 2
FRAME_RESULT = 3
FRAME_FILE = 4  # agent -> caller: one file operation (FILE_*), answered by FILE_ANSWER

# FILE operations. The caller opens with flags of its own choosing per operation, never the
# agent's: what the agent may get is a reader, an appender or a lock of a path the request
# named, or a stat, or the log's one rotation (PATH -> PATH.1).
FILE_READ = 1  # O_RDONLY|O_NONBLOCK|O_NOCTTY, following symlinks
FILE_READ_NOFOLLOW = 2  # the same with O_NOFOLLOW
FILE_APPEND = 3  # O_WRONLY|O_APPEND|O_CREAT|O_NOFOLLOW|O_NONBLOCK|O_NOCTTY, 0600: the log_file
FILE_LOCK = 4  # O_RDONLY|O_CREAT|O_NONBLOCK|O_NOCTTY, 0600: the xtables lock
FILE_STAT = 5  # lstat: mode, dev, ino (no descriptor)
FILE_ROTATE = 6  # rename(PATH, PATH.1)
FILE_OPS = frozenset(range(FILE_READ, FILE_ROTATE + 1))
FILE_HEAD = struct.Struct("<I")
# errno (0: done), st_mode, st_dev, st_ino, 1 when a descriptor rides on it, 1 when the
# caller refused (a path the request did not name, too many operations): then the agent
# hands the whole request back (FALLBACK) for the caller to run itself.
FILE_ANSWER = struct.Struct("<IIQQII")
MAX_FILE_PATH = 4096
MAX_FILE_OPS = 256  # per request; the launcher refuses the rest

# Descriptor flags, in the order the descriptors are sent (bit 1 was version 1's root).
FD_CALLER_NETNS = 2
FD_TARGET_NETNS = 4
FD_NETLINK = 8
FD_ORDER = (FD_CALLER_NETNS, FD_TARGET_NETNS, FD_NETLINK)

# Bounds (the launcher's are the same or smaller): a request larger than these is refused
# before it is read, a reply larger than MAX_OUTPUT is served by the one-shot path instead.
MAX_ARGS = 256
MAX_ENV = 4096
MAX_STRINGS = 256 << 10
MAX_STDIN = NETWORK_CONFIG  # the plugin's own bound on its stdin (run_plugin checks it too)
MAX_OUTPUT = 8 << 20


class ProtocolError(Exception):
    """A request that breaks the protocol or its bounds."""


@dataclass(frozen=True, slots=True)
class Header:
    """The fixed-size start of a request frame."""

    build: str
    flags: int
    argc: int
    envc: int
    strings_len: int
    stdin_len: int

    @property
    def nfds(self) -> int:
        return sum(1 for flag in FD_ORDER if self.flags & flag)

    @property
    def body_len(self) -> int:
        return self.strings_len + self.stdin_len


@dataclass(frozen=True, slots=True)
class Request:
    """One plugin invocation as the launcher sends it."""

    build: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    stdin: bytes
    fds: Mapping[int, int]  # flag -> descriptor

    @property
    def command(self) -> str:
        return self.env.get("CNI_COMMAND", "")


def parse_header(data: bytes) -> Header:
    if len(data) != HEADER.size:
        raise ProtocolError("short header")
    magic, build, flags, argc, envc, strings_len, stdin_len, reserved = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError("not a cnibox agent request of this version (bad magic)")
    if flags & ~sum(FD_ORDER) or reserved:
        raise ProtocolError("unknown flags")
    if argc < 1 or argc > MAX_ARGS or envc > MAX_ENV:
        raise ProtocolError("too many arguments or environment variables")
    if strings_len > MAX_STRINGS or stdin_len > MAX_STDIN:
        raise ProtocolError("request too large")
    return Header(build.decode("ascii", "replace"), flags, argc, envc, strings_len, stdin_len)


def parse_body(header: Header, body: bytes, fds: list[int]) -> Request:
    """The request; `fds` are the descriptors received with it (exactly header.nfds)."""
    if len(body) != header.body_len:
        raise ProtocolError("short body")
    if len(fds) != header.nfds:
        raise ProtocolError(f"expected {header.nfds} descriptors, got {len(fds)}")
    strings = body[: header.strings_len]
    if not strings.endswith(b"\0"):
        raise ProtocolError("strings not NUL-terminated")
    parts = [_decode(s) for s in strings[:-1].split(b"\0")]
    if len(parts) != header.argc + header.envc + 1:
        raise ProtocolError("string count does not match the header")
    argv = tuple(parts[: header.argc])
    env: dict[str, str] = {}
    for item in parts[header.argc : header.argc + header.envc]:
        key, sep, value = item.partition("=")
        if sep and key not in env:  # getenv() finds the first of duplicates
            env[key] = value
    flags = [flag for flag in FD_ORDER if header.flags & flag]
    return Request(
        header.build,
        argv,
        env,
        parts[-1],
        body[header.strings_len :],
        dict(zip(flags, fds, strict=True)),
    )


def decode_request(data: bytes, fds: list[int]) -> Request:
    """A whole request's bytes (header, strings, stdin) and its descriptors: the request."""
    return parse_body(parse_header(data[: HEADER.size]), data[HEADER.size :], fds)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def encode_request(  # noqa: PLR0917 - the wire fields, in wire order
    build: str,
    argv: tuple[str, ...] | list[str],
    env: Mapping[str, str],
    cwd: str,
    stdin: bytes,
    flags: int,
) -> bytes:
    """What the launcher sends (the tests' client uses it; descriptors go separately)."""
    strings = b"".join(_encode(s) + b"\0" for s in (*argv, *(f"{k}={v}" for k, v in env.items())))
    strings += _encode(cwd) + b"\0"
    head = HEADER.pack(
        MAGIC, build.encode("ascii"), flags, len(argv), len(env), len(strings), len(stdin), 0
    )
    return head + strings + stdin


def frame(kind: int, payload: bytes = b"") -> bytes:
    return FRAME.pack(kind, len(payload)) + payload


def accept_frame(timeout: float) -> bytes:
    """ACCEPT, telling the caller how long the agent gives its request (`timeout` seconds
    from the accept; the launcher waits that plus a margin, capped, then falls back)."""
    return frame(FRAME_ACCEPT, ACCEPT_BODY.pack(min(int(timeout * 1000), 0xFFFFFFFF)))


def fallback_frame(reason: str) -> bytes:
    return frame(FRAME_FALLBACK, reason.encode("ascii", "replace"))


def result_frame(code: int, stdout: bytes, stderr: bytes) -> bytes:
    return frame(FRAME_RESULT, RESULT_HEAD.pack(code, len(stdout), len(stderr)) + stdout + stderr)


@dataclass(frozen=True, slots=True)
class Reply:
    """The agent's answer: a result to print, or a reason to fall back."""

    kind: int
    reason: str = ""
    code: int = 0  # RESULT's exit code; ACCEPT's request deadline in ms (0: not told)
    stdout: bytes = b""
    stderr: bytes = b""


def parse_reply(kind: int, payload: bytes) -> Reply:
    if kind == FRAME_ACCEPT and len(payload) in {0, ACCEPT_BODY.size}:
        return Reply(kind, code=ACCEPT_BODY.unpack(payload)[0] if payload else 0)
    if kind == FRAME_FALLBACK:
        return Reply(kind, reason=payload.decode("ascii", "replace"))
    if kind == FRAME_RESULT and len(payload) >= RESULT_HEAD.size:
        code, out_len, err_len = RESULT_HEAD.unpack_from(payload)
        if RESULT_HEAD.size + out_len + err_len == len(payload):
            out = payload[RESULT_HEAD.size : RESULT_HEAD.size + out_len]
            return Reply(kind, code=code, stdout=out, stderr=payload[RESULT_HEAD.size + out_len :])
    raise ProtocolError(f"bad reply frame (type {kind}, {len(payload)} bytes)")


def file_frame(op: int, path: str) -> bytes:
    """FILE: the agent asks the caller for one operation on `path` (as the caller names it)."""
    return frame(FRAME_FILE, FILE_HEAD.pack(op) + _encode(path))


def parse_file_frame(payload: bytes) -> tuple[int, str]:
    """(operation, path) of a FILE frame's payload; ProtocolError when malformed."""
    if len(payload) <= FILE_HEAD.size or len(payload) > FILE_HEAD.size + MAX_FILE_PATH:
        raise ProtocolError("bad file request length")
    (op,) = FILE_HEAD.unpack_from(payload)
    raw = payload[FILE_HEAD.size :]
    if op not in FILE_OPS or b"\0" in raw:
        raise ProtocolError("bad file request")
    return op, _decode(raw)


@dataclass(frozen=True, slots=True)
class FileAnswer:
    """The caller's answer to a FILE frame (its descriptor, if any, travels beside it)."""

    errno: int = 0
    mode: int = 0
    dev: int = 0
    ino: int = 0
    has_fd: bool = False
    refused: bool = False


def encode_file_answer(answer: FileAnswer) -> bytes:
    return FILE_ANSWER.pack(
        answer.errno, answer.mode, answer.dev, answer.ino, int(answer.has_fd), int(answer.refused)
    )


def parse_file_answer(data: bytes) -> FileAnswer:
    if len(data) != FILE_ANSWER.size:
        raise ProtocolError("short file answer")
    err, mode, dev, ino, has_fd, refused = FILE_ANSWER.unpack(data)
    if has_fd not in (0, 1) or refused not in (0, 1) or (refused and has_fd):
        raise ProtocolError("bad file answer")
    return FileAnswer(err, mode, dev, ino, bool(has_fd), bool(refused))
