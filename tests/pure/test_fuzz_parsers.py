"""Fuzzing every parser that reads untrusted input (issue 12): the CNI network config and
the plugin's commands, CNI_ARGS, the kubeconfig, API responses (objects, Status bodies, the
HTTP response head and chunked framing), iptables-save text, conflists, and the objects
iptables-verify reads.

Properties, for every input: only cnibox's own errors (`CniboxError`) escape, and each input
is handled within a bounded time (`tests/support/fuzzing.PER_INPUT`). Inputs are derandomized
in `make test` (CI sees the same ones every run); `make fuzz` runs longer with random seeds.
These test the Python source, so the binary run (`CNIBOX=...`) skips them.
Cost: about 30 s on the 2-core CI machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from multicall.core import agent_protocol as proto
from multicall.core.cni.skel import parse_cni_args
from multicall.core.firewall.diff import diff_tables, may_matter
from multicall.core.firewall.iptables_save import (
    _words,
    parse_save,
    read_last_table,
    tokenize,
)
from multicall.core.firewall.model import Family
from multicall.core.firewall.proxy_init import expected_table
from multicall.core.firewall.report import diff_to_json, format_diff
from multicall.core.installer.config import render_kubeconfig
from multicall.core.installer.conflist import insert_linkerd, remove_linkerd
from multicall.core.kube.kubeconfig import parse_kubeconfig
from multicall.core.kube.objects import parse_namespace, parse_pod, parse_service
from multicall.effects.log import Logger
from multicall.errors import CniboxError, ConfigError
from multicall.plugin.commands import Progress
from multicall.plugin.run import PluginRequest, _dispatch
from tests.support import FIXTURES
from tests.support.fakes import FakeKube, MemoryFirewall, fake_deps
from tests.support.fuzzing import documents, fuzz, keys_of, mutated
from tests.support.installer_host import count_linkerd
from tests.support.kubeapi import INTERNAL, UNAUTHORIZED, namespace_doc, not_found, service_doc
from tests.support.pods import MESHED, NOT_INJECTED, WITH_INIT
from tests.support.scenarios import OK_NAMES, SCENARIOS, scenario_options

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("CNIBOX")), reason="fuzzes the Python source (the source run did)"
)

STDOUT = FIXTURES / "derived" / "linkerd-cni-stdout"
KUBECONFIG = "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"
CONFIG_SEEDS = [
    *(p.read_bytes() for p in sorted(STDOUT.glob("*.stdin.json"))),
    json.dumps(
        {
            "cniVersion": "1.1.0",
            "name": "k8s-pod-network",
            "type": "linkerd-cni",
            "log_level": "debug",
            "kubernetes": {"kubeconfig": KUBECONFIG},
            "linkerd": {
                "incoming-proxy-port": 4143,
                "outgoing-proxy-port": 4140,
                "proxy-uid": 2102,
                "ports-to-redirect": [],
                "inbound-ports-to-ignore": ["4191", "4190"],
                "outbound-ports-to-ignore": ["443"],
                "subnets-to-ignore": ["10.0.0.0/8"],
                "iptables-mode": "nft",
                "ipv6": True,
                "simulate": False,
            },
        }
    ).encode(),
]
CONFIG_KEYS = keys_of(*(json.loads(s) for s in CONFIG_SEEDS))
CNI_ARGS_SEEDS = [
    b"IgnoreUnknown=1;K8S_POD_NAMESPACE=emojivoto;K8S_POD_NAME=web-cni-7d4f8c9b5-x2x4q",
    b"K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;K8S_POD_INFRA_CONTAINER_ID=c;IgnoreUnknown=true",
    b"",
]
API_OBJECTS = [MESHED, WITH_INIT, NOT_INJECTED, namespace_doc("emojivoto", {"a": "b"})]
API_OBJECTS.append(service_doc([{"name": "https", "port": 443, "targetPort": 6443}]))
API_SEEDS = [json.dumps(doc).encode() for doc in API_OBJECTS] + [
    UNAUTHORIZED,
    INTERNAL,
    not_found("pods", "x"),
]
SAVE_SEEDS = [p.read_bytes() for p in sorted(SCENARIOS.glob("*.iptables-save.txt"))] + [
    p.read_bytes() for p in sorted((FIXTURES / "derived/iptables-canonicalization").glob("*.txt"))
]
CONFLIST_SEEDS = [
    p.read_bytes()
    for p in sorted(FIXTURES.glob("upstream/proxy-init/internal-cni-testdata/*.conf*"))
] + [p.read_bytes() for p in sorted(FIXTURES.glob("derived/linkerd-go-installer/*.conflist"))]


def lines_of(stream: io.BytesIO) -> list[tuple[int, str]]:
    """Lines as iptables-verify streams them from a file."""
    from multicall.effects.inputs import lines

    return [
        (n, line.decode("utf-8", "surrogateescape"))
        for n, line in lines(stream, max_line=1 << 20, max_total=1 << 30, what="save")
    ]


def only_own_errors(work: Any, *args: Any) -> None:
    """Run `work`; a CniboxError is a fine outcome, anything else fails the property."""
    with contextlib.suppress(CniboxError):
        work(*args)


# ----------------------------------------------------------------------------- the plugin


def plugin_world() -> Any:
    kube = FakeKube()
    for pod in (MESHED, WITH_INIT, NOT_INJECTED):
        kube.add_pod(pod)
    return fake_deps(kube, MemoryFirewall())


@fuzz(examples=300)
@given(
    stdin=documents(CONFIG_SEEDS, CONFIG_KEYS),
    args=st.one_of(mutated(CNI_ARGS_SEEDS), st.binary(max_size=60)),
    command=st.sampled_from(["ADD", "CHECK", "DEL", "STATUS", "GC", "VERSION"]),
)
def test_plugin_commands(stdin: bytes, args: bytes, command: str) -> None:
    """A network config and CNI_ARGS of any shape through every command (skel's checks, the
    Go decoding of the config and prevResult, the pod lookup, the rules)."""
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "c0ffee",
        "CNI_NETNS": "/var/run/netns/cbx-fuzz-absent",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": args.decode("utf-8", "surrogateescape"),
    }
    request = PluginRequest(env=env, stdin=stdin, stderr=io.BytesIO())
    log = Logger(request.stderr, "debug")
    only_own_errors(_dispatch, request, plugin_world(), io.BytesIO(), log, Progress())


@fuzz(examples=300)
@given(raw=st.one_of(mutated(CNI_ARGS_SEEDS), st.text(max_size=80).map(str.encode)))
def test_cni_args(raw: bytes) -> None:
    only_own_errors(parse_cni_args, raw.decode("utf-8", "surrogateescape"))


# ----------------------------------------------------------------------------- kubeconfig

KUBECONFIG_SEEDS = [
    render_kubeconfig(
        b"eyJhbGciOi.token-123", b"-----BEGIN CERTIFICATE-----\n", "10.96.0.1", "443"
    ),
    yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://[fd00::1]:6443/k8s"}}],
            "users": [{"name": "u", "user": {"tokenFile": "/nonexistent/cbx-fuzz-token"}}],
            "contexts": [{"name": "linkerd-cni-context", "context": {"cluster": "c", "user": "u"}}],
        }
    ).encode(),
]


@fuzz(examples=250)
@given(data=st.one_of(mutated(KUBECONFIG_SEEDS), st.binary(max_size=120)))
def test_kubeconfig(data: bytes) -> None:
    """client-go's reading of a kubeconfig, then the client built from it (server URL,
    token): only cnibox's errors, whatever the YAML."""
    from multicall.effects.kube.client import KubeClient

    def read() -> None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return  # refused by the reader before parsing (effects/kube/config.read_text_file)
        KubeClient(parse_kubeconfig(text)).close()

    only_own_errors(read)


