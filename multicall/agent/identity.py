"""The agent's own API identity, read lazily from `--kubeconfig PATH` by the processes that
need it (the pod cache's watcher, the keeper), never by the agent's start.

Rules of this module:
1. `wait` loads the kubeconfig, retrying on core/agent_identity.py's schedule until it
   loads or the stop descriptor is readable (the agent stops): a file that is missing or
   cannot be used yet (mid-write, malformed) is logged once and retried, never a crash.
2. After it loaded, `current` notices a rewritten file (inode, mtime or size changed: one
   stat per call) and loads it again: install-cni rewrites its kubeconfig with a new token.
   A rewrite that cannot be used (mid-write, removed) keeps the configuration loaded before
   (its token may still work) and is logged once per change of the file.
3. `generation` counts the configurations loaded: a user compares it to the one its
   connection was made with, and makes a new connection when it changed (its next
   connect or reconnect).
"""

from __future__ import annotations

import os
import random
import select
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from multicall.core.agent_identity import IdentityWait, Problem
from multicall.plugin.in_place import ControllerKube

if TYPE_CHECKING:
    from multicall.core.kube.kubeconfig import KubeConfig
    from multicall.effects.kube.stream import Session
    from multicall.plugin.ports import PodApi

Log = Callable[[str, str], None]  # (level, message)
Stamp = tuple[int, int, int, int]  # device, inode, mtime (ns), size


def stamp_of(path: str) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def try_load(path: str) -> tuple[KubeConfig | None, Problem | None, str]:
    """The kubeconfig at `path`, or why not (its problem and a one-line reason)."""
    from multicall.effects.kube.stream import ClientOptions, Token, load_config
    from multicall.errors import KubeError

    if not os.path.lexists(path):
        return None, Problem.MISSING, "no such file"
    try:
        # kubeconfig given: load_config reads that file only (no in-cluster fallback)
        config = load_config(ClientOptions(kubeconfig=path), {})
        Token(config).value()  # its token, read as a connection will (inline or file)
        return config, None, ""
    except KubeError as exc:
        return None, Problem.UNUSABLE, exc.message


def stop_sleep(stop_fd: int) -> Callable[[float], bool]:
    """A sleep that ends early when `stop_fd` turns readable; True when it did (stop)."""

    def sleep(seconds: float) -> bool:
        return bool(select.select([stop_fd], [], [], seconds)[0])

    return sleep


class KubeconfigSource:
    """The agent's kubeconfig as the processes that need it see it (rules 1-3)."""

    def __init__(self, path: str, what: str, log: Log) -> None:
        self.path = path
        self.what = what  # "pod cache", "keeper": who logs
        self.log = log
        self.config: KubeConfig | None = None
        self.generation = 0
        self._stamp: Stamp | None = None  # of the file as last loaded
        self._seen: Stamp | None = None  # of the file as last looked at (rule 2)
        self._lock = threading.Lock()  # the pod cache's two watch threads share one

    def wait(
        self,
        sleep: Callable[[float], bool],
        now: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> KubeConfig | None:
        """Rule 1: the configuration, or None when `sleep` reported a stop."""
        waiting = IdentityWait(self.what, self.path)
        while True:
            stamp = stamp_of(self.path)
            config, problem, detail = try_load(self.path)
            if config is not None:
                if line := waiting.loaded():
                    self.log("info", line)
                with self._lock:
                    self.config, self._stamp, self._seen = config, stamp, stamp
                    self.generation += 1
                return config
            assert problem is not None
            delay, line = waiting.failed(now(), draw(), problem, detail)
            if line:
                self.log("warning", line)
            if sleep(delay):
                return None

    def current(self) -> tuple[KubeConfig, int]:
        """Rule 2: the configuration now (reloaded when the file changed), and its
        generation (rule 3). Only after `wait` returned one."""
        with self._lock:
            assert self.config is not None
            stamp = stamp_of(self.path)
            if stamp != self._seen:
                self._seen = stamp
                config, _problem, detail = try_load(self.path)
                if config is not None:
                    self.config, self._stamp = config, stamp
                    self.generation += 1
                    self.log("info", f"{self.what}: kubeconfig {self.path} changed; reloaded")
                else:
                    self.log(
                        "warning",
                        f"{self.what}: kubeconfig {self.path} changed and cannot be used "
                        f"({detail}); keeping the one loaded before",
                    )
            return self.config, self.generation


Current = Callable[[], "tuple[KubeConfig, int]"]  # `KubeconfigSource.current`, or a fixed one


class Sessions:
    """The keeper's API session, made again when the configuration's generation changed
    (rule 3): its next Event or pod GET connects with the kubeconfig as rewritten."""

    def __init__(self, current: Current) -> None:
        self.current = current
        self._session: Session | None = None
        self._generation = -1

    def __call__(self) -> Session:
        from multicall.effects.kube.stream import ClientOptions, Session, Token

        config, generation = self.current()
        if self._session is None or generation != self._generation:
            if self._session is not None:
                self._session.close()
            self._session = Session(config, Token(config), ClientOptions())
            self._generation = generation
        return self._session


class FollowedKube(ControllerKube):
    """The repair's `Kube` port with the agent's configuration as it is at each repair."""

    def __init__(self, current: Current) -> None:
        super().__init__(current()[0])
        self.current = current

    def connect(self, kubeconfig: str, env: Mapping[str, str]) -> PodApi:
        self.config = self.current()[0]
        return super().connect(kubeconfig, env)
