"""Putting the node back as it was: each patched config restored (or stripped of linkerd),
the kubeconfig, the links and the copied binary removed.

Every step goes on after a failure (`Undo` collects the errors) so one unremovable file
never leaves the rest installed; the journal is forgotten only after an undo met no error,
for the next run (or `--uninstall`) to retry.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence

from multicall.core.installer import conflist
from multicall.core.installer.config import is_linkerd_kubeconfig
from multicall.core.installer.journal import Record
from multicall.effects import fs
from multicall.errors import CniboxError, ConfigError
from multicall.installer.install import (
    BATCH_FILES,
    CONFIG_LIMIT,
    COPY_NAME,
    NSENTER_LINK,
    PLUGIN_LINK,
    Installer,
)
from multicall.installer.state import sha256

UNREADABLE = (
    "this part of the undo journal cannot be read, so the config it records was not "
    "restored; restore it by hand (the record holds its original bytes in base64), then "
    "remove the file"
)


class Undo:
    """Errors met while undoing: each step goes on after a failure; all are reported."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def attempt(self, step: Callable[[], object]) -> bool:
        try:
            step()
        except OSError as exc:
            self.errors.append(fs.os_error_text(exc))
        except CniboxError as exc:
            self.errors.append(exc.message)
        else:
            return True
        return False


def undo(installer: Installer, unreadable: Sequence[str] = ()) -> list[str]:
    """Put the node back as it was; every step goes on after a failure, and the errors
    are returned (the journal stays until an undo met none, for the next run to retry).
    `unreadable`: the parts of the journal `resume` could not read, reported as errors
    after the rest is undone (their originals stay where they are for the operator)."""
    steps = Undo()
    steps.errors.extend(f"{reason}: {UNREADABLE}" for reason in unreadable)
    config = installer.config
    for directory in (
        config.host_net_dir,
        config.host_bin_dir,
        config.state_dir,
        config.records_dir,
    ):
        # A killed installer's staged files (the host lock is held: no live writer's).
        steps.attempt(functools.partial(fs.remove_stale_temps, directory))
    records = sorted(installer.state.records.values(), key=lambda r: r.path)
    for start in range(0, len(records), BATCH_FILES):
        _restore_batch(installer, records[start : start + BATCH_FILES], unreadable, steps)
    for name in installer.config_names():
        path = os.path.join(installer.config.host_net_dir, name)
        steps.attempt(functools.partial(_strip, installer, path))
    _remove_files(installer, steps)
    if not steps.errors:
        steps.attempt(installer.forget)
    return steps.errors


class _Batch:
    """The restores of one batch: staged originals, names to remove, records to drop."""

    def __init__(self) -> None:
        self.staged: list[tuple[str, Record]] = []
        self.removals: list[Record] = []
        self.done: list[Record] = []  # nothing (more) to restore: their records may go


def _restore_batch(
    installer: Installer, records: Sequence[Record], unreadable: Sequence[str], steps: Undo
) -> None:
    """Install's three flushes in reverse (install.py `apply`): every original staged, one
    sync; the renames, then the removals (an original is back before cnibox's conversion of
    it goes), one sync; then the records of what is restored, one sync. A crash anywhere
    leaves each record until its restore is on disk, for the next undo to finish."""
    batch = _Batch()
    for record in records:
        if unreadable and record.original is None:
            # A file cnibox created may be the only copy of one whose record cannot be
            # read (`x.conflist` of a converted `x.conf`): it stays, losing only linkerd.
            continue
        steps.attempt(functools.partial(_plan, installer, record, batch))
    net_dir = installer.config.host_net_dir
    try:
        if (batch.staged or batch.removals) and steps.attempt(
            functools.partial(fs.sync_filesystem, net_dir)
        ):
            committed = []
            while batch.staged:
                tmp, record = batch.staged.pop(0)
                if steps.attempt(functools.partial(_commit, installer, tmp, record)):
                    committed.append(record)
            for record in batch.removals:
                if steps.attempt(functools.partial(_remove_created, installer, record)):
                    committed.append(record)
            if steps.attempt(functools.partial(fs.sync_filesystem, net_dir)):
                batch.done += committed
    finally:
        for tmp, _ in batch.staged:
            fs.discard(tmp)
    for record in batch.done:
        steps.attempt(functools.partial(installer.drop_record, record.path, durable=False))
    if batch.done:
        steps.attempt(functools.partial(fs.sync_filesystem, installer.config.records_dir))


