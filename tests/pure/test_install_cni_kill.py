"""Crash safety: install-cni killed with SIGKILL at any instant leaves only valid configs."""

from __future__ import annotations

import io
import json
import math
import os
import random
import signal
import time
from pathlib import Path

import pytest

from multicall.applets import install_cni
from multicall.effects.fs import TEMP_SUFFIX
from tests.support.installer_host import TESTDATA, Host, linkerd_count, make_host, put_config

RUNS = 200


def reset_primary_configs(host: Host) -> None:
    """The primary CNI (re)writes its configs, as after a Talos reboot (/etc/cni is tmpfs)."""
    put_config(host, "10-calico.conf", "10-calico.conf")
    put_config(host, "20-calico.conflist", "10-calico.conflist")
    put_config(host, "30-first.conflist", "10-calico-linkerd.conflist")


def install_uninstall_forever(host: Host, undo_first: bool) -> None:
    """The child: install, undo, install, ... in-process, until the parent kills it."""
    env = host.env()
    devnull = open(os.devnull, "wb")  # noqa: SIM115  # lives until os._exit
    phases = [["--uninstall"], ["--once"]] if undo_first else [["--once"], ["--uninstall"]]
    while True:
        for args in phases:
            install_cni.main(["install-cni", *args], env, io.BytesIO(), devnull, devnull)


def check_configs(host: Host) -> int:
    """Every config parses, holds <= 1 linkerd entry; returns how many entries exist in all."""
    total = 0
    for path in host.net_dir.iterdir():
        if path.name.endswith(TEMP_SUFFIX) or not path.name.endswith((".conf", ".conflist")):
            continue
        doc = json.loads(path.read_bytes())  # raises on a torn write
        if "plugins" in doc:
            count = linkerd_count(path)
            assert count <= 1, f"{path.name} holds {count} linkerd entries"
            total += count
        else:
            assert doc.get("type") == "calico", path.name
    return total


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    """200 forked installers killed mid install/patch/undo: configs valid, <= 1 entry each."""
    host = make_host(tmp_path)
    reset_primary_configs(host)
    rng = random.Random(7)
    seen = {"with": 0, "without": 0}
    # How long a child lives before its kill, log-uniform over 1-250 ms: one install or undo
    # takes from ~2 ms (batched syncs, idle tmpfs) to far more on a loaded machine, and the
    # kills must land both while linkerd is chained and while it is not, whatever the speed.
    for _ in range(RUNS):
        undo_first = rng.random() < 0.5
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            try:
                install_uninstall_forever(host, undo_first)
            finally:
                os._exit(1)
        time.sleep(math.exp(rng.uniform(math.log(0.001), math.log(0.25))))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        seen["with" if check_configs(host) else "without"] += 1
        if rng.random() < 0.2:
            reset_primary_configs(host)
    # kills landed both while linkerd was chained and while it was not
    assert seen["with"] > 0, seen
    assert seen["without"] > 0, seen
    env = host.env()
    out = io.BytesIO()
    assert install_cni.main(["install-cni", "--uninstall"], env, io.BytesIO(), out, out) == 0
    assert check_configs(host) == 0
    assert install_cni.main(["install-cni", "--once"], env, io.BytesIO(), out, out) == 0
    assert not [p for p in host.net_dir.iterdir() if p.name.endswith(TEMP_SUFFIX)]
    assert check_configs(host) == 3


@pytest.mark.slow
def test_sigkill_of_the_command_while_it_starts(tmp_path: Path) -> None:
    """The real command (watch mode) killed during start-up: same guarantees."""
    host = make_host(tmp_path)
    rng = random.Random(11)
    for _ in range(10):
        reset_primary_configs(host)
        proc = host.start()
        time.sleep(rng.uniform(0.05, 0.5))
        proc.kill()
        proc.communicate(timeout=30)
        check_configs(host)
    assert (TESTDATA / "10-calico.conf").exists()
