"""The node agent's wire format (multicall/core/agent_protocol.py), its metrics exposition
and its flags: pure functions, no agent running."""

from __future__ import annotations

import pytest

from multicall.applets.linkerd_cni_agent import parse_args
from multicall.core import agent_metrics
from multicall.core import agent_protocol as proto
from multicall.errors import UsageError
from tests.support import REPO

BUILD = "0123456789abcdef"


def roundtrip(data: bytes, fds: list[int]) -> proto.Request:
    header = proto.parse_header(data[: proto.HEADER.size])
    return proto.parse_body(header, data[proto.HEADER.size :], fds)


def test_request_roundtrip() -> None:
    env = {"CNI_COMMAND": "ADD", "CNI_NETNS": "/var/run/netns/x", "EMPTY": ""}
    flags = proto.FD_CALLER_NETNS | proto.FD_TARGET_NETNS | proto.FD_NETLINK
    data = proto.encode_request(BUILD, ("linkerd-cni",), env, "/root", b'{"a": 1}\n', flags)
    req = roundtrip(data, [7, 8, 9])
    assert req.build == BUILD
    assert req.argv == ("linkerd-cni",)
    assert dict(req.env) == env
    assert req.cwd == "/root"
    assert req.stdin == b'{"a": 1}\n'
    assert dict(req.fds) == {
        proto.FD_CALLER_NETNS: 7,
        proto.FD_TARGET_NETNS: 8,
        proto.FD_NETLINK: 9,
    }
    assert req.command == "ADD"


def test_the_first_of_duplicate_variables_wins_as_getenv() -> None:
    header = proto.HEADER.pack(proto.MAGIC, BUILD.encode(), 0, 1, 2, 0, 0, 0)
    strings = b"linkerd-cni\0CNI_COMMAND=ADD\0CNI_COMMAND=DEL\0/\0"
    header = proto.HEADER.pack(proto.MAGIC, BUILD.encode(), 0, 1, 2, len(strings), 0, 0)
    assert roundtrip(header + strings, []).command == "ADD"


def test_non_utf8_survives() -> None:
    data = proto.encode_request(BUILD, ("linkerd-cni",), {"X": "\udcff"}, "/", b"", 0)
    assert roundtrip(data, []).env["X"] == "\udcff"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"magic": b"CBXAGNT0"}, "bad magic"),
        ({"flags": 16}, "unknown flags"),
        ({"argc": 0}, "too many"),
        ({"argc": proto.MAX_ARGS + 1}, "too many"),
        ({"envc": proto.MAX_ENV + 1}, "too many"),
        ({"strings": proto.MAX_STRINGS + 1}, "too large"),
        ({"stdin": proto.MAX_STDIN + 1}, "too large"),
        ({"reserved": 1}, "unknown flags"),
    ],
)
def test_header_bounds(fields: dict[str, object], message: str) -> None:
    values: dict[str, object] = {
        "magic": proto.MAGIC,
        "flags": 0,
        "argc": 1,
        "envc": 0,
        "strings": 2,
        "stdin": 0,
        "reserved": 0,
        **fields,
    }
    raw = proto.HEADER.pack(
        values["magic"],
        BUILD.encode(),
        values["flags"],
        values["argc"],
        values["envc"],
        values["strings"],
        values["stdin"],
        values["reserved"],
    )
    with pytest.raises(proto.ProtocolError, match=message):
        proto.parse_header(raw)


def test_body_must_match_its_header() -> None:
    data = proto.encode_request(BUILD, ("a", "b"), {"K": "V"}, "/", b"in", proto.FD_CALLER_NETNS)
    header = proto.parse_header(data[: proto.HEADER.size])
    body = data[proto.HEADER.size :]
    with pytest.raises(proto.ProtocolError, match="descriptors"):
        proto.parse_body(header, body, [])
    with pytest.raises(proto.ProtocolError, match="short body"):
        proto.parse_body(header, body[:-1], [3])
    bad = bytearray(body)
    bad[5] = 0  # "K=V" becomes "K", "V": one string too many
    with pytest.raises(proto.ProtocolError, match="string count"):
        proto.parse_body(header, bytes(bad), [3])


