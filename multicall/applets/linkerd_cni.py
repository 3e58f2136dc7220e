"""usage: linkerd-cni [--help]  (CNI_COMMAND=ADD|CHECK|DEL|STATUS|GC|VERSION, config on stdin)

Linkerd's chained CNI plugin, a drop-in for upstream's `linkerd-cni` binary: the container
runtime runs it with the CNI_* environment and the plugin's network config on stdin.

  ADD      look the pod up in the Kubernetes API; if it runs linkerd-proxy without
           linkerd-init, program Linkerd's iptables redirect in its network namespace
           (in-process: no nsenter, no iptables binaries); print prevResult unchanged
  CHECK    (cniVersion >= 0.4.0) compare the pod's live nat table with the rules ADD
           would program; a difference is CNI error 999 with the diff in `details`
  DEL      nothing to undo (the rules go with the namespace); succeeds when repeated
  STATUS   (1.1.0) error 50 when the kubeconfig named in the config cannot be read
  GC       nothing to collect
  VERSION  the supported CNI spec versions

Errors are CNI error JSON on stdout with exit status 1; logs go to stderr only
(level from the config's `log_level`). CNIBOX_KUBE_TIMEOUT bounds each API request
(seconds, default 5).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from multicall.applet import AppletSpec, write_text
from multicall.errors import CNI_INTERNAL, CniboxError, CniError, cni_code_of

if TYPE_CHECKING:
    from multicall.core.cni_config import NetConf
    from multicall.core.cni_protocol import CniEnv, PodIdentity, Result
    from multicall.core.firewall import ProxyInitOptions
    from multicall.effects.kube import KubeClient
    from multicall.errors import KubeError

LEVELS = {"debug": 0, "info": 1, "warning": 2, "error": 3}
CNI_NOT_READY = 50


class Logger:
    """logrus's text format on stderr; the level follows `log_level` once the config is read."""

    def __init__(self, stream: BinaryIO, level: str = "info") -> None:
        self.stream = stream
        self.level = level
        self.fields: dict[str, str] = {}

    def set_level(self, level: str) -> None:
        self.level = "warning" if level == "warn" else level

    def log(self, level: str, message: str) -> None:
        if LEVELS[level] < LEVELS[self.level]:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        extra = "".join(f" {k}={_logfmt(v)}" for k, v in sorted(self.fields.items()))
        write_text(
            self.stream, f"time={_logfmt(stamp)} level={level} msg={_logfmt(message)}{extra}\n"
        )

    def debug(self, message: str) -> None:
        self.log("debug", message)

    def info(self, message: str) -> None:
        self.log("info", message)

    def error(self, message: str) -> None:
        self.log("error", message)


def _logfmt(value: str) -> str:
    if value and all(c.isalnum() or c in "-._/@^+" for c in value):
        return value
    from multicall.core.gojson import go_quote

    return go_quote(value)


@dataclass(frozen=True, slots=True)
class Invocation:
    env: CniEnv
    stdin: bytes
    stdout: BinaryIO
    log: Logger
    process_env: Mapping[str, str]


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int:
    if list(argv[1:2]) in (["--help"], ["-h"]):
        write_text(stdout, __doc__ or "")
        return 0
    log = Logger(stderr)
    try:
        dispatch(env, stdin, stdout, log)
    except CniboxError as exc:
        return fail(stdout, cni_code_of(exc), exc.message, exc.details)
    except Exception as exc:  # noqa: BLE001 - the CNI boundary: no traceback on stdout, ever
        if env.get("CNIBOX_DEBUG"):
            import traceback

            write_text(stderr, traceback.format_exc())
        return fail(stdout, CNI_INTERNAL, f"{type(exc).__name__}: {exc}")
    return 0


def fail(stdout: BinaryIO, code: int, message: str, details: str = "") -> int:
    from multicall.core.cni_protocol import render_error

    stdout.write(render_error(code, message, details))
    stdout.flush()
    return 1


