"""The seam: one linkerd-cni invocation as a function of its inputs.

`run_plugin(PluginRequest(env, stdin, stderr, netns_fd, caller_netns_fd), deps)` returns the
exact bytes the `linkerd-cni` binary prints, its exit status and the CNI error it printed.
The applet is a thin wrapper around it; the node agent runs ADDs through it in its own
process (the pod's and the caller's network namespaces given as fds); tests drive it with
fake ports, without root.

Rules of this module:
1. skel's order: CNI_* environment, VERSION (answered without reading the config), the
   config's name, the command, the command's version gate, then the handler.
2. This is the CNI applet's one error boundary: a `CniboxError` becomes CNI error JSON with
   its code (`errors.cni_code_of`), anything else CNI code 999 with its type name; never a
   traceback on stdout (at log level debug, the traceback goes to the log sink).
3. A request a node agent's worker cannot serve (`errors.ServeElsewhere`: nothing was
   changed) is not a failure: the result says so (`served_elsewhere`) and nothing is
   printed or logged; its caller runs it itself.
4. Every failure is logged here, once, at error level, with the pod's fields (ContainerID,
   Namespace, Pod) and the step that failed, before the CNI error is returned: the node's
   log shows why a pod did not start even when the runtime drops the error JSON.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from multicall.effects.log import Logger
from multicall.errors import (
    CNI_INTERNAL,
    CNI_INVALID_ENV,
    CniboxError,
    CniError,
    ServeElsewhere,
    cni_code_of,
)

if TYPE_CHECKING:
    from multicall.plugin.commands import Progress
    from multicall.plugin.ports import PluginDeps


@dataclass(frozen=True, slots=True)
class PluginRequest:
    """Everything one invocation reads. Fds are borrowed: never closed by the plugin."""

    env: Mapping[str, str]  # the caller's environment: CNI_* (+ CNIBOX_KUBE_TIMEOUT, ...DEBUG)
    stdin: bytes  # the network config bytes the runtime wrote
    stderr: BinaryIO  # log sink: logrus text lines (level from the config's log_level;
    # with the config's log_file, the lines also go to that file)
    netns_fd: int | None = None  # the pod netns (CNI_NETNS) already open; None: open CNI_NETNS
    caller_netns_fd: int | None = None  # the caller's own netns; None: this thread's
    netlink_fd: int | None = None  # a netfilter netlink socket the caller made in the pod netns
    for_caller: bool = False  # a node agent's worker serves a caller: hand back (rule 3)
    caller_may_enter: bool = False  # that caller may have the worker enter a netns (ns.NetnsRef)


@dataclass(frozen=True, slots=True)
class PluginError:
    """The CNI error an invocation printed, as values (the agent's metrics, repair's
    messages read it here instead of parsing `stdout`)."""

    code: int
    msg: str
    details: str = ""


@dataclass(frozen=True, slots=True)
class PluginResult:
    """What one invocation prints on stdout and exits with."""

    stdout: bytes  # exactly what `linkerd-cni` prints: result, VERSION reply or error JSON
    exit_code: int  # 0, or 1 with a CNI error in `stdout`
    error: PluginError | None = None  # that error (exit_code 1)
    served_elsewhere: str = ""  # why the caller must serve it itself (rule 3); nothing printed


def run_plugin(request: PluginRequest, deps: PluginDeps | None = None) -> PluginResult:
    """Run one CNI command; `deps` None means the real API client and firewall."""
    from multicall.core.cni.skel import log_fields
    from multicall.plugin.commands import Progress

    stdout = io.BytesIO()
    # CNIBOX_DEBUG: debug lines whatever the config's log_level (docs/linkerd-cni.md)
    level = "debug" if request.env.get("CNIBOX_DEBUG") else "info"
    log = Logger(request.stderr, level, fields=log_fields(request.env))
    progress = Progress()
    try:
        _dispatch(request, deps, stdout, log, progress)
    except ServeElsewhere as exc:
        if not request.for_caller:  # cannot happen: only a caller's descriptors raise it
            _log_failure(log, request, progress, exc.message)
            return _failed(stdout, CNI_INTERNAL, exc.message)
        return PluginResult(b"", 1, served_elsewhere=exc.reason)
    except CniboxError as exc:
        _log_failure(log, request, progress, exc.message, exc.details)
        return _failed(stdout, cni_code_of(exc), exc.message, exc.details)
    except Exception as exc:  # noqa: BLE001 - the CNI boundary: no traceback on stdout, ever
        message = f"{type(exc).__name__}: {exc}"
        _log_failure(log, request, progress, message)
        if log.enabled("debug"):
            import traceback

            log.debug("linkerd-cni: internal error", traceback=traceback.format_exc())
        return _failed(stdout, CNI_INTERNAL, message)
    finally:
        log.close()
    return PluginResult(stdout.getvalue(), 0)


def read_config_stream(stdin: BinaryIO) -> bytes:
    """The network config from the runtime's stdin: at most one byte more than the limit is
    read, so an endless or huge stream costs bounded memory (run_plugin refuses it)."""
    from multicall.core.limits import NETWORK_CONFIG

    return stdin.read(NETWORK_CONFIG + 1)


def _log_failure(
    log: Logger, request: PluginRequest, progress: Progress, message: str, details: str = ""
) -> None:
    """The one error line of a failed invocation, with the pod's fields, before its CNI
    error is returned (upstream logs most failures with logrus.Errorf; cnibox logs all)."""
    command = request.env.get("CNI_COMMAND") or "(no CNI_COMMAND)"
    step = f" while {progress.step}" if progress.step else ""
    text = message.removeprefix("linkerd-cni: ")
    extra = {"details": details} if details else {}
    log.error(f"linkerd-cni: {command[:32]} failed{step}: {text}", **extra)


def _failed(stdout: io.BytesIO, code: int, message: str, details: str = "") -> PluginResult:
    from multicall.core.cni.skel import render_error

    stdout.write(render_error(code, message, details))
    return PluginResult(stdout.getvalue(), 1, PluginError(code, message, details))


def _dispatch(
    request: PluginRequest,
    deps: PluginDeps | None,
    stdout: BinaryIO,
    log: Logger,
    progress: Progress,
) -> None:
    """skel's PluginMainFuncs: validate in skel's order, then run the command's handler."""
    from multicall.core.cni import skel

    cni_env = skel.read_env(request.env)
    if cni_env.command == "VERSION":
        stdout.write(skel.VERSION_REPLY)
        return
    skel.check_config_size(request.stdin)
    skel.validate_config(request.stdin)
    from multicall.plugin.commands import HANDLERS, Call

    handler = HANDLERS.get(cni_env.command)
    if handler is None:
        raise CniError(CNI_INVALID_ENV, f"unknown CNI_COMMAND: {cni_env.command}")
    skel.check_version(cni_env.command, skel.decode_version(request.stdin))
    from contextlib import AbstractContextManager, nullcontext

    from multicall.effects.ns import NetnsRef, checked_netns, opened_netns
    from multicall.plugin.ports import real_deps

    # CNI_NETNS is opened once, here: the own-netns refusal and the firewall then use the
    # same fd, so the path cannot be swapped between the check and setns. A descriptor the
    # caller opened (the node agent's client) gets the same nsfs check and is not reopened.
    uses_netns = cni_env.netns and cni_env.command in ("ADD", "CHECK", "DEL")
    opening: AbstractContextManager[int | None]
    if request.netns_fd is not None:
        opening = checked_netns(request.netns_fd, cni_env.netns)
    elif uses_netns:
        opening = opened_netns(cni_env.netns)
    else:
        opening = nullcontext(None)
    with opening as netns_fd:
        netns = NetnsRef(
            cni_env.netns,
            fd=netns_fd,
            own_fd=request.caller_netns_fd,
            allow_own=cni_env.override_netns_check,
            netlink_fd=request.netlink_fd,
            for_caller=request.for_caller,
            caller_may_enter=request.caller_may_enter,
        )
        call = Call(
            cni_env, request.stdin, stdout, log, request.env, netns, deps or real_deps(), progress
        )
        handler(call)