# ----------------------------------------------------------------------------- API responses

API_KEYS = keys_of(*API_OBJECTS, json.loads(INTERNAL))


@fuzz(examples=300)
@given(
    body=documents(API_SEEDS, API_KEYS),
    kind=st.sampled_from([parse_pod, parse_namespace, parse_service]),
    status=st.sampled_from([200, 401, 404, 500]),
)
def test_api_objects(body: bytes, kind: Any, status: int) -> None:
    """What the plugin does with an API response body: a Status error, or the object."""
    from multicall.effects.kube.client import decode_object, status_message

    def read() -> None:
        if status >= 400:
            assert isinstance(status_message(status, body, ("pods", "x")), str)
        else:
            kind(decode_object(body, "https://api/x"))

    only_own_errors(read)


HTTP_SEEDS = [
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"kind":""}',
    b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\nX-A: b\r\n\r\n"
    b'5;ext=1\r\n{"a":\r\n3\r\n12}\r\n0\r\nTrailer: x\r\n\r\n',
    b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\n[1,2,3]",
]


@fuzz(examples=300)
@given(data=st.one_of(mutated(HTTP_SEEDS), st.binary(max_size=120)))
def test_http_framing(data: bytes) -> None:
    """The client's reading of a response head and body (Content-Length, chunked, to the
    end): only its framing errors, which the client words as client-go does."""
    from multicall.core.limits import API_OBJECT
    from multicall.effects import http
    from multicall.effects.kube.client import transport_error
    from multicall.effects.kube.config import endpoint

    reader = io.BufferedReader(io.BytesIO(data))
    failure: OSError | ValueError | None = None
    try:
        http.read_body(reader, http._read_head(reader), API_OBJECT)
    except (http.HttpProtocolError, http._NothingReceived, http._UnexpectedEof) as exc:
        failure = exc
    if failure is not None:
        conn = http.Connection(endpoint("https://10.96.0.1"))
        assert isinstance(transport_error(failure, "Get", "https://x/", conn), CniboxError)