def dispatch(env: Mapping[str, str], stdin: BinaryIO, stdout: BinaryIO, log: Logger) -> None:
    """skel's PluginMainFuncs: validate in skel's order, then run the command's handler."""
    from multicall.core import cni_protocol as cni

    cni_env = cni.read_env(env)
    if cni_env.command == "VERSION":
        stdout.write(cni.VERSION_REPLY)
        stdout.flush()
        return
    data = stdin.read()
    cni.validate_config(data)
    handler = HANDLERS.get(cni_env.command)
    if handler is None:
        raise CniError(4, f"unknown CNI_COMMAND: {cni_env.command}")
    cni.check_version(cni_env.command, cni.decode_version(data))
    handler(Invocation(cni_env, data, stdout, log, env))


# ----------------------------------------------------------------------------- ADD


def cmd_add(inv: Invocation) -> None:
    from multicall.core import cni_protocol as cni

    conf = read_config(inv)
    prev = prev_result(conf)
    identity = pod_identity(inv)
    if identity.complete:
        configure_pod(inv, conf, identity)
    else:
        inv.log.debug("linkerd-cni: no Kubernetes namespace or pod name found, skipping.")
    inv.log.debug("linkerd-cni: plugin is finished")
    try:
        out = cni.print_result(prev or cni.empty_result(), conf.cni_version)
    except cni.ResultError as exc:
        raise CniError(CNI_INTERNAL, str(exc)) from None
    inv.stdout.write(out)
    inv.stdout.flush()
    refuse_own_netns(inv.env)


def read_config(inv: Invocation) -> NetConf:
    from multicall.core.cni_config import log_level, parse_netconf

    try:
        conf = parse_netconf(inv.stdin)
    except CniError as exc:
        inv.log.error(f"error parsing config: {exc.message}")
        raise
    inv.log.set_level(log_level(conf))
    return conf


def prev_result(conf: NetConf) -> Result | None:
    """parseConfig's prevResult handling: parse with the config's version, lift to 1.1.0."""
    from multicall.core import cni_protocol as cni

    if conf.prev_result is None:
        return None
    try:
        parsed = cni.create_result(conf.cni_version, conf.prev_result)
    except cni.ResultError as exc:
        raise CniError(CNI_INTERNAL, f"linkerd-cni: could not parse prevResult: {exc}") from None
    try:
        return cni.convert(parsed, cni.IMPLEMENTED_VERSION)
    except cni.ResultError as exc:
        raise CniError(
            CNI_INTERNAL, f"linkerd-cni: could not convert result to version 1.0: {exc}"
        ) from None


def pod_identity(inv: Invocation) -> PodIdentity:
    from multicall.core.cni_protocol import parse_cni_args

    try:
        identity = parse_cni_args(inv.env.args)
    except CniError as exc:
        inv.log.error(f"error loading args {exc.message}")
        raise
    inv.log.fields = {
        "ContainerID": inv.env.container_id,
        "Pod": identity.name,
        "Namespace": identity.namespace,
    }
    return identity


def configure_pod(inv: Invocation, conf: NetConf, identity: PodIdentity) -> None:
    options = pod_options(inv, conf, identity)
    if options is None:
        return
    from multicall.core.cni_config import mode_of
    from multicall.effects.firewall import apply_proxy_init

    mode = mode_of(conf)
    refuse_own_netns(inv.env)
    apply_proxy_init(
        inv.env.netns,
        options,
        mode=mode,
        ipv6=conf.ipv6,
        simulate=conf.simulate,
        allow_own_netns=inv.env.override_netns_check,
        log=inv.log.info,
    )


