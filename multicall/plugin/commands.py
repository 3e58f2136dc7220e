"""The plugin's commands, given their ports: what upstream's cmdAdd/cmdCheck/cmdDel do, with
the Kubernetes API and the firewall passed in (Istio's doAddRun(args, conf, kubeClient,
ruleMgr)). `run.run_plugin` has already done skel's checks when a handler runs.

Rules of this module:
1. MessageLog lines and their levels are upstream's (docs/upstream-behaviour.md §3); errors are
   raised (CniboxError) and turned into CNI error JSON by `run.run_plugin` alone.
2. Nothing here touches the kernel or the network directly: the API goes through
   `deps.kube`, rules through `deps.firewall`; the only effect is skel's own-netns check.
3. Simulate mode and the dropped-port log lines happen here, for every firewall alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from multicall.errors import CNI_INTERNAL, CNI_INVALID_NETNS, CNI_NOT_READY, CniError

if TYPE_CHECKING:
    from multicall.core.cni.netconf import NetConf
    from multicall.core.cni.result import Result
    from multicall.core.cni.skel import CniEnv, PodIdentity
    from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
    from multicall.core.keeper import Reason
    from multicall.core.kube.pod_policy import Decision
    from multicall.core.logs import MessageLog
    from multicall.effects.log import Logger
    from multicall.effects.ns import NetnsRef
    from multicall.errors import KubeError
    from multicall.plugin.ports import Firewall, PluginDeps


@dataclass(slots=True)
class Progress:
    """What the command is doing, for the one error line `run.run_plugin` logs if it fails."""

    step: str = ""


@dataclass(frozen=True, slots=True)
class Call:
    """One invocation, after skel's checks: its CNI_* values, config bytes, ports and sinks."""

    env: CniEnv
    stdin: bytes
    stdout: BinaryIO  # what the plugin prints (a buffer: run_plugin returns its bytes)
    log: Logger
    process_env: Mapping[str, str]  # the plugin's whole environment (CNIBOX_KUBE_TIMEOUT)
    netns: NetnsRef  # CNI_NETNS, possibly as an fd the caller opened
    deps: PluginDeps
    progress: Progress = field(default_factory=Progress)

    def step(self, doing: str) -> None:
        """Name what comes next ("reading pod ns/name from the Kubernetes API")."""
        self.progress.step = doing


# ----------------------------------------------------------------------------- ADD


def add(call: Call) -> None:
    from multicall.core.cni import result as cni_result

    conf = read_config(call)
    prev = prev_result(call, conf)
    config_parsed(call, conf)
    identity = pod_identity(call)
    if identity.complete:
        configure_pod(call, conf, identity)
    else:
        call.log.debug("linkerd-cni: no Kubernetes namespace or pod name found, skipping.")
    call.log.debug("linkerd-cni: plugin is finished")
    call.step("printing the result")
    try:
        out = cni_result.print_result(prev or cni_result.empty_result(), conf.cni_version)
    except cni_result.ResultError as exc:
        raise CniError(CNI_INTERNAL, str(exc)) from None
    call.stdout.write(out)
    call.step("checking CNI_NETNS")
    refuse_own_netns(call)


def read_config(call: Call) -> NetConf:
    """The network config; then the log level and log file it asks for, and (at debug) the
    config itself, secrets redacted."""
    from multicall.core.cni.netconf import log_level, parse_netconf
    from multicall.core.logs import loggable_json

    call.step("parsing the network config")
    conf = parse_netconf(call.stdin)
    if not call.process_env.get("CNIBOX_DEBUG"):
        call.log.set_level(log_level(conf))
    if conf.log_file:
        call.log.open_file(conf.log_file, files=call.deps.files)
    if call.log.enabled("debug"):
        call.log.debug(f"linkerd-cni: stdin to plugin: {loggable_json(call.stdin)}")
    return conf


def config_parsed(call: Call, conf: NetConf) -> None:
    """upstream's "cmdAdd, config parsed" debug line: the version and prevResult fields."""
    if not call.log.enabled("debug"):
        return
    import json

    from multicall.core.logs import redact

    fields = {"version": conf.cni_version}
    if conf.prev_result is not None:
        prev = json.dumps(redact(conf.prev_result), separators=(",", ":"), ensure_ascii=False)
        fields["prevResult"] = prev
    call.log.debug("linkerd-cni: cmdAdd, config parsed", **fields)