# ----------------------------------------------------------------------------- iptables-save


@fuzz(examples=300)
@given(
    data=st.one_of(mutated(SAVE_SEEDS), st.binary(max_size=200)),
    name=st.sampled_from(OK_NAMES),
    strict=st.booleans(),
)
def test_iptables_save(data: bytes, name: str, strict: bool) -> None:
    """Save text as iptables-verify reads it (whole, and streamed), then compared and
    reported: only ConfigError, and both readers agree."""
    text = data.decode("utf-8", "surrogateescape")
    lines = [line for _, line in lines_of(io.BytesIO(data))]
    expected = expected_table(scenario_options(name), Family.IPV4)
    try:
        whole = parse_save(text)
    except ConfigError as exc:
        message = exc.message
    else:
        message = ""
    if message:
        with pytest.raises(ConfigError) as streamed:
            read_last_table(enumerate(lines, start=1), "nat")
        assert streamed.value.message == message
        return
    nat = [t for t in whole.tables if t.name == "nat"]
    keep = lambda rule: may_matter(rule, strict=strict)  # noqa: E731
    found, _ = read_last_table(enumerate(lines, start=1), "nat", keep_rule=keep)
    if not nat:
        assert found is None
        return
    assert found is not None
    full = diff_tables(expected, nat[-1], strict=strict)
    assert diff_tables(expected, found, strict=strict) == full
    format_diff(full)
    diff_to_json(full)


@fuzz(examples=400)
@given(line=st.text(alphabet=' \t"\\-Aab!#', max_size=24))
def test_save_line_fast_path(line: str) -> None:
    """The reader's fast split of a line is `tokenize` exactly (or defers to it)."""
    try:
        expected: list[str] | None = [t.text for t in tokenize(line)]
    except ConfigError:
        expected = None
    assert _words(line) == expected


# ----------------------------------------------------------------------------- conflists

CONFLIST_KEYS = keys_of(*(json.loads(s) for s in CONFLIST_SEEDS))
LINKERD_ENTRY = json.dumps({"type": "linkerd-cni", "name": "linkerd-cni"}).encode()


