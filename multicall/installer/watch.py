"""Keeping the node installed: install, then react to inotify events on the CNI config dir
and the service-account dir until SIGTERM or SIGINT.

Signal handlers only record the signal (`Stop`); the loop wakes on the wake-up pipe, so a
signal never interrupts a write half-way and the undo runs from ordinary code (run.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from multicall.effects import fs
from multicall.errors import CniboxError
from multicall.installer.install import Installer, install

if TYPE_CHECKING:
    from multicall.effects.inotify import Event


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
