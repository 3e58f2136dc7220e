"""The installer's work on the node: the binary and its links, the plugin's kubeconfig, the
linkerd entry in every CNI network config, and the undo journal written ahead of each change.

`Installer` holds one run's config, log and `State`; `install` is the order of its steps.
Undoing is undo.py's, reacting to inotify events watch.py's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.core import mountinfo
from multicall.core.go.encoding_json.encode import Rendered
from multicall.core.installer import conflist, journal
from multicall.core.installer.config import (
    InstallerConfig,
    SourceRead,
    choose_network_config,
    is_linkerd_kubeconfig,
    render_kubeconfig,
    source_names,
)
from multicall.core.installer.journal import RECORD_LIMIT
from multicall.core.limits import INSTALLER_FILE, MIB, UNDO_JOURNAL
from multicall.effects import fs
from multicall.effects.log import Logger
from multicall.errors import CniboxError, ConfigError
from multicall.installer.state import State, sha256

if TYPE_CHECKING:
    from multicall.installer.watch import Stop

COPY_NAME = "cnibox"
PLUGIN_LINK = "linkerd-cni"
NSENTER_LINK = "nsenter"
KUBECONFIG_MODE = 0o600
CONFIG_LIMIT = INSTALLER_FILE  # read limits: core/limits.py
JOURNAL_LIMIT = UNDO_JOURNAL
# A batch of configs patched together (`Installer.apply`): its records and its configs each
# made durable by one sync. Bounded in bytes so memory stays small with 1 MiB configs (three
# copies of each at most); 10,000 1 KB configs are one batch (on ext4, ten batches of 1,000
# took 68 s to install there, one batch 21-29 s: each syncfs waits on the whole disk).
BATCH_FILES = 10_000
BATCH_BYTES = 32 * MIB
MOUNTINFO_LIMIT = 1 << 20  # a node with thousands of mounts (pods' volumes) stays under it


@dataclass(frozen=True, slots=True)
class Options:
    """The installer's command line, parsed."""

    mode: str = "watch"  # watch | once | uninstall
    link_nsenter: bool = False
    log_level: str = "info"
    log_format: str = "plain"