def test_replies() -> None:
    frame = proto.result_frame(1, b"out", b"err\n")
    kind, length = proto.FRAME.unpack(frame[: proto.FRAME.size])
    reply = proto.parse_reply(kind, frame[proto.FRAME.size :])
    assert (reply.code, reply.stdout, reply.stderr) == (1, b"out", b"err\n")
    assert length == len(frame) - proto.FRAME.size
    assert proto.parse_reply(proto.FRAME_FALLBACK, b"other build").reason == "other build"
    accept = proto.accept_frame(60.0)
    assert accept == proto.FRAME.pack(proto.FRAME_ACCEPT, 4) + (60000).to_bytes(4, "little")
    assert proto.parse_reply(proto.FRAME_ACCEPT, accept[proto.FRAME.size :]).code == 60000
    assert proto.parse_reply(proto.FRAME_ACCEPT, b"").code == 0  # an agent before issue 24 #7
    with pytest.raises(proto.ProtocolError):
        proto.parse_reply(proto.FRAME_ACCEPT, b"\0\0")
    with pytest.raises(proto.ProtocolError):
        proto.parse_reply(proto.FRAME_RESULT, proto.RESULT_HEAD.pack(0, 5, 0) + b"abc")


def test_metrics_exposition() -> None:
    m = agent_metrics.Metrics()
    m.served("ADD", "ok", "", 0.004)
    m.served("ADD", "error", "999", 0.2)
    m.fell_back("other build")
    m.refused["not root"] += 1
    text = agent_metrics.render(m, BUILD)
    assert 'cnibox_agent_requests_total{command="ADD",result="ok",cni_code=""} 1\n' in text
    assert 'cnibox_agent_requests_total{command="ADD",result="error",cni_code="999"} 1\n' in text
    assert 'cnibox_agent_request_duration_seconds_bucket{command="ADD",le="0.005"} 1\n' in text
    assert 'cnibox_agent_request_duration_seconds_bucket{command="ADD",le="0.25"} 2\n' in text
    assert 'cnibox_agent_request_duration_seconds_bucket{command="ADD",le="+Inf"} 2\n' in text
    assert 'cnibox_agent_request_duration_seconds_count{command="ADD"} 2\n' in text
    assert 'cnibox_agent_fallbacks_total{reason="other build"} 1\n' in text
    assert 'cnibox_agent_refused_total{reason="not root"} 1\n' in text
    assert f'cnibox_agent_info{{build="{BUILD}"}} 1\n' in text
    for line in text.splitlines():  # every family is declared before its samples
        if line.startswith("# TYPE"):
            assert line.split()[3] in ("counter", "gauge", "histogram")


def test_label_values_are_escaped() -> None:
    text = agent_metrics.render(agent_metrics.Metrics(), 'a "quoted"\nbuild\\')
    assert 'cnibox_agent_info{build="a \\"quoted\\"\\nbuild\\\\"} 1\n' in text


def test_caller_commands_are_labels_from_a_fixed_set() -> None:
    """Issue 24 #6: 50 CNI_COMMANDs of 100 KB made /metrics 96 MB (each one a label value of
    every family and histogram bucket). Now they count under `other`, and the exposition
    stays the size of a handful of series."""
    m = agent_metrics.Metrics()
    for i in range(50):
        m.served(f"{i:02d}" + "X" * 100_000, "ok", "", 0.01)
        m.served(f"{i:02d}" + "Y" * 100_000, "error", "7" * 100_000, 0.01)
        m.fell_back(f"{i:02d}" + "Z" * 100_000)
    m.served("ADD", "ok", "", 0.004)
    m.served("", "ok", "", 0.004)
    text = agent_metrics.render(m, BUILD)
    assert len(text.encode()) < 16 * 1024, len(text)
    assert 'cnibox_agent_requests_total{command="other",result="ok",cni_code=""} 51\n' in text
    assert 'cnibox_agent_requests_total{command="other",result="error",cni_code="other"} 50\n' in (
        text
    )
    assert 'cnibox_agent_request_duration_seconds_count{command="other"} 101\n' in text
    assert 'cnibox_agent_requests_total{command="ADD",result="ok",cni_code=""} 1\n' in text
    assert 'cnibox_agent_fallbacks_total{reason="other"} 50\n' in text


@pytest.mark.parametrize(
    ("reported", "label"),
    [
        ("bad request: short body", "bad request"),
        ("cannot enter the caller's netns: Operation not permitted", "cannot enter the caller's netns"),  # noqa: E501
        ("deadline", "deadline"),
        ("x_tables extensions of the other family loaded", "x_tables extensions of the other family loaded"),  # noqa: E501
        ("nonsense: deadline", "other"),
        ("", "other"),
    ],
)  # fmt: skip
def test_fallback_reasons_are_labels_from_a_fixed_set(reported: str, label: str) -> None:
    m = agent_metrics.Metrics()
    m.fell_back(reported)
    assert dict(m.fallbacks) == {label: 1}