@fuzz(examples=300)
@given(data=documents(CONFLIST_SEEDS, CONFLIST_KEYS))
def test_conflists(data: bytes) -> None:
    """The installer's conflist patcher: insert, count, remove."""

    def patch() -> None:
        patched = insert_linkerd(data, LINKERD_ENTRY)
        assert count_linkerd(patched) == 1
        assert remove_linkerd(patched) is not None

    only_own_errors(patch)
    only_own_errors(remove_linkerd, data)


# ----------------------------------------------------------------------------- iptables-verify


@fuzz(examples=200)
@given(
    data=st.one_of(documents(API_SEEDS, API_KEYS), mutated([yaml.safe_dump(MESHED).encode()])),
    option=st.sampled_from(["--pod", "--namespace-object", "--service", "--config"]),
)
def test_iptables_verify_objects(data: bytes, option: str) -> None:
    """Objects (JSON or YAML) and network configs (plugin or conflist) given as files."""
    from multicall.core.cni.netconf import parse_netconf
    from multicall.plugin.verify import load_object, plugin_config

    def read() -> None:
        if option == "--config":
            parse_netconf(plugin_config(data, "conf.json"))
            return
        doc = load_object("-", io.BytesIO(data), option)
        {"--pod": parse_pod, "--namespace-object": parse_namespace}.get(option, parse_service)(doc)

    only_own_errors(read)


# ----------------------------------------------------------------------------- the node agent

AGENT_ENV = {"CNI_COMMAND": "ADD", "CNI_NETNS": "/var/run/netns/cni-1", "CNI_IFNAME": "eth0"}
AGENT_SEEDS = [
    proto.encode_request(proto.SOURCE_BUILD, ("linkerd-cni",), AGENT_ENV, "/", b"{}", flags)
    for flags in (0, proto.FD_CALLER_NETNS, sum(proto.FD_ORDER))
]


@fuzz(examples=400)
@given(
    data=st.one_of(mutated(AGENT_SEEDS), st.binary(max_size=120)),
    header=st.one_of(
        st.none(),
        st.tuples(*(st.sampled_from((0, 1, 2, 15, 256, 4097, 1 << 20, 2**32 - 1)),) * 6),
    ),
    nfds=st.integers(0, 6),
)
def test_agent_request(data: bytes, header: tuple[int, ...] | None, nfds: int) -> None:
    """agent_protocol's parser on random and mutated requests, header fields near the bounds
    and any number of descriptors: a request within the bounds and the header's counts, or
    ProtocolError; nothing else."""
    if header is not None:  # a valid start with hostile counts: reaches the bound checks
        data = proto.HEADER.pack(proto.MAGIC, b"x" * proto.HASH_LEN, *header) + data
    fds = list(range(100, 100 + nfds))  # numbers only: the parser never uses them
    try:
        head = proto.parse_header(data[: proto.HEADER.size])
        request = proto.parse_body(head, data[proto.HEADER.size :][: head.body_len], fds)
    except proto.ProtocolError:
        return
    assert len(request.argv) == head.argc <= proto.MAX_ARGS
    assert len(request.env) <= head.envc <= proto.MAX_ENV
    assert len(request.stdin) <= proto.MAX_STDIN
    assert sorted(request.fds) == [f for f in proto.FD_ORDER if head.flags & f]


FILE_SEEDS = [
    proto.file_frame(op, path)[proto.FRAME.size :]
    for op, path in ((proto.FILE_READ, "/etc/cni/net.d/ZZZ-kubeconfig"), (proto.FILE_ROTATE, "l"))
] + [proto.encode_file_answer(proto.FileAnswer(2, 0o100600, 1, 2, False, False))]


@fuzz(examples=300)
@given(data=st.one_of(mutated(FILE_SEEDS), st.binary(max_size=80)))
def test_agent_file_frames(data: bytes) -> None:
    """The FILE frame and its answer (protocol 2, agent/caller_files.py): an operation of the
    fixed set on a path of 1..4096 bytes without a NUL, a well-formed answer (never a
    descriptor and a refusal at once), or ProtocolError; nothing else."""
    try:
        op, path = proto.parse_file_frame(data)
    except proto.ProtocolError:
        pass
    else:
        assert op in proto.FILE_OPS
        assert path
        assert "\0" not in path
        assert len(os.fsencode(path)) <= proto.MAX_FILE_PATH
    try:
        answer = proto.parse_file_answer(data)
    except proto.ProtocolError:
        return
    assert not (answer.refused and answer.has_fd)
    assert proto.parse_file_answer(proto.encode_file_answer(answer)) == answer