def _plan(installer: Installer, record: Record, batch: _Batch) -> None:
    """Where `record`'s name goes back to what it held before the installer first changed
    it: while it still holds exactly what the installer left there (a removed `x.conf`:
    while the name is free); a file somebody changed since keeps their content and only
    loses linkerd (`_strip`)."""
    path = record.path
    if not _still_ours(installer, record):
        batch.done.append(record)
    elif record.original is None:
        batch.removals.append(record)
    else:
        batch.staged.append((fs.stage(path, record.original, record.mode), record))


def _still_ours(installer: Installer, record: Record) -> bool:
    path = record.path
    if record.written:
        try:
            current = fs.read_file(path, CONFIG_LIMIT, follow=False)
        except ConfigError:
            return False  # replaced by something that is not ours (a symlink, a FIFO, ...)
        return current is not None and sha256(current) == record.written
    if os.path.lexists(path):
        if not _already_restored(record):
            installer.log.info(f"{path}: written again since cnibox converted it; kept as it is")
        return False
    return True


def _already_restored(record: Record) -> bool:
    """Whether `record`'s name holds its original again: an earlier undo restored it and
    kept the group file for another record's sake (a group goes only when all of it is
    undone), so saying the primary CNI wrote it again would mislead."""
    if record.original is None:
        return False
    try:
        return fs.read_file(record.path, CONFIG_LIMIT, follow=False) == record.original
    except ConfigError:
        return False


def _commit(installer: Installer, tmp: str, record: Record) -> None:
    if not _still_ours(installer, record):  # changed since it was planned: theirs stays
        fs.discard(tmp)
        return
    fs.commit_staged(tmp, record.path)
    installer.log.info(f"restored {record.path}")


def _remove_created(installer: Installer, record: Record) -> None:
    if _still_ours(installer, record):
        fs.unlink_unsynced(record.path)
        installer.log.info(f"removed {record.path}")


def _strip(installer: Installer, path: str) -> None:
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
        installer.log.info(f"removed linkerd from {path}")


def _remove_files(installer: Installer, steps: Undo) -> None:
    kubeconfig = installer.state.kubeconfig or installer.config.kubeconfig_path
    steps.attempt(functools.partial(_remove_kubeconfig, installer, kubeconfig))
    bin_dir = installer.config.host_bin_dir
    for name in (PLUGIN_LINK, NSENTER_LINK):
        path = os.path.join(bin_dir, name)
        if os.path.islink(path) and installer.is_cnibox_link(os.readlink(path)):
            steps.attempt(functools.partial(_remove, installer, path))
    copy = os.path.join(bin_dir, COPY_NAME)
    expected = installer.state.copied.get(copy)
    if os.path.isfile(copy) and (expected is None or fs.sha256_file(copy) == expected):
        steps.attempt(functools.partial(_remove, installer, copy))


def _remove_kubeconfig(installer: Installer, path: str) -> None:
    try:
        data = fs.read_file(path, CONFIG_LIMIT, follow=False)
    except ConfigError:
        data = None  # a FIFO or symlink the installer would have replaced: not a file of anyone's
    if data is not None and not is_linkerd_kubeconfig(data):
        installer.log.info(f"{path}: not a linkerd-cni kubeconfig, left alone")
        return
    _remove(installer, path)


def _remove(installer: Installer, path: str) -> None:
    if fs.remove_durably(path):
        installer.log.info(f"removed {path}")
