"""Putting the node back as it was: each patched config restored (or stripped of linkerd),
the kubeconfig, the links and the copied binary removed.

Every step goes on after a failure (`Undo` collects the errors) so one unremovable file
never leaves the rest installed; the journal is forgotten only after an undo met no error,
for the next run (or `--uninstall`) to retry.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from multicall.core.installer import conflist
from multicall.effects import fs
from multicall.errors import CniboxError, ConfigError
from multicall.installer.install import (
    CONFIG_LIMIT,
    COPY_NAME,
    NSENTER_LINK,
    PLUGIN_LINK,
    Installer,
)
from multicall.installer.state import Original, sha256


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


def undo(installer: Installer) -> list[str]:
    """Put the node back as it was; every step goes on after a failure, and the errors
    are returned (the journal stays until an undo met none, for the next run to retry)."""
    steps = Undo()
    state = installer.state
    for target, original in sorted(state.originals.items()):
        if steps.attempt(functools.partial(_restore, installer, target, original)):
            del state.originals[target]
    for name in installer.config_names():
        path = os.path.join(installer.config.host_net_dir, name)
        steps.attempt(functools.partial(_strip, installer, path))
    _remove_files(installer, steps)
    if not steps.errors:
        steps.attempt(installer.forget)
    return steps.errors


def _restore(installer: Installer, target: str, original: Original) -> None:
    """The original name, bytes and mode, if the file still holds exactly what we wrote;
    a file changed since (or gone) keeps its content and only loses linkerd (`_strip`)."""
    try:
        current = fs.read_file(target, CONFIG_LIMIT, follow=False)
    except ConfigError:
        return  # replaced by something that is not ours (a symlink, a FIFO, ...)
    if current is None or sha256(current) != installer.state.written.get(target):
        return
    fs.write_atomic(original.path, original.data, original.mode)
    if original.path != target:
        fs.remove_durably(target)
    installer.log.info(f"restored {original.path}")


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
    steps.attempt(functools.partial(_remove, installer, kubeconfig))
    bin_dir = installer.config.host_bin_dir
    for name in (PLUGIN_LINK, NSENTER_LINK):
        path = os.path.join(bin_dir, name)
        if os.path.islink(path) and installer.is_cnibox_link(os.readlink(path)):
            steps.attempt(functools.partial(_remove, installer, path))
    copy = os.path.join(bin_dir, COPY_NAME)
    expected = installer.state.copied.get(copy)
    if os.path.isfile(copy) and (expected is None or fs.sha256_file(copy) == expected):
        steps.attempt(functools.partial(_remove, installer, copy))


def _remove(installer: Installer, path: str) -> None:
    if fs.remove_durably(path):
        installer.log.info(f"removed {path}")