@pytest.mark.parametrize(
    ("code", "label"), [("", ""), ("7", "7"), ("999", "999"), ("1000", "other"), ("٣", "other")]
)
def test_cni_codes_are_labels_from_a_bounded_set(code: str, label: str) -> None:
    m = agent_metrics.Metrics()
    m.served("DEL", "error", code, 0.1)
    assert list(m.requests) == [("DEL", "error", label)]


def _reasons_in_source() -> set[str]:
    """The fallback reasons the code can report: string constants (an f-string's text up to
    its first colon) given to fell_back, Fallback, ServeElsewhere and kill, or under a
    report's "fallback" key, anywhere in multicall/."""
    import ast

    from multicall.effects.firewall.legacy.isolation import OTHER_FAMILY

    def constants(node: ast.AST) -> set[str]:
        found = set()
        for sub in ast.walk(node):  # (an f-string's text parts are Constants too)
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                found.add(sub.value.split(":")[0])
            elif isinstance(sub, ast.Name) and sub.id == "OTHER_FAMILY":
                found.add(OTHER_FAMILY)
        return found

    reasons: set[str] = set()
    for path in (REPO / "multicall").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in ("fell_back", "Fallback", "ServeElsewhere") and node.args:
                    reasons |= constants(node.args[0])
                elif name == "kill" and len(node.args) == 2:
                    reasons |= constants(node.args[1])
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "fallback":
                        reasons |= constants(value)
    return reasons


def test_every_fallback_reason_in_the_source_has_its_label() -> None:
    reasons = _reasons_in_source()
    assert {"other build", "bad request", "overloaded", "deadline"} <= reasons  # the walk works
    assert reasons <= agent_metrics.FALLBACK_REASONS


def test_flags() -> None:
    opts = parse_args(["--socket", "/s", "--admin-addr=", "--log-level", "warn"])
    assert (opts["socket"], opts["admin-addr"], opts["log-level"]) == ("/s", "", "warning")
    assert parse_args(["--sock=/t", "--workers", "2"])["socket"] == "/t"  # getopt's prefixes
    defaults = parse_args([])
    assert defaults["socket"] == "/var/run/linkerd-cni/agent.sock"
    assert defaults["admin-addr"] == "127.0.0.1:9991"  # loopback (issue 24 #5)
    for bad in (["--nope"], ["--socket"], ["--log-level", "loud"], ["--log-format", "xml"], ["x"]):
        with pytest.raises(UsageError):
            parse_args(bad)


def test_version_1_and_its_root_descriptor_are_refused() -> None:
    """Issue 24: a launcher of protocol 1 handed the caller's root directory (flag 1). An
    agent of version 2 reads neither its magic nor that flag: such a caller runs one-shot."""
    data = proto.encode_request(BUILD, ("a",), {}, "/", b"", proto.FD_CALLER_NETNS)
    v1 = b"CBXAGNT1" + data[8 : proto.HEADER.size]
    with pytest.raises(proto.ProtocolError, match="bad magic"):
        proto.parse_header(v1)
    root_flag = proto.HEADER.pack(proto.MAGIC, BUILD.encode(), 1, 1, 0, 2, 0, 0)
    with pytest.raises(proto.ProtocolError, match="unknown flags"):
        proto.parse_header(root_flag)


def test_file_frames_roundtrip_and_bounds() -> None:
    payload = proto.file_frame(proto.FILE_READ, "/etc/cni/net.d/ZZZ-kubeconfig")[proto.FRAME.size :]
    assert proto.parse_file_frame(payload) == (proto.FILE_READ, "/etc/cni/net.d/ZZZ-kubeconfig")
    for bad in (
        proto.FILE_HEAD.pack(proto.FILE_READ),  # no path
        proto.FILE_HEAD.pack(99) + b"/x",  # no such operation
        proto.FILE_HEAD.pack(proto.FILE_READ) + b"/a\0b",  # a NUL inside
        proto.FILE_HEAD.pack(proto.FILE_READ) + b"/" * (proto.MAX_FILE_PATH + 1),
    ):
        with pytest.raises(proto.ProtocolError):
            proto.parse_file_frame(bad)
    answer = proto.FileAnswer(errno=0, mode=0o100600, dev=3, ino=2**40, has_fd=True)
    assert proto.parse_file_answer(proto.encode_file_answer(answer)) == answer
    with pytest.raises(proto.ProtocolError):
        proto.parse_file_answer(proto.FILE_ANSWER.pack(0, 0, 0, 0, 1, 1))  # refused with fd
    with pytest.raises(proto.ProtocolError):
        proto.parse_file_answer(b"short")