class Installer:
    def __init__(self, config: InstallerConfig, options: Options, log: Logger, binary: str) -> None:
        self.config = config
        self.options = options
        self.log = log
        self.binary = binary
        self.state = State()
        self.network_config = b""
        self.plugin: dict[str, conflist.Json] = {}  # network_config, parsed once
        self.rendered_plugin: Rendered | None = None  # and rendered once (conflist.py)
        self.journaled = b""  # the journal bytes on disk (skip identical rewrites)
        self.records_ready = False  # the records dir exists and is private
        # Joined once: every config's record is written and dropped there (20,000 path
        # joins per 10,000 configs otherwise); `config` is frozen and never replaced.
        self.records_dir = config.records_dir
        # Which record file holds each config's current record (a group, or a version 2
        # per-name file), and the configs each file still holds a current record of: a
        # file goes once it holds none (superseded by a later group, or undone).
        self.holder: dict[str, str] = {}
        self.members: dict[str, set[str]] = {}
        self.next_group = 1

    # --- the undo journal (core/installer/journal.py) ----------------------------------------

    def resume(self) -> list[str]:
        """Take over what an earlier run (killed before it could undo) recorded; returns why
        each unreadable part of the journal could not be read (rule 3: never ignored)."""
        errors: list[str] = []
        try:
            if not fs.private_dir(self.config.state_dir, create=False):
                return errors
        except ConfigError as exc:
            return [exc.message]
        with contextlib.suppress(CniboxError, OSError):  # unknown: the records stay
            self._forget_records_of_a_gone_config_dir()
        self._resume_records(errors)
        path = self.config.journal_path
        try:
            data = fs.read_file(path, JOURNAL_LIMIT, what="undo journal", follow=False)
            if data is not None:
                record = journal.decode(
                    data, net_dir=self.config.host_net_dir, bin_dir=self.config.host_bin_dir
                )
                self.state.resume(record)
                self.journaled = data
        except ConfigError as exc:
            errors.append(_naming(path, exc.message))
        if self.journaled or self.state.records:
            count = len(self.state.records)
            self.log.info(f"resumed the undo journal of an earlier run ({count} configs)")
        return errors

    def _forget_records_of_a_gone_config_dir(self) -> None:
        """The config records of an earlier boot describe files that no longer exist when the
        config dir is a tmpfs (Talos' /etc/cni): restoring them would bring back a config
        the primary CNI wrote last boot. The state dir (in the bin dir) outlives the reboot,
        so those records go; the journal (binary, kubeconfig) stays. A config dir on disk
        keeps its files over a reboot, and its records stay valid."""
        recorded = fs.read_file(self.config.boot_file, 64, what="boot id", follow=False)
        current = _boot_id()
        if (
            recorded is None
            or not current
            or recorded.decode("ascii", "replace").strip()
            in (
                current,
                "",
            )
        ):
            return
        mounts = fs.read_file("/proc/self/mountinfo", MOUNTINFO_LIMIT, what="mountinfo")
        if mountinfo.fs_type(self.config.host_net_dir, (mounts or b"").decode()) != "tmpfs":
            return
        directory = self.config.records_dir
        with contextlib.suppress(FileNotFoundError):
            for name in sorted(os.listdir(directory)):
                fs.remove_durably(os.path.join(directory, name))
            os.rmdir(directory)
        fs.remove_durably(self.config.boot_file)
        self.log.info(
            f"forgot the config records of an earlier boot: {self.config.host_net_dir} is a "
            "tmpfs, so the configs they describe are gone"
        )

    def _resume_records(self, errors: list[str]) -> None:
        directory = self.config.records_dir
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return
        net_dir = self.config.host_net_dir
        # (group number, file name); a version 2 per-name record is (-1, its name).
        found: list[tuple[int, str]] = []
        for name in names:
            if fs.is_temp_name(name):
                continue  # a record a killed run did not finish: its change was not made
            number = journal.group_number(name)
            if number is None:
                found.append((-1, name))
            else:
                found.append((number, name))
                self.next_group = max(self.next_group, number + 1)
        # Version 2 per-name records first, then groups in order: a later record of the
        # same config (written after the earlier one was durable) wins.
        for number, name in sorted(found):
            path = os.path.join(directory, name)
            try:
                data = fs.read_file(path, RECORD_LIMIT, what="undo record", follow=False)
                if data is None:
                    continue
                if number < 0:
                    records: tuple[journal.Record, ...] = (
                        journal.decode_record(data, net_dir=net_dir, name=name),
                    )
                else:
                    records = journal.decode_group(data, net_dir=net_dir)
            except ConfigError as exc:
                errors.append(_naming(path, exc.message))
                continue
            for record in records:
                self.state.records[record.path] = record
                self._hold(record.path, name)

    def adopt_version1(self) -> None:
        """Records for what a version 1 `undo.json` held, then `undo.json` without them."""
        if self.journaled and b'"patched"' in self.journaled:
            self.write_records(list(self.state.records.values()))
            self.journaled = b""
            self.record()

    def record(self) -> None:
        """Write `undo.json` before the change it describes is made (write-ahead)."""
        data = journal.encode(self.state.as_journal())
        if data == self.journaled:
            return
        fs.private_dir(self.config.state_dir, create=True)
        fs.write_atomic(self.config.journal_path, data, 0o600)
        self.journaled = data

    def write_records(self, records: Sequence[journal.Record]) -> None:
        """A batch's records, durable before their changes are made (one sync of the
        records dir for them all); then the files whose every record they replaced go."""
        superseded = self._write_groups(records)
        fs.sync_filesystem(self.records_dir)
        self._remove_superseded(superseded)

    def _write_groups(self, records: Sequence[journal.Record]) -> list[str]:
        """`records` in group files of at most RECORD_LIMIT bytes (rule 1): one file
        creation per group, not per config; not synced. Returns the record files no
        current record is in any more."""
        records_dir = self.records_dir
        if not self.records_ready:
            fs.private_dir(self.config.state_dir, create=True)
            fs.private_dir(records_dir, create=True)
            if fs.read_file(self.config.boot_file, 64, what="boot id", follow=False) is None:
                fs.write_atomic(self.config.boot_file, _boot_id().encode() + b"\n", 0o600)
            self.records_ready = True
        entries = [journal.encode_group_entry(record) for record in records]
        superseded: list[str] = []
        start = 0
        for size in journal.group_sizes(entries):
            name = journal.group_name(self.next_group)
            self.next_group += 1
            data = journal.encode_group(entries[start : start + size])
            fs.write_unsynced(os.path.join(records_dir, name), data, 0o600)
            for record in records[start : start + size]:
                emptied = self._hold(record.path, name)
                if emptied:
                    superseded.append(emptied)
            start += size
        return superseded

    def _remove_superseded(self, names: Sequence[str]) -> None:
        """Record files no current record is in any more; only after the group replacing
        them is durable. Not synced: one coming back after a crash is read before the
        later group, which wins (rule 1)."""
        for name in names:
            if not self.members.get(name):
                self.members.pop(name, None)
                fs.unlink_unsynced(os.path.join(self.records_dir, name))

    def _hold(self, path: str, name: str) -> str:
        """`path`'s current record is now in the file `name`; returns the file it was in
        when that file holds no current record any more ("" otherwise)."""
        previous = self.holder.get(path)
        self.holder[path] = name
        self.members.setdefault(name, set()).add(path)
        if previous is None or previous == name:
            return ""
        left = self.members.get(previous)
        if left is not None:
            left.discard(path)
            if not left:
                return previous
        return ""

    def drop_record(self, path: str, *, durable: bool = True) -> None:
        """After the undo of one config: its record goes, and with it the file holding it
        once that file holds no other current record (not `durable`: the caller syncs a
        batch of them). A group still holding others keeps the undone one, harmless: its
        name is no longer what the installer left there, so a later undo leaves it."""
        name = self.holder.get(path)
        left = self.members.get(name or "")
        if left is not None:
            left.discard(path)
        if name is not None and not left:
            self.members.pop(name, None)
            record = os.path.join(self.records_dir, name)
            if durable:
                fs.remove_durably(record)
            else:
                fs.unlink_unsynced(record)
        self.holder.pop(path, None)
        del self.state.records[path]

    def forget(self) -> None:
        """After a complete undo: no journal, and no records dir when nothing else is in it
        (the state dir goes with the lock, lock.py)."""
        fs.remove_durably(self.config.journal_path)
        self.journaled = b""
        with contextlib.suppress(OSError):
            os.rmdir(self.config.records_dir)
        if not os.path.isdir(self.config.records_dir):
            fs.remove_durably(self.config.boot_file)
        self.records_ready = False

    # --- setup -----------------------------------------------------------------------------

    def load_network_config(self) -> None:
        reads = [SourceRead(name, self._read_source(name)) for name in source_names(self.config)]
        data = choose_network_config(reads, self.config.plugin_kubeconfig_path)
        plugin = conflist.parse_document(data, "the linkerd network config")
        if not conflist.is_linkerd(plugin):
            raise ConfigError("the linkerd network config must have type linkerd-cni")
        self.network_config = data
        self.plugin = plugin
        self.rendered_plugin = conflist.render_plugin(plugin)

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
        is_ours = os.path.islink(path) and self.is_cnibox_link(os.readlink(path))
        if os.path.basename(path) == NSENTER_LINK and os.path.lexists(path) and not is_ours:
            self.log.info(f"{path} exists and is not cnibox: left alone")
            return
        if not (os.path.islink(path) and os.readlink(path) == target):
            fs.symlink_atomic(target, path)
            self.log.info(f"linked {path} -> {target}")

    def is_cnibox_link(self, target: str) -> bool:
        return target in (COPY_NAME, self.config.host_binary)

    # --- kubeconfig ------------------------------------------------------------------------

    def write_kubeconfig(self) -> None:
        token = self._read_required(self.config.token_file, "service-account token")
        ca = self._read_required(self.config.ca_file, "CA certificate")
        text = render_kubeconfig(token, ca, self.config.service_host, self.config.service_port)
        path = self.config.kubeconfig_path
        self.check_kubeconfig_path()
        self.state.kubeconfig = path
        self.record()
        if self._current(path, "kubeconfig") == text and fs.file_mode(path) == KUBECONFIG_MODE:
            return
        fs.write_atomic(path, text, KUBECONFIG_MODE)
        self.log.info(f"wrote {path}")

    def check_kubeconfig_path(self) -> None:
        """ConfigError when the kubeconfig would replace a file that is not a kubeconfig of
        linkerd's (a primary CNI's own kubeconfig, say): never overwritten, never removed."""
        path = self.config.kubeconfig_path
        current = self._current(path, "kubeconfig")
        if current is not None and not is_linkerd_kubeconfig(current):
            raise ConfigError(
                f"{path} exists and is not a linkerd-cni kubeconfig; set KUBECONFIG_FILE_NAME "
                "to a name no other file in the CNI config dir has",
                path=path,
            )

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
        """Every config, in batches bounded in files and bytes (`BATCH_FILES`,
        `BATCH_BYTES`): a batch's records are made durable together, then its configs."""
        fs.remove_stale_temps(self.config.host_net_dir)
        names = self.config_names()
        if not names:
            self.log.info("no CNI network config yet; waiting for the primary CNI")
        batch: list[Patch] = []
        size = 0
        for name in names:
            planned = self.plan(name)
            if planned is None:
                continue
            batch.append(planned)
            size += planned.size
            if len(batch) >= BATCH_FILES or size >= BATCH_BYTES:
                self.apply(batch)
                batch, size = [], 0
        self.apply(batch)

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
        """One config (an inotify event's)."""
        planned = self.plan(name)
        if planned is not None:
            self.apply([planned])

    def plan(self, name: str) -> Patch | None:
        """What patching `name` writes, read and decided, nothing written yet; None when it
        is left alone (logged) or already ours."""
        path = os.path.join(self.config.host_net_dir, name)
        if not os.path.lexists(path):
            self.log.debug(f"{path}: gone before it could be read")
            return None
        data = self.read_config(path)
        if data is None:
            return None
        if self.state.ours(path, data):
            self.log.debug(f"{path}: our own write, ignored")
            return None
        try:
            document = conflist.parse_document(data, "existing CNI configuration")
            merged = conflist.insert_linkerd(document, self.plugin, rendered=self.rendered_plugin)
            original = self._original_of(document, data)
        except ConfigError as exc:
            self.log.info(f"{path}: left alone: {exc.message}")
            return None
        target = conflist.upgraded_name(path)
        if target != path and not self._ours_to_replace(target):
            self.log.info(
                f"{path}: left alone: converting it would replace {target}, which cnibox "
                "did not write"
            )
            return None
        return Patch(path, data, merged, original, target, fs.file_mode(path))

    def _ours_to_replace(self, target: str) -> bool:
        """Whether `.conf` conversion may write `target`: it does not exist, or it is the
        installer's own conversion of it, unchanged since (never an existing config)."""
        if not os.path.lexists(target):
            return True
        record = self.state.records.get(target)
        if record is None or record.original is not None:
            return False
        return self.state.ours(target, self._current(target, "CNI network config"))

    @staticmethod
    def _original_of(document: dict[str, conflist.Json], data: bytes) -> bytes:
        """What to restore on undo: the file as the primary CNI wrote it, minus linkerd."""
        if "type" in document:
            return data
        return conflist.remove_linkerd(document) or data

    def apply(self, batch: Sequence[Patch]) -> None:
        """Write-ahead in three flushes, whatever the number of configs (fs.py rule 5):
        1. every record, then one sync: each change is undoable before any is made;
        2. every patched config staged beside its target, then one sync: no rename can
           publish bytes that are not on disk (a record's digest must match them);
        3. the renames (and `x.conf` removals after their `x.conflist`), then one sync.
        A crash anywhere leaves each config as it was or as recorded: undo restores both.
        A config changed by somebody else since it was read keeps their bytes (its event
        patches it again)."""
        if not batch:
            return
        self.write_records([record for patch in batch for record in self._records_of(patch)])
        staged: list[tuple[str, Patch]] = []
        try:
            for patch in batch:
                if patch.target != patch.path or patch.merged != patch.data:
                    staged.append((fs.stage(patch.target, patch.merged, patch.mode), patch))
            if not staged:
                return
            net_dir = self.config.host_net_dir
            fs.sync_filesystem(net_dir)
            while staged:
                tmp, patch = staged.pop(0)
                self._commit(tmp, patch)
            fs.sync_filesystem(net_dir)
        finally:
            for tmp, _ in staged:
                fs.discard(tmp)

    def _records_of(self, patch: Patch) -> list[journal.Record]:
        digest = sha256(patch.merged)
        state, path, target = self.state, patch.path, patch.target
        if target == path:
            return [state.change(path, patch.data, patch.original, patch.mode, digest)]
        current = self._current(target, "CNI network config")
        return [
            state.change(target, current, None, patch.mode, digest),
            state.change(path, patch.data, patch.original, patch.mode, ""),
        ]

    def _commit(self, tmp: str, patch: Patch) -> None:
        if self._current(patch.path, "CNI network config") != patch.data:
            fs.discard(tmp)
            self.log.info(f"{patch.path}: changed while it was being patched; left to its event")
            return
        fs.commit_staged(tmp, patch.target)
        self.log.info(f"patched {patch.target}")
        if patch.target != patch.path:
            fs.unlink_unsynced(patch.path)