def pod_options(inv: Invocation, conf: NetConf, identity: PodIdentity) -> ProxyInitOptions | None:
    """The effective options for a meshed pod, None for a pod that gets no rules."""
    from multicall.core.cni_config import base_options
    from multicall.core.pod_policy import decide, effective_options
    from multicall.effects.kube import read_pod_inputs

    def service_error(exc: KubeError) -> None:
        inv.log.error(f"linkerd-cni: could not retrieve ports from 'kubernetes' service: {exc}")

    client = kube_client(inv, conf)
    try:
        inputs = read_pod_inputs(
            client, identity.namespace, identity.name, on_service_error=service_error
        )
    finally:
        client.close()
    decision = decide(inputs.pod)
    inv.log.debug(decision.message)
    if not decision.meshed:
        return None
    options = effective_options(
        base_options(conf), inputs.pod, inputs.namespace_annotations, inputs.service
    )
    inv.log.debug(f"linkerd-cni: effective options {options}")
    return options


def kube_client(inv: Invocation, conf: NetConf) -> KubeClient:
    from multicall.effects.kube import KubeClient, read_kubeconfig, timeout_from_env

    config = read_kubeconfig(conf.kubeconfig)
    return KubeClient(config, timeout=timeout_from_env(inv.process_env))


def refuse_own_netns(env: CniEnv) -> None:
    """skel's check after ADD/DEL; here also before programming, so the host is never touched."""
    from multicall.effects.ns import is_own_netns

    if env.override_netns_check or not env.netns:
        return
    try:
        own = is_own_netns(env.netns)
    except OSError:
        return  # unopenable paths are accepted, as skel's CheckNetNS does
    if own:
        raise CniError(8, "plugin's netns and netns from CNI_NETNS should not be the same")


# ----------------------------------------------------------------------------- CHECK


def cmd_check(inv: Invocation) -> None:
    conf = read_config(inv)
    prev_result(conf)
    identity = pod_identity(inv)
    if not identity.complete:
        inv.log.debug("linkerd-cni: no Kubernetes namespace or pod name found, nothing to check")
        return
    options = pod_options(inv, conf, identity)
    if options is None:
        return
    problems = diff_pod_rules(inv, conf, options)
    if problems:
        raise CniError(
            CNI_INTERNAL,
            f"linkerd-cni: the iptables rules in {inv.env.netns} differ from the expected ones",
            "\n".join(problems),
        )
    inv.log.info(f"linkerd-cni: check: the rules in {inv.env.netns} are as expected")


def diff_pod_rules(inv: Invocation, conf: NetConf, options: ProxyInitOptions) -> list[str]:
    """One readable diff per family whose live nat table lacks what ADD would program."""
    from multicall.core.cni_config import mode_of
    from multicall.effects.firewall import differences

    mode = mode_of(conf)
    refuse_own_netns(inv.env)
    return differences(
        inv.env.netns,
        options,
        mode=mode,
        ipv6=conf.ipv6,
        allow_own_netns=inv.env.override_netns_check,
        log=inv.log.info,
    )


# ----------------------------------------------------------------------------- DEL, STATUS, GC


def cmd_del(inv: Invocation) -> None:
    inv.log.info("linkerd-cni: delete: nothing to undo, the rules go with the network namespace")
    refuse_own_netns(inv.env)


def cmd_status(inv: Invocation) -> None:
    from multicall.effects.kube import read_kubeconfig
    from multicall.errors import KubeError

    conf = read_config(inv)
    try:
        read_kubeconfig(conf.kubeconfig)
    except KubeError as exc:
        raise CniError(
            CNI_NOT_READY,
            "linkerd-cni: the kubeconfig is missing or unreadable",
            f"{conf.kubeconfig or '(kubernetes.kubeconfig not set)'}: {exc.message}",
        ) from None


def cmd_gc(inv: Invocation) -> None:
    inv.log.debug("linkerd-cni: gc: nothing to collect")


HANDLERS: dict[str, Callable[[Invocation], None]] = {
    "ADD": cmd_add,
    "CHECK": cmd_check,
    "DEL": cmd_del,
    "STATUS": cmd_status,
    "GC": cmd_gc,
}

SPEC = AppletSpec(
    name="linkerd-cni",
    summary="Linkerd's chained CNI plugin (upstream-compatible, no host binaries)",
    help=__doc__ or "",
    main=main,
    install_dir="/opt/cni/bin",
    needs_root="programs iptables rules inside pod network namespaces",
)
