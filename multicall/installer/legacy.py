"""Taking over the state dir an older cnibox kept in the host CNI config dir
(`<config dir>/.cnibox-install-cni`, before issue 27 moved it to the bin dir): its undo
journal and records move into today's state dir, so an upgrade never loses what an earlier,
killed run left for the undo.

Rules of this module:
1. The old dir is read under its own lock (lock.py): an older installer still running there
   (a rollout's old pod, before its undo) finishes first, and afterwards nothing writes it.
2. Nothing is removed before it is written in the new place (write-ahead, atomic writes, as
   every journal write): a kill between the two leaves both, and the next run merges again.
   For a config both dirs record, the new dir's record wins (it is the later one).
3. An old journal or record that cannot be read is never removed: the installer stops
   before any change, naming the file, as it does for its own journal (install.install).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os

from multicall.effects import fs, pidfile
from multicall.effects.log import Logger
from multicall.errors import ConfigError
from multicall.installer.install import Installer
from multicall.installer.lock import host_lock


def take_over(installer: Installer) -> int:
    """Move what the old state dir holds into `installer`'s (rules 1-3); returns how many
    config records came over. The caller holds the new dir's lock."""
    config = installer.config
    legacy = config.legacy_state_dir
    parent = os.path.dirname(config.state_dir.rstrip("/")) or "/"
    if legacy == config.state_dir or not os.path.isdir(legacy) or not os.path.isdir(parent):
        return 0  # nothing to take over, or nowhere to put it (run.uninstall reads it there)
    quiet = Logger(None)
    with host_lock(legacy, installer.log, create_parents=False):
        old_config = dataclasses.replace(config, state_dir_env=legacy, pid_file_env="")
        old = Installer(old_config, installer.options, quiet, binary="")
        new = Installer(config, installer.options, quiet, binary="")
        for who in (old, new):
            errors = who.resume()
            if errors:
                raise ConfigError(
                    f"{errors[0]}: the undo journal cannot be read, so taking over "
                    f"{legacy} could lose the original configs it holds",
                    hint="restore the CNI configs it names by hand, then remove the file",
                )
        found = bool(old.journaled or old.state.records)
        taken = []
        for path, record in old.state.records.items():
            if path not in new.state.records:
                new.state.records[path] = record
                taken.append(record)
        moved = len(taken)
        if taken:
            new.write_records(taken)
        for path, digest in old.state.copied.items():
            new.state.copied.setdefault(path, digest)
        new.state.kubeconfig = new.state.kubeconfig or old.state.kubeconfig
        if old.journaled or old.state.copied or old.state.kubeconfig:
            new.record()
        # Only now, with everything written in the new dir, does the old one go.
        for path in list(old.state.records):
            old.drop_record(path)
        old.forget()
        with contextlib.suppress(OSError, ConfigError):
            if pidfile.running(old_config.pid_file) is None:
                fs.remove_durably(old_config.pid_file)
    if found:
        installer.log.info(
            f"took over the undo journal of an earlier cnibox from {legacy} ({moved} configs)"
        )
    return moved
