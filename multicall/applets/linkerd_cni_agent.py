"""usage: linkerd-cni-agent [--socket PATH] [--admin-addr HOST:PORT] [OPTIONS]

The resident node agent (also `cnibox agent`): serves `linkerd-cni` invocations for the
launcher of this same build over a unix socket, so a pod's ADD starts no Python runtime.
Runs in the foreground; SIGTERM stops it cleanly (the socket goes first, requests in flight
finish or are handed back to their callers). Without an agent, or with one that cannot
serve a request, the plugin runs as a one-shot process (docs/agent.md).

  --socket PATH            where to listen (default /var/run/linkerd-cni/agent.sock; the
                           plugin uses $CNIBOX_AGENT_SOCKET when set)
  --admin-addr HOST:PORT   /healthz, /readyz, /metrics (default 127.0.0.1:9991; "" disables)
  --workers N              pre-forked idle workers (default 4)
  --max-requests N         requests in flight or queued before callers are handed back
                           (default 256)
  --max-workers N          requests served at once; callers beyond wait, unless all
                           those are waiting on the API (default twice the CPUs, min 4)
  --worker-requests N      requests one worker serves before it exits (default 64; 1: a
                           new process for every request)
  --request-timeout SECS   a request still running after this is killed (default 60)
  --shutdown-grace SECS    how long SIGTERM waits for requests in flight (default 25)
  --keeper MODE            off, report or repair (default): the keeper watches every
                           sandbox an ADD through this agent programmed and reports or
                           repairs drift of its redirect in place (docs/keeper.md); off:
                           no keeper process, no records
  --sandbox-records DIR    the keeper's records (default sandboxes/ beside the socket:
                           /var/run/linkerd-cni/sandboxes)
  --cni-net-dir DIR        the node's CNI config dir, for the repair's linkerd-cni entry
                           (default /etc/cni/net.d)
  --cni-cache-dir DIR      libcni's cache dir, to find sandboxes whose ADD never ran
                           through linkerd-cni (default "": not looked for)
  --host-root DIR          where the node's / is mounted, for netns paths and the xtables
                           lock (default "": this is the node's /)
  --kubeconfig PATH        the agent's API identity: the keeper's Events and its pod GET
                           before a repair, the pod cache's list and watch (default the
                           service account when mounted, else none). Loaded when they
                           start: a file that does not exist or cannot be used yet is
                           waited for (logged, retried), ADDs served meanwhile; a
                           rewritten file is loaded again. Not "" nor a directory
  --pod-cache MODE         on (default) or off: list and watch this node's pods and the
                           namespaces, and answer an ADD's GETs from them when they may
                           (docs/pod-cache.md); needs the API identity and the node name
  --node-name NAME         this node (default $NODE_NAME, else the hostname lowercased:
                           the kubelet's default name, without --hostname-override)
  --log-level LEVEL        debug, info (default), warn, error
  --log-format FORMAT      plain (logrus text, the default) or json
  -h, --help               this text
  --version                print the version
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, BinaryIO

from multicall.core.go.strconv import NumError, go_atoi
from multicall.core.keeper import KeeperMode
from multicall.errors import UsageError

if TYPE_CHECKING:
    from multicall.agent.keeper_process import KeeperSettings
    from multicall.agent.pod_cache_process import PodCacheProcess
    from multicall.agent.server import Server
    from multicall.agent.worker_process import Log

DEFAULT_SOCKET = "/var/run/linkerd-cni/agent.sock"
DEFAULT_ADMIN = "127.0.0.1:9991"  # loopback: nothing authenticates it (issue 24 #5)


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
    from multicall.agent.warm import Warmth

    warmth = Warmth()
    warmth.preload()
    from multicall.agent.server import Server, ServerOptions, default_max_workers
    from multicall.agent.worker import RequestWorker, identity
    from multicall.core.agent_protocol import SOURCE_BUILD

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
    settings = keeper_settings(opts, env)
    records = None
    if settings.mode is not KeeperMode.OFF:
        from multicall.effects.sandbox_records import RecordStore

        records = RecordStore(settings.records)
    cache = start_pod_cache(opts, env, log)  # forked before any thread or socket, as the keeper
    worker = RequestWorker(
        build, identity("/proc/self/ns/net"), warmth, records, pod_cache=cache is not None
    )
    keeper = None
    if settings.mode is not KeeperMode.OFF:  # forked before any thread or socket of the server
        from multicall.agent.keeper_process import KeeperProcess

        keeper = KeeperProcess.start(settings, env, log)
    server = Server(options, log, worker.serve, prepare=warmth.prepare, feed=keeper)
    if cache is not None:
        from multicall.agent.pod_cache import CacheFeed

        server.pod_cache = CacheFeed(cache.feed_r)
    try:
        return serve(server, opts, log)
    finally:
        if keeper is not None:
            keeper.stop(log)  # after the workers, which hold the pipe's write end too
        if cache is not None:
            cache.stop(log)


def serve(server: Server, opts: Mapping[str, str], log: Log) -> int:
    try:
        server.bind()  # a bad --admin-addr: UsageError; a busy port: CniboxError (exit 1)
    except OSError as exc:
        log("error", f"cannot listen on {opts['socket']}: {exc.strerror or exc}")
        if server.admin is not None:
            server.admin.stop()
        return 1
    if server.admin_port is not None:
        log("info", f"admin endpoints on {opts['admin-addr']} (port {server.admin_port})")
    return server.run()


def start_pod_cache(
    opts: Mapping[str, str], env: Mapping[str, str], log: Log
) -> PodCacheProcess | None:
    """The pod cache's process (agent/pod_cache_process.py), or None (logged) when it is off
    or cannot run: no node name, no API identity. A --kubeconfig is not read here: the
    process waits for it (agent/identity.py), so a file not written yet never fails the
    agent's start (Talos: install-cni writes it after the agent started)."""
    if opts["pod-cache"] not in ("on", "off"):
        raise UsageError(f"--pod-cache {opts['pod-cache']}: expected on or off")
    if opts["pod-cache"] == "off":
        return None
    import socket

    from multicall.agent.keeper_process import in_cluster_config
    from multicall.agent.pod_cache_process import PodCacheProcess
    from multicall.core.node_name import node_name

    node = node_name(opts["node-name"], env, socket.gethostname())
    config = None if opts["kubeconfig"] else in_cluster_config(env)
    if not node or (config is None and not opts["kubeconfig"]):
        missing = (
            "no node name (--node-name, $NODE_NAME, hostname)" if not node else "no API identity"
        )
        log("info", f"pod cache: off: {missing}; every ADD reads the API")
        return None
    return PodCacheProcess.start(config, opts["kubeconfig"], node, log)