def prev_result(call: Call, conf: NetConf) -> Result | None:
    """parseConfig's prevResult handling: parse with the config's version, lift to 1.1.0."""
    from multicall.core.cni import result as cni_result
    from multicall.core.cni.skel import IMPLEMENTED_VERSION

    if conf.prev_result is None:
        return None
    call.step("parsing prevResult")
    try:
        parsed = cni_result.create_result(conf.cni_version, conf.prev_result)
    except cni_result.ResultError as exc:
        raise CniError(CNI_INTERNAL, f"linkerd-cni: could not parse prevResult: {exc}") from None
    try:
        return cni_result.convert(parsed, IMPLEMENTED_VERSION)
    except cni_result.ResultError as exc:
        raise CniError(
            CNI_INTERNAL, f"linkerd-cni: could not convert result to version 1.0: {exc}"
        ) from None


def pod_identity(call: Call) -> PodIdentity:
    from multicall.core.cni.skel import parse_cni_args

    call.step("parsing CNI_ARGS")
    identity = parse_cni_args(call.env.args)
    call.log.fields = {
        "ContainerID": call.env.container_id,
        "Pod": identity.name,
        "Namespace": identity.namespace,
    }
    return identity


def configure_pod(call: Call, conf: NetConf, identity: PodIdentity) -> None:
    options = pod_options(call, conf, identity)
    if options is None:
        return
    from multicall.core.cni.netconf import mode_of
    from multicall.core.firewall.model import Mode, families
    from multicall.core.firewall.proxy_init import build_run_argv, invalid_ports

    call.step(f"programming the firewall in {call.env.netns}")
    mode = mode_of(conf)
    refuse_own_netns(call)
    for dropped in invalid_ports(options):
        call.log.info(dropped.message())
    wanted = families(ipv6=conf.ipv6)
    if conf.simulate:
        # upstream's simulate output: each command line, the existing rules taken as empty;
        # the nftables mode has no upstream commands: the tables it would program, as nft
        # lists them
        if mode is Mode.NFTABLES:
            for line in native_lines(options, wanted):
                call.log.info(line)
            return
        # Upstream logs Go's cmd.String(), where nsenter is resolved through the plugin's
        # PATH (/usr/bin/nsenter on most hosts; just `nsenter` where there is none, Talos).
        from multicall.effects.process import look_path

        nsenter = look_path("nsenter", call.process_env)
        for family in wanted:
            for argv in build_run_argv(options, family, mode=mode, netns=call.env.netns):
                call.log.info(" ".join((nsenter, *argv[1:])))
        return
    call.deps.firewall.apply(call.netns, options, mode=mode, families=wanted, log=call.log.info)


def native_lines(options: ProxyInitOptions, wanted: tuple[Family, ...]) -> list[str]:
    """The nftables mode's tables for `options`, as `nft list table` prints them."""
    from multicall.core.firewall.nft.native import native_table, render

    return [line for family in wanted for line in render(native_table(options, family), family)]


def pod_options(call: Call, conf: NetConf, identity: PodIdentity) -> ProxyInitOptions | None:
    """The effective options for a meshed pod, None for a pod that gets no rules."""
    from multicall.core.cni.netconf import base_options
    from multicall.plugin.expected import options_for_pod
    from multicall.plugin.pod_inputs import read_pod_inputs

    def service_error(exc: KubeError) -> None:
        call.log.error(f"linkerd-cni: could not retrieve ports from 'kubernetes' service: {exc}")

    def decided(decision: Decision) -> None:
        call.log.debug(decision.message)
        if decision.meshed:
            call.step("applying the pod's config.linkerd.io annotations")

    call.step(f"loading the kubeconfig {conf.kubeconfig or '(kubernetes.kubeconfig not set)'}")
    api = call.deps.kube.connect(conf.kubeconfig, call.process_env)
    call.step(f"reading pod {identity.namespace}/{identity.name} from the Kubernetes API")
    try:
        inputs = read_pod_inputs(
            api, identity.namespace, identity.name, on_service_error=service_error
        )
    finally:
        api.close()
    options = options_for_pod(base_options(conf), inputs, on_decision=decided).options
    if options is None:
        return None
    call.log.debug(f"linkerd-cni: effective options {options}")
    return options


def refuse_own_netns(call: Call) -> None:
    """skel's check after ADD/DEL; here also before programming, so the host is never touched."""
    from multicall.effects.ns import is_own_netns

    if call.env.override_netns_check or not call.env.netns:
        return
    if call.netns.fd is None:
        return  # not openable as a network namespace: accepted, as skel's CheckNetNS does
    try:
        own = is_own_netns(call.netns)
    except OSError:
        return
    if own:
        raise CniError(
            CNI_INVALID_NETNS, "plugin's netns and netns from CNI_NETNS should not be the same"
        )


# ----------------------------------------------------------------------------- CHECK


