"""install-cni's watcher against a primary CNI's ways of writing, and kubelet's token swap."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.support.installer_host import TESTDATA, cpu_seconds, linkerd_count, make_host
from tests.support.waiting import wait_for

CALICO = (TESTDATA / "10-calico.conflist").read_bytes()


def chained_last(path: Path) -> bool:
    doc = json.loads(path.read_bytes())
    return linkerd_count(path) == 1 and doc["plugins"][-1]["type"] == "linkerd-cni"


def test_watcher_repatches_every_kind_of_write(tmp_path: Path) -> None:
    """Late write, in-place rewrite (MODIFY only), rename-in, delete+recreate, token swap."""
    host = make_host(tmp_path)
    conf = host.net_dir / "10-calico.conflist"
    proc = host.start()
    try:
        token0 = (TESTDATA / "auth-token").read_text().strip()
        wait_for(lambda: token0 in host.kubeconfig.read_text(), "the first kubeconfig")

        # 1. the primary CNI writes its config after the installer started
        conf.write_bytes(CALICO)
        wait_for(lambda: chained_last(conf), "patching a late config")

        # 2. calico style: rewritten in place, the file is never replaced (only IN_MODIFY)
        inode = conf.stat().st_ino
        fd = os.open(conf, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, CALICO[:100])
        time.sleep(0.05)
        os.write(fd, CALICO[100:])
        os.close(fd)
        wait_for(lambda: chained_last(conf), "patching an in-place rewrite")
        assert conf.stat().st_ino != inode  # our atomic write replaced it

        # 3. written elsewhere and renamed in (IN_MOVED_TO)
        staged = host.net_dir / ".calico.tmp"
        staged.write_bytes(CALICO)
        os.rename(staged, conf)
        wait_for(lambda: chained_last(conf), "patching a renamed-in config")

        # 4. deleted, then created again
        conf.unlink()
        time.sleep(0.05)
        conf.write_bytes(CALICO)
        wait_for(lambda: chained_last(conf), "patching a recreated config")

        # 5. kubelet rotates the token: ..data is swapped to a new timestamped dir
        token1 = (TESTDATA / "auth-token-new").read_bytes()
        host.swap_token(token1, 1)
        wait_for(lambda: token1.decode().strip() in host.kubeconfig.read_text(), "new token")
        assert token0 not in host.kubeconfig.read_text()
        assert host.kubeconfig.stat().st_mode & 0o777 == 0o600

        # settled: exactly one entry, and an idle installer burns no CPU (no polling loop)
        time.sleep(0.3)
        assert chained_last(conf)
        idle_start = cpu_seconds(proc.pid)
        time.sleep(1.0)
        assert cpu_seconds(proc.pid) - idle_start < 0.05
        assert cpu_seconds(proc.pid) < 10.0
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert linkerd_count(conf) == 0
    assert not host.kubeconfig.exists()


def test_many_configs_at_once_each_get_one_entry(tmp_path: Path) -> None:
    """A burst of configs (several events per batch) ends with one entry in each."""
    host = make_host(tmp_path)
    proc = host.start()
    try:
        wait_for(host.kubeconfig.exists, "the kubeconfig")
        paths = [host.net_dir / f"{n:02d}-net.conflist" for n in range(20)]
        for path in paths:
            path.write_bytes(CALICO)
        for path in paths:
            wait_for(lambda p=path: chained_last(p), f"patching {path.name}")  # type: ignore[misc]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert all(p.read_bytes() == CALICO for p in paths)