def keeper_settings(opts: Mapping[str, str], env: Mapping[str, str]) -> KeeperSettings:
    import os
    import socket

    from multicall.agent.keeper_process import KeeperSettings

    try:
        mode = KeeperMode(opts["keeper"])
    except ValueError:
        raise UsageError(f"--keeper {opts['keeper']}: expected off, report or repair") from None
    records = opts["sandbox-records"]
    if not records:
        records = os.path.join(os.path.dirname(opts["socket"]) or ".", "sandboxes")
    return KeeperSettings(
        mode=mode,
        records=records,
        cni_net_dir=opts["cni-net-dir"],
        cni_cache_dir=opts["cni-cache-dir"],
        host_root=opts["host-root"],
        kubeconfig=opts["kubeconfig"],
        instance=env.get("HOSTNAME", "") or socket.gethostname(),
    )


FLAGS = {
    "socket": DEFAULT_SOCKET,
    "admin-addr": DEFAULT_ADMIN,
    "workers": "4",
    "max-requests": "256",
    "max-workers": "",
    "worker-requests": "64",
    "request-timeout": "60",
    "shutdown-grace": "25",
    "keeper": "repair",
    "sandbox-records": "",
    "cni-net-dir": "/etc/cni/net.d",
    "cni-cache-dir": "",
    "host-root": "",
    "kubeconfig": "",
    "pod-cache": "on",
    "node-name": "",
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
    if line.has("--kubeconfig"):
        _kubeconfig(opts["kubeconfig"])
    opts["log-level"], opts["log-format"] = logs.parse_log_options(
        opts["log-level"], opts["log-format"]
    )
    # Every value is judged here, before anything starts (a keeper, the warm preload).
    for name in ("workers", "max-requests", "worker-requests"):
        _int(opts, name, 1)
    if opts["max-workers"]:
        _int(opts, "max-workers", 1)
    for name in ("request-timeout", "shutdown-grace"):
        _float(opts, name)
    if opts["admin-addr"]:
        from multicall.effects.admin_server import parse_address

        parse_address(opts["admin-addr"])
    return opts


def _kubeconfig(path: str) -> None:
    """What a --kubeconfig can never become: "" (an unset variable in a manifest; leave the
    flag out for the service account) and a directory (a mount or a path gone wrong). A
    file that does not exist or cannot be used yet is waited for (agent/identity.py)."""
    import os

    if not path:
        raise UsageError(
            '--kubeconfig "": expected a file (leave the flag out for the service account)'
        )
    if os.path.isdir(path):
        raise UsageError(f"--kubeconfig {_shown(path)}: is a directory, expected a file")


def _int(opts: Mapping[str, str], name: str, minimum: int) -> int:
    """An integer as Go's Atoi reads it (any length, leading zeros free; no spaces, `_` or
    non-ASCII digits, which Python's int() would take)."""
    try:
        value = go_atoi(opts[name])
    except NumError:
        value = minimum - 1
    if value < minimum:
        raise UsageError(f"--{name} {_shown(opts[name])}: expected an integer >= {minimum}")
    return value


_DECIMAL = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")


def _float(opts: Mapping[str, str], name: str) -> float:
    """Seconds: ASCII decimal digits only (float() would also take `inf`, `1e400`, `1_0`)."""
    text = opts[name]
    value = float(text) if _DECIMAL.fullmatch(text) else -1.0
    if not 0 < value < math.inf:
        raise UsageError(f"--{name} {_shown(text)}: expected a positive number of seconds")
    return value


def _shown(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