@dataclass(frozen=True, slots=True)
class Patch:
    """One config's change, decided: `path` held `data`; `target` gets `merged` (mode
    `mode`); undo restores `original` at `path`."""

    path: str
    data: bytes
    merged: bytes
    original: bytes
    target: str
    mode: int

    @property
    def size(self) -> int:
        """The bytes it holds in memory (what bounds a batch)."""
        shared = self.original is self.data
        return len(self.data) + len(self.merged) + (0 if shared else len(self.original))


def _boot_id() -> str:
    """This boot's id (the kernel's random boot_id); "" where /proc does not say."""
    try:
        data = fs.read_file("/proc/sys/kernel/random/boot_id", 64, what="boot id")
    except CniboxError:
        return ""
    return (data or b"").decode("ascii", "replace").strip()


def _naming(path: str, message: str) -> str:
    """`message` as `path: reason`, once."""
    return message if message.startswith(path) else f"{path}: {message}"


def install(installer: Installer, stop: Stop | None = None) -> None:
    """Binary, kubeconfig, then configs: the plugin is never chained before it can run."""
    installer.load_network_config()
    errors = installer.resume()
    if errors:
        raise ConfigError(
            f"{errors[0]}: the undo journal cannot be read, so installing now could lose the "
            "original configs it holds",
            hint="restore the CNI configs it names by hand, or run install-cni --uninstall to "
            "undo what the rest of the journal allows; then remove the file",
        )
    installer.adopt_version1()
    installer.check_kubeconfig_path()
    for step in (installer.install_binaries, installer.write_kubeconfig, installer.patch_all):
        if stop is not None and stop.signum:
            return
        step()
