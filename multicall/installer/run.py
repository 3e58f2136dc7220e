"""The installer's three modes from a parsed command line: `--once` (install and exit),
watch (install, keep installed, undo on SIGTERM/SIGINT) and `--uninstall` (stop a running
installer through its pid file, then undo from the journal).

`run` is the service's entry; the applet (applets/install_cni.py) parses the command line,
makes the logger and turns a `CniboxError` into the last log line and the exit code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from collections.abc import Mapping

from multicall.core.installer.config import InstallerConfig, parse_environment
from multicall.effects import fs, pidfile
from multicall.effects.log import Logger
from multicall.errors import EXIT_OK, CniboxError, ConfigError, UpstreamFatal
from multicall.installer.install import Installer, Options, install
from multicall.installer.legacy import take_over
from multicall.installer.lock import host_lock
from multicall.installer.undo import undo
from multicall.installer.watch import Stop, watch

UNINSTALL_WAIT_SECONDS = 30.0


def stop_running_installer(path: str, log: Logger) -> None:
    """SIGTERM the installer the pid file names (effects/pidfile.py) and wait for its undo."""
    try:
        pid = pidfile.stop(path, UNINSTALL_WAIT_SECONDS)
    except ConfigError as exc:
        log.info(f"{exc.message}; no installer stopped")
        return
    if pid is not None:
        log.info(f"stopped the installer (pid {pid})")


def resolve_binary(env: Mapping[str, str]) -> str:
    exe = env.get("CNIBOX_EXE")
    if exe:
        return exe
    from multicall.effects.links import self_executable

    return self_executable()


def run(options: Options, env: Mapping[str, str], log: Logger) -> int:
    config = parse_environment(env)
    try:
        if options.mode == "uninstall":
            return uninstall(config, options, log)
        check_host_dirs(config)
        check_node_binary(config)
        installer = Installer(config, options, log, binary="")
        installer.load_network_config()  # first: without a config nothing is written
        installer.binary = resolve_binary(env)
        with host_lock(config.state_dir, log):
            take_over(installer)
            if options.mode == "once":
                install(installer)
                return EXIT_OK
            return run_watch(installer)
    except OSError as exc:
        # Nothing in the installer expects one: say which file and why, never the repr.
        raise CniboxError(fs.os_error_text(exc), path=exc.filename) from exc


def check_host_dirs(config: InstallerConfig) -> None:
    """Upstream's Go installer stats the host bin dir, then the host CNI config dir, and a
    missing one ends it with `cannot run cni install` (log.Fatal, exit 1): neither is ever
    created. Here the check comes before the first change (upstream has already copied its
    binaries when the config dir turns out missing), so a failed start changes nothing."""
    for path, wrong_kind in (
        (config.host_bin_dir, f"dst={config.host_bin_dir} is not a directory"),
        (config.host_net_dir, f"readdirent {config.host_net_dir}: not a directory"),
    ):
        try:
            st = os.stat(path)
        except OSError as exc:
            reason = os.strerror(exc.errno or 0)
            raise UpstreamFatal(
                "cannot run cni install", f"stat {path}: {reason[:1].lower()}{reason[1:]}"
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            raise UpstreamFatal("cannot run cni install", wrong_kind)


def check_node_binary(config: InstallerConfig) -> None:
    """With CNIBOX_HOST_BINARY set (the chart's talos.extension), the node's own cnibox must
    be there. The chart mounts its directory's parent, which every Talos node has, without a
    hostPath type (the kubelet cannot see /usr/local/lib/cnibox on Talos), so this is where a
    node without the extension is told so, before any change; nothing is copied instead
    (that node would silently run another plugin version)."""
    if not config.host_binary_required:
        return
    seen = config.host_binary_in_container
    if os.path.isfile(seen) and os.access(seen, os.X_OK):
        return
    raise ConfigError(
        f"the cnibox Talos system extension is not on this node: {config.host_binary} is "
        f"missing or not an executable file (looked for it at {seen})",
        hint="install this node from a Talos installer image built with the cnibox extension "
        "(docs/talos.md, route B), or run the chart without talos.extension on node pools "
        "without it",
        path=seen,
    )


def uninstall(config: InstallerConfig, options: Options, log: Logger) -> int:
    stop_running_installer(config.pid_file, log)
    if not os.path.isdir(os.path.dirname(config.state_dir.rstrip("/")) or "/") and (
        os.path.isdir(config.legacy_state_dir)
    ):
        # no bin dir to move an older cnibox's state into: undo from where it is
        config = dataclasses.replace(config, state_dir_env=config.legacy_state_dir)
    with host_lock(config.state_dir, log, create_parents=False):
        installer = Installer(config, options, log, binary="")
        take_over(installer)
        errors = undo(installer, installer.resume())
    for error in errors:
        log.error(f"undo: {error}")
    return 1 if errors else EXIT_OK


def run_watch(installer: Installer) -> int:
    """Watch until a signal, then undo; signals stay recorded-only until the undo is done."""
    stop = Stop()
    stop.install()
    pid_file = installer.config.pid_file
    try:
        try:
            pidfile.write(pid_file)
        except OSError as exc:
            installer.log.info(f"{fs.os_error_text(exc)}; --uninstall will not find this run")
        except ConfigError as exc:
            installer.log.info(f"{exc.message}; --uninstall will not find this run")
        try:
            watch(installer, stop)
        except BaseException as exc:
            errors = _undo_and_log(installer)
            if errors and isinstance(exc, (OSError, CniboxError)):
                raise CniboxError(
                    f"{_message(exc)} (and the undo met {len(errors)} error(s), listed above)"
                ) from exc
            raise
        installer.log.info(f"signal {stop.signum}: undoing the installation")
        return 1 if _undo_and_log(installer) else EXIT_OK
    finally:
        stop.restore()
        with contextlib.suppress(OSError, ConfigError):
            if pidfile.running(pid_file) is None:
                fs.remove_durably(pid_file)  # the state dir goes with the lock (lock.py)


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return fs.os_error_text(exc)
    return exc.message if isinstance(exc, CniboxError) else str(exc)


def _undo_and_log(installer: Installer) -> list[str]:
    errors = undo(installer)
    for error in errors:
        installer.log.error(f"undo: {error}")
    return errors