STATUS_SEED = (
    b"Name:\tcnibox\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n"
    b"CapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n"
)


@fuzz(examples=300)
@given(
    status=st.one_of(mutated([STATUS_SEED]), st.binary(max_size=200)),
    userns=st.sampled_from([None, (4, 1), (4, 2)]),
)
def test_agent_caller_status(status: bytes, userns: tuple[int, int] | None) -> None:
    """The agent's judgement of a caller's /proc/PID/status: an Authority that may enter a
    netns only for a caller seen in the agent's user namespace with CAP_SYS_ADMIN and
    CAP_NET_ADMIN, or Refused with one of its fixed reasons; nothing else."""
    from multicall.agent.authority import Refused, judge
    from multicall.core.proc_status import parse_status

    text = status.decode("ascii", "replace")
    try:
        authority = judge(text, userns, (4, 1))
    except Refused as exc:
        reason = exc.reason
    else:
        caps = parse_status(text).cap_eff
        assert caps >> 12 & 1
        assert caps >> 21 & 1
        assert authority.may_enter == (userns == (4, 1))
        return
    assert reason in REFUSALS


REFUSALS = {
    "caller in another user namespace",
    "caller's status unreadable",
    "caller gone",
    *(f"caller lacks {m}" for m in ("CAP_NET_ADMIN", "CAP_SYS_ADMIN")),
    "caller lacks CAP_NET_ADMIN and CAP_SYS_ADMIN",
}
# What a hostile caller can put in a descriptor slot: opened per example, closed after.
SLOTS = ("netns", "user ns", "pipe", "file", "unix", "netfilter", "route", "udp")


def _slot(kind: str) -> int:
    import socket

    if kind == "netns":
        return os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    if kind == "user ns":
        return os.open("/proc/self/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    if kind == "pipe":
        r, w = os.pipe()
        os.close(w)
        return r
    if kind == "file":
        return os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    family, type_, protocol = {
        "unix": (socket.AF_UNIX, socket.SOCK_STREAM, 0),
        "netfilter": (socket.AF_NETLINK, socket.SOCK_RAW, 12),
        "route": (socket.AF_NETLINK, socket.SOCK_RAW, 0),
        "udp": (socket.AF_INET, socket.SOCK_DGRAM, 0),
    }[kind]
    return socket.socket(family, type_, protocol).detach()


@fuzz(examples=150)
@given(
    home=st.sampled_from(SLOTS),
    target=st.one_of(st.none(), st.sampled_from(SLOTS)),
    netlink=st.one_of(st.none(), st.sampled_from(SLOTS)),
)
def test_agent_descriptor_checks(home: str, target: str | None, netlink: str | None) -> None:
    """The worker's checks of handed descriptors, on every kind of descriptor in every slot:
    accepted only when the caller's netns is a netns and the netlink socket (if any) is a
    NETLINK_NETFILTER socket in the target's netns; otherwise Fallback; nothing else. (The
    target slot itself is checked by ns.check_netns_fd before these.)"""
    from multicall.agent.worker import Fallback, check_descriptors

    kinds = (home, target, netlink)
    fds = [None if kind is None else _slot(kind) for kind in kinds]
    try:
        assert fds[0] is not None
        try:
            check_descriptors(fds[0], fds[1], fds[2])
            accepted = True
        except Fallback:
            accepted = False
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)
    # Unprivileged, SIOCGSKNS is refused: the socket's netns is then unknown, handed back.
    may_know = os.geteuid() == 0
    valid = home == "netns" and (
        netlink is None or (netlink == "netfilter" and target == "netns" and may_know)
    )
    assert accepted == valid, kinds