def check(call: Call) -> None:
    conf = read_config(call)
    prev_result(call, conf)
    identity = pod_identity(call)
    if not identity.complete:
        call.log.debug("linkerd-cni: no Kubernetes namespace or pod name found, nothing to check")
        return
    options = pod_options(call, conf, identity)
    if options is None:
        return
    if conf.simulate:
        # ADD only logged the commands (configure_pod): there is nothing it programmed.
        call.log.info("linkerd-cni: check: simulate is set, ADD programmed no rules to check")
        return
    problems = diff_pod_rules(call, conf, options)
    if problems:
        call.step("")
        raise CniError(
            CNI_INTERNAL,
            f"linkerd-cni: the iptables rules in {call.env.netns} differ from the expected ones",
            "\n".join(problems),
        )
    call.log.info(f"linkerd-cni: check: the rules in {call.env.netns} are as expected")


def diff_pod_rules(call: Call, conf: NetConf, options: ProxyInitOptions) -> list[str]:
    """One readable diff per family whose live nat table lacks what ADD would program."""
    from multicall.core.cni.netconf import mode_of
    from multicall.core.firewall.model import families

    call.step(f"reading the nat table in {call.env.netns}")
    mode = mode_of(conf)
    refuse_own_netns(call)
    found = drifted_families(
        call.deps.firewall,
        call.netns,
        options,
        mode=mode,
        families=families(ipv6=conf.ipv6),
        log=call.log.info,
    )
    return readable(found)


def readable(found: list[FamilyDrift]) -> list[str]:
    """CHECK's report of `drifted_families`: one readable diff per family whose live nat table
    is not what ADD programs (empty: exactly the expected rules); in the nftables mode, the
    family's `linkerd-proxy-init` table as nft lists it, as a line diff of the two texts.
    The repair controller checks a repaired sandbox with it too (plugin/in_place.py)."""
    return [f"{drift.family.value}:\n{drift.text}" for drift in found]


@dataclass(frozen=True, slots=True)
class FamilyDrift:
    """One family whose live table differs from ADD's: the readable diff, and its kinds."""

    family: Family
    text: str
    reasons: tuple[Reason, ...]


def drifted_families(
    firewall: Firewall,
    netns: NetnsRef,
    options: ProxyInitOptions,
    *,
    mode: Mode,
    families: tuple[Family, ...],
    log: MessageLog,
) -> list[FamilyDrift]:
    """CHECK's comparison: each family whose live table is not what ADD programs for
    `options`, with the readable diff and the kinds of each difference (the node agent's
    keeper counts and reports them: agent/keeper.py; `readable` words them for CHECK)."""
    from multicall.core.firewall.diff import diff_tables
    from multicall.core.firewall.model import Mode
    from multicall.core.firewall.nft.native import diff_text, native_table, render
    from multicall.core.firewall.report import format_diff
    from multicall.core.keeper import diff_reasons, native_reasons
    from multicall.plugin.expected import expected_for_pod

    found: list[FamilyDrift] = []
    for family in families:
        if mode is Mode.NFTABLES:
            wanted = render(native_table(options, family), family)
            live = firewall.dump_native(netns, family=family, log=log)
            text = diff_text(wanted, render(live, family))
            reasons = native_reasons(wanted, None if live is None else render(live, family))
        else:
            actual = firewall.dump_nat(netns, mode=mode, family=family, log=log)
            raw = firewall.dump_raw(netns, mode=mode, family=family, log=log)
            expected = expected_for_pod(options, family, present=actual)
            diff = diff_tables(expected, actual, raw=raw)
            text = "" if diff.ok else format_diff(diff)
            reasons = diff_reasons(diff)
        if text:
            found.append(FamilyDrift(family, text, reasons))
    return found


# ----------------------------------------------------------------------------- DEL, STATUS, GC


def delete(call: Call) -> None:
    call.log.info("linkerd-cni: delete: nothing to undo, the rules go with the network namespace")
    refuse_own_netns(call)


def status(call: Call) -> None:
    from multicall.errors import KubeError

    conf = read_config(call)
    call.step("checking the kubeconfig")
    try:
        call.deps.kube.check_kubeconfig(conf.kubeconfig)
    except KubeError as exc:
        raise CniError(
            CNI_NOT_READY,
            "linkerd-cni: the kubeconfig is missing or unreadable",
            f"{conf.kubeconfig or '(kubernetes.kubeconfig not set)'}: {exc.message}",
        ) from None


def gc(call: Call) -> None:
    call.log.debug("linkerd-cni: gc: nothing to collect")


HANDLERS: dict[str, Callable[[Call], None]] = {
    "ADD": add,
    "CHECK": check,
    "DEL": delete,
    "STATUS": status,
    "GC": gc,
}
