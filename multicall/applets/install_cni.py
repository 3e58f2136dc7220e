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
file: DEST_CNI_NET_DIR/.cnibox-install-cni), INSTALL_CNI_PID_FILE (in the state dir),
CNIBOX_HOST_CACHE (where the node's launcher cache, /var/lib/cnibox, is mounted: the new
version is unpacked into it at install time, so no pod start pays for the unpack).
CNI_NETWORK_CONFIG (or the file CNI_NETWORK_CONFIG_FILE names) is required: the linkerd-cni
entry to chain, as the chart's ConfigMap key cni_network_config holds it.
"""  # noqa: E501 - the usage line stays one line

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO

from multicall.core.installer import conflist, journal
from multicall.core.installer.config import (
    InstallerConfig,
    SourceRead,
    choose_network_config,
    parse_environment,
    render_kubeconfig,
    source_names,
)
from multicall.core.limits import INSTALLER_FILE, UNDO_JOURNAL
from multicall.effects import fs, pidfile
from multicall.effects.log import Logger as Log
from multicall.errors import EXIT_OK, CniboxError, ConfigError, UsageError

if TYPE_CHECKING:
    from multicall.effects.inotify import Event

PROG = "install-cni"
COPY_NAME = "cnibox"
PLUGIN_LINK = "linkerd-cni"
NSENTER_LINK = "nsenter"
KUBECONFIG_MODE = 0o600
UNINSTALL_WAIT_SECONDS = 30.0
CONFIG_LIMIT = INSTALLER_FILE  # read limits: core/limits.py
JOURNAL_LIMIT = UNDO_JOURNAL


@dataclass(frozen=True, slots=True)
class Options:
    """The installer's command line, parsed."""

    mode: str = "watch"  # watch | once | uninstall
    link_nsenter: bool = False
    log_level: str = "info"
    log_format: str = "plain"


def parse_args(args: Sequence[str]) -> Options:
    from multicall.core import logs, usage

    line = usage.parse(args, usage.options(__doc__ or ""))
    if line.has("--once") and line.has("--uninstall"):
        raise UsageError("--once and --uninstall exclude each other")
    mode = "once" if line.has("--once") else "uninstall" if line.has("--uninstall") else "watch"
    level = "debug" if line.has("--verbose") else line.value("--log-level", "info") or ""
    try:
        level = logs.parse_level(level)
    except ValueError:
        raise UsageError(f"invalid --log-level '{level}': debug, info, warn or error") from None
    log_format = line.value("--log-format", "plain") or ""
    if log_format not in logs.FORMATS:
        raise UsageError(f"invalid --log-format '{log_format}': plain or json")
    return Options(mode, line.has("--link-nsenter"), level, log_format)


def sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Original:
    """What a patched file held before: restored on undo if nobody touched our version."""

    path: str
    data: bytes
    mode: int


@dataclass(slots=True)
class State:
    """What this run (and, through the journal, an earlier killed run) wrote, for recognising
    its own events and for undo."""

    written: dict[str, str] = field(default_factory=dict)  # path -> sha256 of our bytes
    originals: dict[str, Original] = field(default_factory=dict)  # patched path -> before
    copied: dict[str, str] = field(default_factory=dict)  # copied binary -> sha256
    kubeconfig: str = ""

    def as_journal(self) -> journal.Journal:
        patched = tuple(
            journal.Patched(target, o.path, o.data, o.mode, self.written.get(target, ""))
            for target, o in self.originals.items()
        )
        return journal.Journal(patched, tuple(self.copied.items()), self.kubeconfig)

    def resume(self, record: journal.Journal) -> None:
        for p in record.patched:
            self.originals.setdefault(p.target, Original(p.original_path, p.original, p.mode))
            self.written.setdefault(p.target, p.written)
        for path, digest in record.copied:
            self.copied.setdefault(path, digest)
        self.kubeconfig = self.kubeconfig or record.kubeconfig


