"""usage: linkerd-cni-agent [--socket PATH] [--admin-addr HOST:PORT] [OPTIONS]

The resident node agent (also `cnibox agent`): serves `linkerd-cni` invocations for the
launcher of this same build over a unix socket, so a pod's ADD starts no Python runtime.
Runs in the foreground; SIGTERM stops it cleanly (the socket goes first, requests in flight
finish or are handed back to their callers). Without an agent, or with one that cannot
serve a request, the plugin runs as a one-shot process (docs/agent.md).

  --socket PATH            where to listen (default /var/run/linkerd-cni/agent.sock; the
                           plugin uses $CNIBOX_AGENT_SOCKET when set)
  --admin-addr HOST:PORT   /healthz, /readyz, /metrics (default 0.0.0.0:9991; "" disables)
  --workers N              pre-forked idle workers (default 4)
  --max-requests N         requests in flight or queued before callers are handed back
                           (default 256)
  --max-workers N          requests served at once; callers beyond wait, unless all
                           those are waiting on the API (default twice the CPUs, min 4)
  --worker-requests N      requests one worker serves before it exits (default 64; 1: a
                           new process for every request)
  --request-timeout SECS   a request still running after this is killed (default 60)
  --shutdown-grace SECS    how long SIGTERM waits for requests in flight (default 25)
  --log-level LEVEL        debug, info (default), warn, error
  --log-format FORMAT      plain (logrus text, the default) or json
  -h, --help               this text
  --version                print the version
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, BinaryIO

from multicall.errors import UsageError

DEFAULT_SOCKET = "/var/run/linkerd-cni/agent.sock"
DEFAULT_ADMIN = "0.0.0.0:9991"
READ_TIMEOUT = 5.0

if TYPE_CHECKING:
    from multicall.core.agent_protocol import Request
    from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
    from multicall.core.firewall.ruleset import Table
    from multicall.effects.agent_server import Again
    from multicall.effects.kube.warm import WarmConnections
    from multicall.effects.ns import NetnsRef
    from multicall.plugin.ports import Firewall

Report = Callable[[str, dict[str, object]], None]


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int:
    opts = parse_args(list(argv[1:]))
    from multicall.effects.log import Logger

    log = Logger(stderr, opts["log-level"], opts["log-format"]).log
    from multicall.effects.kube.warm import WarmConnections

    connections = WarmConnections()  # this process's; each worker its own copy from the fork
    preload(connections)
    from multicall.core.agent_protocol import SOURCE_BUILD
    from multicall.effects.agent_server import Server, ServerOptions, default_max_workers

    build = env.get("CNIBOX_BUILD", "") or SOURCE_BUILD
    options = ServerOptions(
        socket_path=opts["socket"],
        admin_addr=opts["admin-addr"],
        workers=_int(opts, "workers", 1),
        max_requests=_int(opts, "max-requests", 1),
        max_workers=_int(opts, "max-workers", 1) if opts["max-workers"] else default_max_workers(),
        worker_requests=_int(opts, "worker-requests", 1),
        request_timeout=_float(opts, "request-timeout"),
        shutdown_grace=_float(opts, "shutdown-grace"),
        build=build,
    )
    own_netns = _identity("/proc/self/ns/net")
    server = Server(
        options,
        log,
        lambda conn, report: serve(conn, report, build, own_netns, connections),
        prepare=lambda hint: warm_up(hint, connections),
    )
    try:
        server.bind()  # a bad --admin-addr: UsageError; a busy port: CniboxError (exit 1)
    except OSError as exc:
        log("error", f"cannot listen on {opts['socket']}: {exc.strerror}")
        if server.admin is not None:
            server.admin.stop()
        return 1
    if server.admin_port is not None:
        log("info", f"admin endpoints on {opts['admin-addr']} (port {server.admin_port})")
    return server.run()


FLAGS = {
    "socket": DEFAULT_SOCKET,
    "admin-addr": DEFAULT_ADMIN,
    "workers": "4",
    "max-requests": "256",
    "max-workers": "",
    "worker-requests": "64",
    "request-timeout": "60",
    "shutdown-grace": "25",
    "log-level": "info",
    "log-format": "plain",
}


def parse_args(args: list[str]) -> dict[str, str]:
    """The options of the usage text (core/usage.py), by name without dashes, defaults
    filled in; UsageError for a bad command line or value. (--help and --version never get
    here: the dispatcher answers them.)"""
    from multicall.core import logs, usage

    line = usage.parse(args, usage.options(__doc__ or ""))
    opts = {name: line.value(f"--{name}", default) or "" for name, default in FLAGS.items()}
    try:
        opts["log-level"] = logs.parse_level(opts["log-level"])
    except ValueError:
        raise UsageError(
            f"invalid --log-level '{opts['log-level']}': debug, info, warn or error"
        ) from None
    if opts["log-format"] not in logs.FORMATS:
        raise UsageError(f"invalid --log-format '{opts['log-format']}': plain or json")
    return opts


def _int(opts: Mapping[str, str], name: str, minimum: int) -> int:
    try:
        value = int(opts[name])
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise UsageError(f"--{name} {opts[name]}: expected an integer >= {minimum}")
    return value


def _float(opts: Mapping[str, str], name: str) -> float:
    try:
        value = float(opts[name])
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"--{name} {opts[name]}: expected a positive number of seconds")
    return value


def warm_up(hint: object, connections: WarmConnections) -> None:
    """In a new worker, from what the previous requests needed (`_warm_report`): dial the
    API server they used (effects.kube.warm) and load the x_tables extensions of a one-family
    legacy apply (effects/firewall/legacy.py `preload`; this worker then hands the other
    family back). Failures are the request's to see, or nobody's."""
    if not isinstance(hint, dict):
        return
    if isinstance(api := hint.get("api"), dict):
        connections.warm_up(api)
    if (xtables := hint.get("xtables")) in ("ipv4", "ipv6") and _Scratch.fd is not None:
        from multicall.core.firewall.model import Family
        from multicall.effects import ns
        from multicall.effects.firewall import legacy

        legacy.single_use()  # this worker serves one request, then exits (rule 3)
        with ns.entered_netns(ns.NetnsRef("the agent's scratch netns", _Scratch.fd)):
            legacy.preload(Family(xtables))


class _Scratch:
    """An empty netns the agent makes at start (`preload`), where workers load x_tables
    extensions: libxtables asks the kernel for each extension's revisions on a raw socket
    of the current netns, and nothing of a preload belongs in the node's (the agent's,
    with hostNetwork), not even a read. None: no CAP_SYS_ADMIN, workers preload nothing."""

    fd: int | None = None


def _warm_report(
    firewall: _WatchedFirewall | None, connections: WarmConnections
) -> dict[str, object]:
    """What this successful request leaves for the next workers: its API server (not when
    it used a CA file), and, when it applied rules, the family of a one-family legacy apply
    run here ("" for nft or dual-stack legacy: preload nothing)."""
    from multicall.effects.firewall import legacy

    warm: dict[str, object] = {}
    if (api := connections.warm_hint()) is not None:
        warm["api"] = api
    if firewall is not None and firewall.applied:
        family = legacy.ran_here()
        warm["xtables"] = family.value if family is not None else ""
    return warm


def preload(connections: WarmConnections) -> None:
    """Import once, in the parent, everything a request may need: workers fork from here."""
    import ssl  # noqa: F401

    from multicall.core.cni import netconf, result, skel  # noqa: F401
    from multicall.core.firewall import diff, proxy_init  # noqa: F401
    from multicall.core.kube import pod_policy  # noqa: F401
    from multicall.effects.firewall import engine, nft  # noqa: F401
    from multicall.effects.kube import client  # noqa: F401
    from multicall.errors import FirewallError
    from multicall.plugin import commands, pod_inputs, ports, run  # noqa: F401

    connections.keep_spare_tls_context()
    from multicall.effects import ns

    _Scratch.fd = ns.scratch_netns()  # before any thread: made on, and kept by, this one
    try:
        from multicall.effects.firewall.legacy import iptc

        iptc()
    except FirewallError:
        pass  # no libiptc here: legacy requests will fail in their worker as one-shot would


# ----------------------------------------------------------------------------- a worker


def serve(
    conn: socket.socket,
    report: Report,
    build: str,
    own_netns: tuple[int, int],
    connections: WarmConnections,
) -> Again | None:
    """One request on `conn`, in a worker process (agent_server). Returns what the worker
    prepares its next request with when it may serve another (agent_server rule 4): the
    request ran no x_tables code here (libxtables keeps one family's extensions per process)
    and left the worker in its own netns. None: the worker exits."""
    from multicall.core import agent_protocol as proto
    from multicall.effects import caller

    conn.settimeout(READ_TIMEOUT)
    try:
        request = read_request(conn)
    except (proto.ProtocolError, OSError) as exc:
        report("D", {"fallback": f"bad request: {exc}"})
        _send(conn, proto.fallback_frame("bad request"))
        return None
    try:
        return _serve_request(conn, report, build, own_netns, request, connections=connections)
    finally:
        caller.clear()
        for fd in request.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _serve_request(
    conn: socket.socket,
    report: Report,
    build: str,
    own_netns: tuple[int, int],
    request: Request,
    *,
    connections: WarmConnections,
) -> Again | None:
    from multicall.core import agent_protocol as proto
    from multicall.effects.agent_server import Again

    command = request.command or "unknown"
    if request.build != build:
        report("D", {"command": command, "fallback": "other build"})
        _send(conn, proto.fallback_frame("other build"))
        return None
    report("S", {"command": command})
    from multicall.effects.firewall import legacy

    loaded = legacy.extensions_loaded()
    firewall: list[_WatchedFirewall] = []
    try:
        code, out, err = run_request(request, own_netns, connections, firewall)
    except _Fallback as exc:
        fell_back: dict[str, object] = {"command": command, "fallback": exc.reason}
        if exc.reason == legacy.OTHER_FAMILY:  # the requests changed: stop preloading
            fell_back["warm"] = {"xtables": ""}
        report("D", fell_back)
        _send(conn, proto.fallback_frame(exc.reason))
        return None
    # Reported first: whoever asks /metrics once the caller has its result sees it counted.
    done: dict[str, object] = {"command": command, "exit": code, "cni_code": _cni_code(code, out)}
    done["xt_loads"] = legacy.extensions_loaded() - loaded
    warm = _warm_report(firewall[0] if firewall else None, connections)
    if code == 0:
        done["warm"] = warm
    report("D", done)
    _send(conn, proto.result_frame(code, out, err))
    reusable = legacy.extensions_loaded() == 0 and legacy.ran_here() is None
    if not reusable or _identity("/proc/thread-self/ns/net") != own_netns:
        return None
    return Again({"api": warm["api"]} if "api" in warm else {}, connections.warm_fds())


class _WatchedFirewall:
    """The request's firewall (plugin.ports `Firewall`), noting whether it applied rules
    (`_warm_report`)."""

    def __init__(self, inner: Firewall) -> None:
        self.inner = inner
        self.applied = False

    def apply(
        self,
        netns: NetnsRef,
        options: ProxyInitOptions,
        *,
        mode: Mode,
        families: tuple[Family, ...],
        log: Callable[[str], None],
    ) -> None:
        self.inner.apply(netns, options, mode=mode, families=families, log=log)
        self.applied = True

    def dump_nat(
        self, netns: NetnsRef, *, mode: Mode, family: Family, log: Callable[[str], None]
    ) -> Table:
        return self.inner.dump_nat(netns, mode=mode, family=family, log=log)


class _Fallback(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def read_request(conn: socket.socket) -> Request:
    from multicall.core import agent_protocol as proto

    head = b""
    fds: list[int] = []
    while len(head) < proto.HEADER.size:
        chunk, got, _flags, _addr = socket.recv_fds(conn, proto.HEADER.size - len(head), 4)
        fds += got
        if not chunk:
            raise proto.ProtocolError("connection closed in the header")
        head += chunk
    header = proto.parse_header(head)
    body = bytearray()
    while len(body) < header.body_len:
        chunk = conn.recv(min(header.body_len - len(body), 1 << 20))
        if not chunk:
            raise proto.ProtocolError("connection closed in the body")
        body += chunk
    return proto.parse_body(header, bytes(body), fds)


def run_request(
    request: Request,
    own_netns: tuple[int, int],
    connections: WarmConnections,
    watched: list[_WatchedFirewall] | None = None,
) -> tuple[int, bytes, bytes]:
    """The plugin, in this process, in the caller's context (effects.caller), its API
    clients on this worker's warm `connections`. `watched` receives the firewall it used."""
    from multicall.core import agent_protocol as proto
    from multicall.effects import caller, ns
    from multicall.effects.firewall import legacy
    from multicall.effects.firewall.locks import XtablesLock
    from multicall.errors import NetnsError
    from multicall.plugin.ports import PluginDeps, RealFirewall, RealKube
    from multicall.plugin.run import PluginRequest, run_plugin

    fds = request.fds
    root, home = fds.get(proto.FD_ROOT), fds.get(proto.FD_CALLER_NETNS)
    target = fds.get(proto.FD_TARGET_NETNS)
    if root is None or home is None:
        raise _Fallback("caller sent no root or netns")
    netns_path = request.env.get("CNI_NETNS", "")
    if target is None and netns_path and request.command in ("ADD", "CHECK", "DEL"):
        # Never look the caller's path up here: it names a file of the caller's mount
        # namespace (the launcher sends the descriptor, or runs one-shot itself).
        raise _Fallback("CNI_NETNS not handed over")
    if target is not None:
        try:
            ns.check_netns_fd(target, netns_path)  # what run_plugin checks, before anything
        except NetnsError:
            raise _Fallback("CNI_NETNS is not a network namespace") from None
        if _identity(f"/proc/self/fd/{target}") == own_netns:
            raise _Fallback("CNI_NETNS is the agent's own netns")
    if _identity(f"/proc/self/fd/{home}") != _identity("/proc/thread-self/ns/net"):
        # The API is reached from the caller's netns, as the one-shot plugin does. In a
        # DaemonSet with hostNetwork (or a Talos service) they are the same: no setns.
        try:
            ns.setns(home, ns.CLONE_NEWNET)
        except OSError as exc:
            raise _Fallback(f"cannot enter the caller's netns: {exc.strerror}") from None
        connections.drop_warm()  # dialled from the agent's netns, not the caller's
    caller.install(
        caller.CallerContext(
            root_fd=root,
            cwd=request.cwd or "/",
            netns_path=netns_path,
            netns_fd=target,
            netlink_fd=fds.get(proto.FD_NETLINK),
        )
    )
    err = io.BytesIO()
    plugin_request = PluginRequest(
        env=request.env,
        stdin=b"" if request.command == "VERSION" else request.stdin,
        stderr=err,
        netns_fd=target,
        caller_netns_fd=home,
    )
    # A worker serves one request at a time, and exits after a legacy apply: one of one family
    # runs libiptc here instead of forking a child per table operation (legacy.py rule 3).
    legacy.single_use()
    connections.park_connections()  # the request's API connection: the next request's warm one
    # Legacy ADDs take the caller's xtables lock: its XTABLES_LOCKFILE (or /run/xtables.lock)
    # opened through its root (locks.py rule 4), the lock the one-shot plugin would take.
    firewall = _WatchedFirewall(RealFirewall(XtablesLock(env=request.env)))
    if watched is not None:
        watched.append(firewall)
    deps = PluginDeps(RealKube(connections), firewall)
    try:
        outcome = run_plugin(plugin_request, deps)
    except caller.ServeElsewhere as exc:
        raise _Fallback(exc.reason) from None
    stdout, stderr = outcome.stdout, err.getvalue()
    if len(stdout) + len(stderr) > proto.MAX_OUTPUT:
        raise _Fallback("output too large")
    return outcome.exit_code, stdout, stderr


def _cni_code(code: int, stdout: bytes) -> str:
    if code == 0:
        return ""
    try:
        value = json.loads(stdout).get("code", "")
    except (ValueError, AttributeError):
        return ""
    return str(value)


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.settimeout(READ_TIMEOUT)
        conn.sendall(data)
    except OSError:
        pass  # the caller went away; it runs the one-shot path if it still can


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)
