"""usage: install-cni [--once | --uninstall | --ready] [--link-nsenter] [--admin-addr ADDR] [--log-level LEVEL] [--log-format FORMAT]

Install cnibox as Linkerd's chained CNI plugin on this node and keep it installed: put the
binary into the host's CNI bin dir (or link to the node's own cnibox from the Talos
extension) with `linkerd-cni` as a symlink to it, write the plugin's kubeconfig, append the
linkerd entry to every CNI network config, then watch the config dir and the service-account
token and re-patch / rewrite on change. SIGTERM or SIGINT undoes everything and exits 0.

  --once          install and patch, then exit without watching or undoing
  --uninstall     stop a running installer (SIGTERM via its pid file), then remove linkerd
                  from every config, the kubeconfig and the installed binary and links
                  (the DaemonSet's preStop hook; the image has no shell)
  --ready         exit 0 when linkerd-cni is installed and chained on this node, else 1
                  with one line saying what is missing (the chart's readiness probe)
  --link-nsenter  also link `nsenter` to cnibox in the bin dir (never done otherwise)
  --admin-addr ADDR
                  while watching, serve /healthz, /readyz (as --ready) and /metrics (the
                  node gate's timings and self-tests) on ADDR, e.g. 127.0.0.1:9992
                  (nothing authenticates it); not served by default
  --log-level LEVEL
                  debug (every event), info (the default), warn or error
  --log-format FORMAT
                  plain (logrus text, the default) or json, as Linkerd's components
  -v, --verbose   the same as --log-level debug
  -h, --help      this text
  --version       print the version

Environment (empty means unset): DEST_CNI_NET_DIR (/etc/cni/net.d), DEST_CNI_BIN_DIR
(/opt/cni/bin), CONTAINER_MOUNT_PREFIX (/host), CNI_NETWORK_CONFIG, CNI_NETWORK_CONFIG_FILE,
KUBECONFIG_FILE_NAME (ZZZ-linkerd-cni-kubeconfig), KUBERNETES_SERVICE_HOST,
KUBERNETES_SERVICE_PORT, KUBE_CA_FILE (ca.crt beside the token), SERVICE_ACCOUNT_DIR
(/var/run/secrets/kubernetes.io/serviceaccount), CNI_CONF_NAME (only this file),
CNIBOX_HOST_BINARY (/usr/local/lib/cnibox/cnibox), CNIBOX_STATE_DIR (undo journal and pid
file: DEST_CNI_BIN_DIR/.cnibox-install-cni), INSTALL_CNI_PID_FILE (in the state dir),
CNIBOX_HOST_CACHE (where the node's launcher cache, /var/lib/cnibox, is mounted: the new
version is unpacked into it at install time, so no pod start pays for the unpack).
CNI_NETWORK_CONFIG (or the file CNI_NETWORK_CONFIG_FILE names) is required: the linkerd-cni
entry to chain, as the chart's ConfigMap key cni_network_config holds it.
Node readiness gate (docs/node-readiness.md): CNIBOX_GATE=true, NODE_NAME, CNIBOX_GATE_TAINT_KEY
(linkerd-cni.cnibox.io/not-ready), CNIBOX_GATE_TAINT_EFFECT (NoSchedule), CNIBOX_GATE_REAPPLY
(true), CNIBOX_GATE_AGENT_SOCKET, CNIBOX_GATE_INTERVAL (10), CNIBOX_GATE_SELFTEST (true).
"""  # noqa: E501 - the usage line stays one line

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, BinaryIO

from multicall.core.installer.metrics import GateMetrics
from multicall.effects.log import Logger
from multicall.errors import CniboxError, UpstreamFatal, UsageError
from multicall.installer.install import Options
from multicall.installer.run import run

if TYPE_CHECKING:
    from multicall.effects.admin_server import AdminServer
    from multicall.gate.run import Gate

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the node agent's too

PROG = "install-cni"