class Undo:
    """Errors met while undoing: each step goes on after a failure; all are reported."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def attempt(self, step: Callable[[], None]) -> bool:
        try:
            step()
        except OSError as exc:
            self.errors.append(fs.os_error_text(exc))
        except CniboxError as exc:
            self.errors.append(exc.message)
        else:
            return True
        return False


class Installer:
    def __init__(self, config: InstallerConfig, options: Options, log: Log, binary: str) -> None:
        self.config = config
        self.options = options
        self.log = log
        self.binary = binary
        self.state = State()
        self.network_config = b""
        self.journaled = b""  # the journal bytes on disk (skip identical rewrites)

    # --- the undo journal (core/installer/journal.py) ----------------------------------------

    def resume(self) -> None:
        """Take over what an earlier run (killed before it could undo) recorded."""
        path = self.config.journal_path
        try:
            if not fs.private_dir(self.config.state_dir, create=False):
                return
            data = fs.read_file(path, JOURNAL_LIMIT, what="undo journal", follow=False)
            if data is None:
                return
            record = journal.decode(
                data, net_dir=self.config.host_net_dir, bin_dir=self.config.host_bin_dir
            )
        except ConfigError as exc:
            self.log.info(f"{path}: {exc.message}; undo will only remove linkerd entries")
            return
        self.state.resume(record)
        self.journaled = data
        self.log.info(f"resumed the undo journal of an earlier run ({len(record.patched)} configs)")

    def record(self) -> None:
        """Write the journal before the change it describes is made (write-ahead)."""
        data = journal.encode(self.state.as_journal())
        if data == self.journaled:
            return
        fs.private_dir(self.config.state_dir, create=True)
        fs.write_atomic(self.config.journal_path, data, 0o600)
        self.journaled = data

    def forget(self) -> None:
        """After a complete undo: no journal, and the state dir too when nothing else is in it."""
        fs.remove_durably(self.config.journal_path)
        self.journaled = b""
        with contextlib.suppress(OSError):
            os.rmdir(self.config.state_dir)

    # --- setup -----------------------------------------------------------------------------

    def load_network_config(self) -> None:
        reads = [SourceRead(name, self._read_source(name)) for name in source_names(self.config)]
        data = choose_network_config(reads, self.config.plugin_kubeconfig_path)
        plugin = conflist.parse_document(data, "the linkerd network config")
        if not conflist.is_linkerd(plugin):
            raise ConfigError("the linkerd network config must have type linkerd-cni")
        self.network_config = data

    def _read_source(self, name: str) -> bytes | None:
        kind, _, value = name.partition(":")
        if kind == "env":
            return self.config.network_config_env.encode() or None
        return fs.read_file(value, CONFIG_LIMIT, what="network config") if value else None

    def install_binaries(self) -> None:
        bin_dir = self.config.host_bin_dir
        if not os.path.isdir(bin_dir):
            raise CniboxError(f"{bin_dir}: the host CNI bin dir does not exist")
        fs.remove_stale_temps(bin_dir)
        target = self._binary_target(bin_dir)
        names = [PLUGIN_LINK, NSENTER_LINK] if self.options.link_nsenter else [PLUGIN_LINK]
        for name in names:
            self._link(os.path.join(bin_dir, name), target)
        linked = os.path.join(bin_dir, target)  # target is relative, or the node's own file
        self.unpack_for_node(
            self.config.host_binary_in_container if target == self.config.host_binary else linked
        )

    def unpack_for_node(self, single_file: str) -> None:
        """Unpack the file the plugin link points at into the node's launcher cache
        (CNIBOX_HOST_CACHE) now; a failure only costs the first pod start its unpack, so it
        is logged, not fatal."""
        cache = self.config.host_cache
        if not cache:
            return
        from multicall.effects.bundle import unpack_for_node

        try:
            where = unpack_for_node(single_file, cache)
        except (OSError, RuntimeError, ValueError) as exc:
            self.log.info(f"could not unpack cnibox into {cache}: {exc}")
            return
        self.log.info(f"unpacked cnibox for the node into {where}")

    def _binary_target(self, bin_dir: str) -> str:
        on_node = self.config.host_binary_in_container
        if os.path.isfile(on_node) and os.access(on_node, os.X_OK):
            self.log.info(f"using the node's cnibox at {self.config.host_binary}")
            return self.config.host_binary
        dest = os.path.join(bin_dir, COPY_NAME)
        digest = fs.sha256_file(self.binary)
        if digest is None:
            raise CniboxError(f"{self.binary}: cannot read the cnibox binary to install")
        self.state.copied[dest] = digest
        self.record()
        if fs.sha256_file(dest) != digest:
            fs.copy_atomic(self.binary, dest, 0o755)
            self.log.info(f"installed {dest}")
        return COPY_NAME

    def _link(self, path: str, target: str) -> None:
        is_ours = os.path.islink(path) and self._is_cnibox_link(os.readlink(path))
        if os.path.basename(path) == NSENTER_LINK and os.path.lexists(path) and not is_ours:
            self.log.info(f"{path} exists and is not cnibox: left alone")
            return
        if not (os.path.islink(path) and os.readlink(path) == target):
            fs.symlink_atomic(target, path)
            self.log.info(f"linked {path} -> {target}")

    def _is_cnibox_link(self, target: str) -> bool:
        return target in (COPY_NAME, self.config.host_binary)

    # --- kubeconfig ------------------------------------------------------------------------

    def write_kubeconfig(self) -> None:
        token = self._read_required(self.config.token_file, "service-account token")
        ca = self._read_required(self.config.ca_file, "CA certificate")
        text = render_kubeconfig(token, ca, self.config.service_host, self.config.service_port)
        path = self.config.kubeconfig_path
        self.state.kubeconfig = path
        self.record()
        if self._current(path, "kubeconfig") == text and fs.file_mode(path) == KUBECONFIG_MODE:
            return
        fs.write_atomic(path, text, KUBECONFIG_MODE)
        self.log.info(f"wrote {path}")

    @staticmethod
    def _read_required(path: str, what: str) -> bytes:
        data = fs.read_file(path, CONFIG_LIMIT, what=what)
        if data is None:
            raise ConfigError(f"open {path}: no such file or directory", path=path)
        return data

    @staticmethod
    def _current(path: str, what: str) -> bytes | None:
        """What our own file at `path` holds; None when it is missing or not a plain file
        (a FIFO or symlink put there is replaced, never read)."""
        try:
            return fs.read_file(path, CONFIG_LIMIT, what=what, follow=False)
        except ConfigError:
            return None

    # --- CNI network configs ---------------------------------------------------------------

    def watched(self, wd: int, net_wd: int) -> str:
        return self.config.host_net_dir if wd == net_wd else self.config.service_account_dir

    def wanted(self, name: str) -> bool:
        if fs.is_temp_name(name) or not conflist.is_cni_config_name(name):
            return False
        wanted = self.config.conf_name
        return not wanted or name in (wanted, conflist.upgraded_name(wanted))

    def config_names(self) -> list[str]:
        try:
            names = sorted(os.listdir(self.config.host_net_dir))
        except FileNotFoundError:
            return []
        return [n for n in names if self.wanted(n)]

    def patch_all(self) -> None:
        fs.remove_stale_temps(self.config.host_net_dir)
        names = self.config_names()
        if not names:
            self.log.info("no CNI network config yet; waiting for the primary CNI")
        for name in names:
            self.patch(name)

    def read_config(self, path: str) -> bytes | None:
        """A CNI config's bytes; None (logged) for a symlink, FIFO, device, directory, or one
        over the size limit: such a file is never read whole, never rewritten."""
        try:
            return fs.read_file(path, CONFIG_LIMIT, what="CNI network config", follow=False)
        except fs.NotAFile as exc:
            if exc.message == f"{path}: a symlink":
                # Replacing it would cut the link to wherever the primary CNI keeps the file.
                self.log.info(f"{path}: a symlink, left alone")
            else:
                self.log.info(f"{exc.message}: left alone")
        except ConfigError as exc:
            self.log.info(f"{exc.message}: left alone")
        return None

    def patch(self, name: str) -> None:
        path = os.path.join(self.config.host_net_dir, name)
        if not os.path.lexists(path):
            self.log.debug(f"{path}: gone before it could be read")
            return
        data = self.read_config(path)
        if data is None:
            return
        if self.state.written.get(path) == sha256(data):
            self.log.debug(f"{path}: our own write, ignored")
            return
        try:
            merged = conflist.insert_linkerd(data, self.network_config)
            original = self._original_of(data)
        except ConfigError as exc:
            self.log.info(f"{path}: left alone: {exc.message}")
            return
        self._write_patched(path, data, merged, original)

    @staticmethod
    def _original_of(data: bytes) -> bytes:
        """What to restore on undo: the file as the primary CNI wrote it, minus linkerd."""
        if "type" in conflist.parse_document(data):
            return data
        return conflist.remove_linkerd(data) or data

    def _write_patched(self, path: str, data: bytes, merged: bytes, original: bytes) -> None:
        target = conflist.upgraded_name(path)
        mode = fs.file_mode(path)
        self.state.written[target] = sha256(merged)
        self.state.originals[target] = Original(path, original, mode)
        self.record()
        if target != path or merged != data:
            fs.write_atomic(target, merged, mode)
            self.log.info(f"patched {target}")
        if target != path:
            fs.remove_durably(path)
            self.state.written.pop(path, None)

    # --- undo ------------------------------------------------------------------------------

    def undo(self) -> list[str]:
        """Put the node back as it was; every step goes on after a failure, and the errors
        are returned (the journal stays until an undo met none, for the next run to retry)."""
        undo = Undo()
        for target, original in sorted(self.state.originals.items()):
            if undo.attempt(functools.partial(self._restore, target, original)):
                del self.state.originals[target]
        for name in self.config_names():
            undo.attempt(
                functools.partial(self._strip, os.path.join(self.config.host_net_dir, name))
            )
        self._remove_files(undo)
        if not undo.errors:
            undo.attempt(self.forget)
        return undo.errors

    def _restore(self, target: str, original: Original) -> None:
        """The original name, bytes and mode, if the file still holds exactly what we wrote;
        a file changed since (or gone) keeps its content and only loses linkerd (`_strip`)."""
        try:
            current = fs.read_file(target, CONFIG_LIMIT, follow=False)
        except ConfigError:
            return  # replaced by something that is not ours (a symlink, a FIFO, ...)
        if current is None or sha256(current) != self.state.written.get(target):
            return
        fs.write_atomic(original.path, original.data, original.mode)
        if original.path != target:
            fs.remove_durably(target)
        self.log.info(f"restored {original.path}")

    def _strip(self, path: str) -> None:
        try:
            data = fs.read_file(path, CONFIG_LIMIT, follow=False)
        except ConfigError:
            return  # never patched by us: a symlink, FIFO, device or an oversized file
        if data is None:
            return
        try:
            stripped = conflist.remove_linkerd(data)
        except ConfigError:
            return
        if stripped is not None:
            fs.write_atomic(path, stripped, fs.file_mode(path))
            self.log.info(f"removed linkerd from {path}")

    def _remove_files(self, undo: Undo) -> None:
        kubeconfig = self.state.kubeconfig or self.config.kubeconfig_path
        undo.attempt(functools.partial(self._remove, kubeconfig))
        bin_dir = self.config.host_bin_dir
        for name in (PLUGIN_LINK, NSENTER_LINK):
            path = os.path.join(bin_dir, name)
            if os.path.islink(path) and self._is_cnibox_link(os.readlink(path)):
                undo.attempt(functools.partial(self._remove, path))
        copy = os.path.join(bin_dir, COPY_NAME)
        expected = self.state.copied.get(copy)
        if os.path.isfile(copy) and (expected is None or fs.sha256_file(copy) == expected):
            undo.attempt(functools.partial(self._remove, copy))

    def _remove(self, path: str) -> None:
        if fs.remove_durably(path):
            self.log.info(f"removed {path}")


# --- the watch loop --------------------------------------------------------------------------


class Stop:
    """Signal bookkeeping: handlers only record; the loop wakes on the wake-up pipe."""

    def __init__(self) -> None:
        self.signum = 0
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.previous: dict[int, Any] = {}
        self.previous_wakeup = -1

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = self.signum or signum

    def install(self) -> None:
        import signal

        for signum in (signal.SIGTERM, signal.SIGINT):
            self.previous[signum] = signal.signal(signum, self._handle)
        self.previous_wakeup = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)

    def restore(self) -> None:
        """Back to the previous handlers, unless a signal ended the run: then the process is
        exiting, and a SIGTERM or SIGINT arriving after the undo (a burst of them, kubelet and
        `--uninstall` both asking) must not turn the finished undo's exit 0 into death by
        signal, so further ones are ignored."""
        import signal

        signal.set_wakeup_fd(self.previous_wakeup)
        for signum, handler in self.previous.items():
            signal.signal(signum, signal.SIG_IGN if self.signum else handler)
        os.close(self.read_fd)
        os.close(self.write_fd)

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 512):
                pass
        except BlockingIOError:
            pass


def watch(installer: Installer, stop: Stop) -> None:
    """Install, then react to inotify events until a signal arrives."""
    import select

    from multicall.effects import inotify

    config = installer.config
    for directory in (config.host_net_dir, config.service_account_dir):
        if not os.path.isdir(directory):
            raise CniboxError(f"{directory}: no such directory to watch", path=directory)
    with inotify.Inotify() as ino:
        net_mask = inotify.IN_CREATE | inotify.IN_MODIFY | inotify.IN_CLOSE_WRITE
        net_wd = ino.add_watch(config.host_net_dir, net_mask | inotify.IN_MOVED_TO)
        sa_wd = ino.add_watch(config.service_account_dir, inotify.IN_CREATE | inotify.IN_MOVED_TO)
        # Watches exist before the first scan, so a config landing in between is not missed.
        install(installer, stop)
        while True:
            if stop.signum:
                return
            select.select([ino.fileno(), stop.read_fd], [], [])
            stop.drain()
            _dispatch(installer, ino.read_events(), net_wd, sa_wd)


def _dispatch(installer: Installer, events: Sequence[Event], net_wd: int, sa_wd: int) -> None:
    from multicall.effects.inotify import IN_IGNORED

    names: dict[str, None] = {}
    token_swapped = False
    for event in events:
        installer.log.debug(f"event wd={event.wd} mask={event.mask:#x} name={event.name}")
        if event.overflowed:
            names.update(dict.fromkeys(installer.config_names()))
        elif event.wd in (net_wd, sa_wd) and event.mask & IN_IGNORED:
            raise CniboxError(f"{installer.watched(event.wd, net_wd)}: the watched dir went away")
        elif event.wd == net_wd and installer.wanted(event.name):
            names[event.name] = None
        elif event.wd == sa_wd and event.name == "..data":
            token_swapped = True
    if token_swapped:
        _rewrite_kubeconfig(installer)
    for name in names:
        installer.patch(name)


def _rewrite_kubeconfig(installer: Installer) -> None:
    try:
        installer.write_kubeconfig()
    except OSError as exc:
        # kubelet swaps ..data atomically, so a failure here is transient or fixed by the
        # next swap; the old kubeconfig stays in place meanwhile.
        installer.log.info(f"kubeconfig not rewritten: {fs.os_error_text(exc)}")
    except CniboxError as exc:
        installer.log.info(f"kubeconfig not rewritten: {exc.message}")


def install(installer: Installer, stop: Stop | None = None) -> None:
    """Binary, kubeconfig, then configs: the plugin is never chained before it can run."""
    installer.load_network_config()
    installer.resume()
    for step in (installer.install_binaries, installer.write_kubeconfig, installer.patch_all):
        if stop is not None and stop.signum:
            return
        step()


# --- pid file and --uninstall ---------------------------------------------------------------


def stop_running_installer(path: str, log: Log) -> None:
    """SIGTERM the installer the pid file names (effects/pidfile.py) and wait for its undo."""
    try:
        pid = pidfile.stop(path, UNINSTALL_WAIT_SECONDS)
    except ConfigError as exc:
        log.info(f"{exc.message}; no installer stopped")
        return
    if pid is not None:
        log.info(f"stopped the installer (pid {pid})")


# --- entry point -------------------------------------------------------------------------------


def resolve_binary(env: Mapping[str, str]) -> str:
    exe = env.get("CNIBOX_EXE")
    if exe:
        return exe
    from multicall.effects.links import self_executable

    return self_executable()


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int:
    options = parse_args(list(argv[1:]))
    log = Log(stderr, options.log_level, options.log_format)
    try:
        return run(options, env, log)
    except CniboxError as exc:
        # a daemon's last words belong in its log, in its format (upstream: log.Fatal)
        log.error(exc.message, **({"hint": exc.hint} if exc.hint else {}))
        return exc.exit_code


def run(options: Options, env: Mapping[str, str], log: Log) -> int:
    config = parse_environment(env)
    try:
        if options.mode == "uninstall":
            return uninstall(config, options, log)
        installer = Installer(config, options, log, binary="")
        installer.load_network_config()  # first: without a config nothing is written
        installer.binary = resolve_binary(env)
        if options.mode == "once":
            install(installer)
            return EXIT_OK
        return run_watch(installer)
    except OSError as exc:
        # Nothing in the installer expects one: say which file and why, never the repr.
        raise CniboxError(fs.os_error_text(exc), path=exc.filename) from exc


def uninstall(config: InstallerConfig, options: Options, log: Log) -> int:
    stop_running_installer(config.pid_file, log)
    installer = Installer(config, options, log, binary="")
    installer.resume()
    errors = installer.undo()
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
                fs.remove_durably(pid_file)
                if not installer.journaled:
                    os.rmdir(installer.config.state_dir)


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return fs.os_error_text(exc)
    return exc.message if isinstance(exc, CniboxError) else str(exc)


def _undo_and_log(installer: Installer) -> list[str]:
    errors = installer.undo()
    for error in errors:
        installer.log.error(f"undo: {error}")
    return errors
