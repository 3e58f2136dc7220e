"""Concurrent writers for the firewall tests: ADDs through the plugin seam in forked children
started at the same instant, and other programs holding the xtables lock for a moment.

Rules of this module:
1. A `Forked` child runs one function after the parent says go (all children of a batch are
   released by one write each, so they start within microseconds of each other), reports a
   picklable result through a pipe and always ends with os._exit: it never returns into
   pytest.
2. ADDs here are the plugin's real ADD (`run_plugin`: config decoding, pod policy, the real
   firewall engine with its locks and retries) with the Kubernetes API faked in memory: the
   API is not what these tests are about, and a forked ADD costs milliseconds, not a process
   start.
3. Lock holders only ever lock a file the test made (never the machine's /run/xtables.lock,
   which other suites on this machine use).
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pickle
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multicall.effects.firewall.locks import XtablesLock
from multicall.plugin.ports import PluginDeps, RealFirewall
from multicall.plugin.run import PluginRequest, run_plugin
from tests.support.fakes import FakeKube
from tests.support.libcni import CHART_LINKERD
from tests.support.paths import FIXTURES
from tests.support.pods import MESHED
from tests.support.rig import Netns

PREV = json.loads(
    (FIXTURES / "derived" / "linkerd-cni-stdout" / "prev-100.stdin.json").read_text()
)["prevResult"]
KUBECONFIG = "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"


def add_stdin(linkerd: Mapping[str, Any] | None = None, kubeconfig: str = KUBECONFIG) -> bytes:
    """The chart's linkerd-cni entry with a prevResult, as libcni hands it over."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "cbxnet",
            "type": "linkerd-cni",
            "log_level": "info",
            "kubernetes": {"kubeconfig": kubeconfig},
            "linkerd": {**CHART_LINKERD, **(linkerd or {})},
            "prevResult": PREV,
        }
    ).encode()


def add_env(netns: str, pod: Mapping[str, Any] = MESHED) -> dict[str, str]:
    meta = pod["metadata"]
    return {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c0ffee",
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": f"K8S_POD_NAMESPACE={meta['namespace']};K8S_POD_NAME={meta['name']}",
    }


@dataclass(frozen=True)
class AddOutcome:
    exit_code: int
    stdout: bytes
    log: bytes


def seam_add(netns: str, linkerd: Mapping[str, Any], lock: XtablesLock) -> AddOutcome:
    """One ADD of the meshed pod through run_plugin with the real firewall."""
    kube = FakeKube()
    kube.add_pod(MESHED)
    log = io.BytesIO()
    result = run_plugin(
        PluginRequest(env=add_env(netns), stdin=add_stdin(linkerd), stderr=log),
        PluginDeps(kube, RealFirewall(lock)),
    )
    return AddOutcome(result.exit_code, result.stdout, log.getvalue())


class Forked:
    """`work()` in a forked child that waits for `go()`; `result()` is what it returned."""

    def __init__(self, work: Callable[[], object]) -> None:
        go_read, self._go = os.pipe()
        self._out, out_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the child's coverage is not collected
            try:
                os.close(self._go)
                os.close(self._out)
                os.read(go_read, 1)
                try:
                    outcome: tuple[str, object] = ("ok", work())
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    outcome = ("raised", f"{type(exc).__name__}: {exc}")
                with os.fdopen(out_write, "wb") as out:
                    out.write(pickle.dumps(outcome))
            finally:
                os._exit(0)
        os.close(go_read)
        os.close(out_write)

    def go(self) -> None:
        os.write(self._go, b"!")
        os.close(self._go)

    def running(self) -> bool:
        pid, _ = os.waitpid(self.pid, os.WNOHANG)
        return pid == 0

    def result(self) -> Any:
        with os.fdopen(self._out, "rb") as out:
            data = out.read()
        os.waitpid(self.pid, 0)
        kind, value = pickle.loads(data)  # noqa: S301 - our own child, over our own pipe
        if kind != "ok":
            raise AssertionError(f"the child raised {value}")
        return value


def together(*works: Callable[[], object]) -> list[Forked]:
    """Fork every work first, then release them all at once."""
    return release([Forked(work) for work in works])


def release(children: list[Forked]) -> list[Forked]:
    for child in children:
        child.go()
    return children


def is_locked(path: Path) -> bool:
    """Whether someone holds an flock on `path` (probed without keeping it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextmanager
def flock_held(path: Path) -> Iterator[None]:
    """A plain flock holder: the test process itself, on its own file description.

    Fork children before taking it: a child forked while it is held shares the description
    and keeps the lock held after the test lets go."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextmanager
def iptables_restore_holding(ns: Netns, lock_file: Path) -> Iterator[None]:
    """Debian's `iptables-legacy-restore -w` inside `ns`, holding the xtables lock: iptables
    takes it at `*nat` and lets go at COMMIT, so the body runs while it is held."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns.name, "env", f"XTABLES_LOCKFILE={lock_file}",
         "iptables-legacy-restore", "-w", "--noflush"],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdin is not None
    try:
        proc.stdin.write("*nat\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 10
        while not is_locked(lock_file):
            assert time.monotonic() < deadline, "iptables-legacy-restore never took the lock"
            time.sleep(0.005)
        yield
    finally:
        proc.stdin.write("COMMIT\n")
        _, err = proc.communicate(timeout=30)  # closes stdin: restore commits and exits
        assert proc.returncode == 0, err