def parse_args(args: Sequence[str]) -> Options:
    from multicall.core import logs, usage

    line = usage.parse(args, usage.options(__doc__ or ""))
    if sum(line.has(m) for m in ("--once", "--uninstall", "--ready")) > 1:
        raise UsageError("--once, --uninstall and --ready exclude each other")
    mode = "once" if line.has("--once") else "uninstall" if line.has("--uninstall") else "watch"
    level = "debug" if line.has("--verbose") else line.value("--log-level", "info") or ""
    level, log_format = logs.parse_log_options(level, line.value("--log-format", "plain") or "")
    return Options(mode, line.has("--link-nsenter"), level, log_format)


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int:
    from multicall.core import usage

    options = parse_args(list(argv[1:]))
    line = usage.parse(list(argv[1:]), usage.options(__doc__ or ""))
    log = Logger(stderr, options.log_level, options.log_format)
    try:
        if line.has("--ready"):
            return _ready(env, log)
        metrics = GateMetrics()
        # the admin server first: a bad or busy address fails before the gate's thread starts
        admin = _admin(line.value("--admin-addr", "") or "", options, env, log, metrics)
        gate = None
        try:
            gate = _gate(options, env, log, metrics)
            status = run(options, env, log)
        finally:
            if admin is not None:
                admin.stop()
            if gate is not None:
                gate.stop()
        if gate is not None and options.mode == "uninstall":
            # after the running installer stopped: nothing re-taints behind this
            for error in gate.uninstall():
                log.error(f"node gate: {error}")
        return status
    except UpstreamFatal as exc:
        log.log("fatal", exc.message, error=exc.error)  # upstream's own last line
        return exc.exit_code
    except CniboxError as exc:
        # a daemon's last words belong in its log, in its format (upstream: log.Fatal)
        log.error(exc.message, **({"hint": exc.hint} if exc.hint else {}))
        return exc.exit_code


def _ready(env: Mapping[str, str], log: Logger) -> int:
    """`--ready`: the plugin file and the chain read back (gate/checks.py `installed`)."""
    from multicall.core.installer.config import parse_environment
    from multicall.gate.checks import installed

    result = installed(parse_environment(env))
    if result.ok:
        return 0
    log.info(f"not ready: {result.name}: {result.detail}")
    return 1


def _admin(
    address: str, options: Options, env: Mapping[str, str], log: Logger, metrics: GateMetrics
) -> AdminServer | None:
    """The admin server beside the watch (--admin-addr): /healthz while the process runs,
    /readyz as --ready, /metrics (core/installer/metrics.py). Watch mode only."""
    if not address or options.mode != "watch":
        return None
    from multicall.core.installer import metrics as installer_metrics
    from multicall.core.installer.config import parse_environment
    from multicall.effects.admin_server import AdminServer, parse_address, probe
    from multicall.effects.admin_server import metrics as metrics_route
    from multicall.gate.checks import installed

    parse_address(address)  # a UsageError naming the flag, before anything starts
    config = parse_environment(env)

    def render() -> bytes:
        return installer_metrics.render(metrics, installed(config).ok).encode()

    server = AdminServer(
        address,
        {
            "/healthz": probe(lambda: True, b"ok\n"),
            "/readyz": probe(lambda: installed(config).ok, b"ready\n", b"not ready\n"),
            "/metrics": metrics_route(render, METRICS_TYPE),
        },
    )
    server.start()
    log.info(f"admin server on {address} (port {server.port}): /healthz, /readyz, /metrics")
    return server


def _gate(
    options: Options, env: Mapping[str, str], log: Logger, metrics: GateMetrics
) -> Gate | None:
    """The node readiness gate beside the watch (CNIBOX_GATE; --once does not gate)."""
    from multicall.core.installer.config import parse_environment
    from multicall.core.node_gate import GateInputError, parse_gate_env
    from multicall.gate.run import Gate

    try:
        config = parse_gate_env(env)
    except GateInputError as exc:
        raise UsageError(str(exc)) from None
    if not config.enabled or options.mode == "once":
        return None
    gate = Gate(config, parse_environment(env), env, log, metrics)
    if options.mode == "watch":
        gate.start()
    return gate
