"""usage: linkerd-cni-repair-controller --node-name NODE --controller-pod-name POD [OPTIONS]

Linkerd's CNI repair controller, a drop-in for upstream's Rust binary of the same name: it
watches the pods on this node that Linkerd injected (label linkerd.io/control-plane-ns) and
deletes each one whose linkerd-network-validator init container last exited with 95 (the
redirect was missing: the pod started before the CNI chain was complete), so that its
controller recreates it with the chain in place. Each deletion is announced with an
events.k8s.io Event (reason LinkerdCNINotConfigured, action Deleting).

Options (upstream's; each also read from its environment variable):
  --node-name NAME              this node        [env: LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME]
  --controller-pod-name NAME    this pod, the Events' reportingInstance
                                                 [env: LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME]
  --log-level FILTER            [env: LINKERD_CNI_REPAIR_CONTROLLER_LOG_LEVEL]
                                [default: linkerd_cni_repair_controller=info,warn]
  --log-format plain|json       [env: LINKERD_CNI_REPAIR_CONTROLLER_LOG_FORMAT] [default: plain]
  --admin-addr HOST:PORT        /live, /ready and /metrics  [default: 0.0.0.0:9990]
  --kubeconfig PATH, --context NAME, --cluster NAME, --user NAME, --as USER, --as-group GROUP
                                the API client (default: $KUBECONFIG or ~/.kube/config when
                                present, else the pod's service account, in-cluster)
  --kube-api-response-headers-timeout DURATION   [default: 9s]
  -h, --help, -V, --version

cnibox's additions:
  --watch-timeout DURATION      the watch's server-side timeoutSeconds [default: 290s]; the
                                client drops a watch silent for 30 s longer
  --error-delay DURATION        wait after consecutive API errors, doubling up to 30 s
                                (jittered) [default: 5s]
  --repair-in-place             before deleting, program the pod's redirect in its sandbox
                                network namespace found through the CNI result cache
                                (docs/repair-controller.md); fall back to deleting
  --cni-net-dir DIR             the node's CNI config dir    [default: /host/etc/cni/net.d]
  --cni-cache-dir DIR           libcni's cache dir           [default: /host/var/lib/cni]
  --host-root DIR               where the node's / is mounted, for netns paths and the node's
                                xtables lock (run/xtables.lock under it) [default: /host]

SIGTERM or SIGINT stops it (exit 0). Logs go to stdout, as upstream's do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import BinaryIO

from multicall.core.openmetrics import CONTENT_TYPE
from multicall.core.repair.cli import Options, parse_args
from multicall.core.tracing_log import LEVELS, parse_filter
from multicall.core.usage import Show
from multicall.errors import EXIT_OK
from multicall.repair.controller import CONTROLLER, Controller
from multicall.repair.logger import TracingLogger
from multicall.repair.metrics import Metrics

DEBUG, INFO = LEVELS["debug"], LEVELS["info"]


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int | Show:
    options = parse_args(argv[1:], env)
    if isinstance(options, Show):
        return options  # printed by dispatch.run_applet
    return run(options, env, stdout)


def run(options: Options, env: Mapping[str, str], stdout: BinaryIO) -> int:
    import signal

    from multicall.effects import admin_server
    from multicall.effects.admin_server import AdminServer
    from multicall.effects.kube.stream import ClientOptions, load_config

    logger = TracingLogger(stdout, parse_filter(options.log_level), options.log_format)
    client = ClientOptions(
        kubeconfig=options.kubeconfig,
        context=options.context,
        cluster=options.cluster,
        user=options.user,
        impersonate_user=options.impersonate_user,
        impersonate_groups=(options.impersonate_group,) if options.impersonate_group else (),
        headers_timeout=options.headers_timeout,
    )
    config = load_config(client, env)
    metrics = Metrics(repair_in_place=options.repair_in_place)
    repairer = None
    if options.repair_in_place:
        from multicall.effects.pod_sandbox import SandboxFinder
        from multicall.plugin.in_place import ControllerKube, Repairer, node_xtables_lock
        from multicall.plugin.ports import RealFirewall

        repairer = Repairer(
            SandboxFinder(options.cni_net_dir, options.cni_cache_dir, options.host_root),
            ControllerKube(config),
            log=lambda message: logger(DEBUG, CONTROLLER, message),
            firewall=RealFirewall(lock=node_xtables_lock(options.host_root)),
        )
    controller = Controller(options, config, client, logger, metrics, repairer=repairer)
    # Signals are taken synchronously by the main thread (sigwait): no handler has to run
    # between two bytecodes, which compiled code (Nuitka) does not guarantee.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # inherited by every thread below
    admin = AdminServer(
        options.admin_addr,
        {  # kubert's admin endpoints and answers
            "/live": admin_server.probe(lambda: True, b"alive\n"),
            "/ready": admin_server.probe(lambda: controller.ready, b"ready\n", b"not ready\n"),
            "/metrics": admin_server.metrics(metrics.render, CONTENT_TYPE),
        },
    )
    admin.start()
    logger(DEBUG, "kubert::admin", "Serving", port=admin.port)
    controller.start()
    signum = signal.sigwait(stop_signals)
    logger(
        INFO,
        "kubert::shutdown",
        "Received signal, shutting down",
        signal=signal.Signals(signum).name,
    )
    controller.stop()
    admin.stop()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)
    return EXIT_OK
