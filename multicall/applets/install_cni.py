"""usage: install-cni [--once | --uninstall] [--link-nsenter] [--log-level LEVEL] [--log-format FORMAT]

Install cnibox as Linkerd's chained CNI plugin on this node and keep it installed: put the
binary into the host's CNI bin dir (or link to the node's own cnibox from the Talos
extension) with `linkerd-cni` as a symlink to it, write the plugin's kubeconfig, append the
linkerd entry to every CNI network config, then watch the config dir and the service-account
token and re-patch / rewrite on change. SIGTERM or SIGINT undoes everything and exits 0.

  --once          install and patch, then exit without watching or undoing
  --uninstall     stop a running installer (SIGTERM via its pid file), then remove linkerd
                  from every config, the kubeconfig and the installed binary and links
                  (the DaemonSet's preStop hook; the image has no shell)
  --link-nsenter  also link `nsenter` to cnibox in the bin dir (never done otherwise)
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

from multicall.effects.log import Logger
from multicall.errors import CniboxError, UpstreamFatal, UsageError
from multicall.installer.install import Options
from multicall.installer.run import run

if TYPE_CHECKING:
    from multicall.gate.run import Gate

PROG = "install-cni"


def parse_args(args: Sequence[str]) -> Options:
    from multicall.core import logs, usage

    line = usage.parse(args, usage.options(__doc__ or ""))
    if line.has("--once") and line.has("--uninstall"):
        raise UsageError("--once and --uninstall exclude each other")
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
    options = parse_args(list(argv[1:]))
    log = Logger(stderr, options.log_level, options.log_format)
    try:
        gate = _gate(options, env, log)
        try:
            status = run(options, env, log)
        finally:
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


def _gate(options: Options, env: Mapping[str, str], log: Logger) -> Gate | None:
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
    gate = Gate(config, parse_environment(env), env, log)
    if options.mode == "watch":
        gate.start()
    return gate
