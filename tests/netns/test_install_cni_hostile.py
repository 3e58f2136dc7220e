"""install-cni on a read-only CNI config dir (issue 12, class 7), which needs root: the
installer runs in a private mount namespace (`unshare -m`) where net.d is a bind mount that
the test remounts read-only, so the machine's own mounts are never touched.

Cost: ~5 s from source.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import cnibox_argv, require_root, require_tool
from tests.support.installer_host import (
    Host,
    linkerd_count,
    make_host,
    put_config,
    snapshot,
)
from tests.support.logfmt import records
from tests.support.waiting import wait_for

pytestmark = pytest.mark.netns


def start_in_private_mounts(host: Host, log: Path, *, read_only: bool) -> subprocess.Popen[bytes]:
    """install-cni (watch mode) with net.d bind-mounted onto itself in its own mount ns."""
    require_root()
    for tool in ("unshare", "nsenter", "mount"):
        require_tool(tool)
    remount = 'mount -o remount,bind,ro "$0" && ' if read_only else ""
    script = f'mount --bind "$0" "$0" && {remount}exec "$@"'
    with log.open("wb") as sink:
        return subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script,
             str(host.net_dir), *cnibox_argv("install-cni")],
            env=host.env(), stderr=sink,
        )  # fmt: skip


def undo_lines(text: str) -> list[str]:
    """The messages of the installer's `undo: ...` log lines."""
    return [r["msg"] for r in records(text) if r.get("msg", "").startswith("undo: ")]


def test_net_d_turning_read_only_the_undo_goes_on_and_a_later_uninstall_finishes(
    tmp_path: Path,
) -> None:
    """SIGTERM after net.d became read-only: every step that can be undone is (binary and
    link removed), each one that cannot is reported, exit 1. The journal survives, so a later
    `--uninstall` (net.d writable again) restores every original name and byte."""
    host = make_host(tmp_path)
    put_config(host, "10-calico.conf", "10-calico.conf")
    put_config(host, "20-calico.conflist")
    before = snapshot(host.prefix)
    log = tmp_path / "installer.log"
    proc = start_in_private_mounts(host, log, read_only=False)
    wait_for(lambda: linkerd_count(host.net_dir / "20-calico.conflist") == 1, "patching")
    wait_for((host.net_dir / "10-calico.conflist").exists, "the .conf upgrade")
    subprocess.run(
        ["nsenter", "-t", str(proc.pid), "-m", "mount", "-o", "remount,bind,ro", str(host.net_dir)],
        check=True,
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 1
    text = log.read_text()
    errors = undo_lines(text)
    assert any(line.startswith(f"undo: {host.net_dir}/") for line in errors), text
    assert all(line.endswith("Read-only file system") for line in errors), text
    assert len(errors) >= 3, text  # two configs and the kubeconfig at least
    assert os.listdir(host.bin_dir) == [".cnibox-install-cni"]  # the journal, for the retry
    assert "Traceback" not in text
    assert "internal error" not in text
    undo = host.run("--uninstall")
    assert undo.returncode == 0, undo.stderr
    assert snapshot(host.prefix) == before


def test_read_only_net_d_from_the_start_changes_nothing(tmp_path: Path) -> None:
    """Nothing can be written into net.d: the installer stops with a plain message and exit
    1, and the node is as before (it used to copy the binary, then crash with exit 70)."""
    host = make_host(tmp_path)
    put_config(host, "10-calico.conflist")
    before = snapshot(host.prefix)
    log = tmp_path / "installer.log"
    proc = start_in_private_mounts(host, log, read_only=True)
    assert proc.wait(timeout=30) == 1
    text = log.read_text()
    last = records(text)[-1]
    # The journal (in the bin dir's state dir, issue 27 item 8) is written; the first write
    # into net.d fails, and the undo takes back what was done before it.
    assert last["level"] == "error", text
    assert last["msg"].startswith(f"{host.net_dir}/"), text
    assert last["msg"].endswith("Read-only file system"), text
    assert "internal error" not in text
    assert snapshot(host.prefix) == before


def _in_fresh_tmpfs(host: Host, *args: str, conf: Path | None = None) -> tuple[str, str]:
    """install-cni with the CNI config dir a fresh tmpfs (Talos' /etc/cni after a boot) in a
    private mount namespace, optionally holding `conf`; then what the dir holds."""
    require_root()
    for tool in ("unshare", "mount", "ls", "cp"):
        require_tool(tool)
    copy = f'cp "{conf}" "$0/" && ' if conf else ""
    script = f'mount -t tmpfs tmpfs "$0" && {copy}"$@" 1>&2; ls -A "$0"'
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script,
         str(host.net_dir), *cnibox_argv("install-cni"), *args],
        env=host.env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.stdout, proc.stderr


@pytest.mark.parametrize("rebooted", [True, False])
def test_a_tmpfs_config_dir_after_a_reboot_gets_nothing_back(
    tmp_path: Path, rebooted: bool
) -> None:
    """Issue 27 item 8: the state dir (bin dir) outlives a reboot, a tmpfs config dir does
    not. Records of another boot are forgotten for such a dir (an undo must not bring back
    the config the primary CNI wrote last boot); in the same boot they are kept (an undo
    after a killed run restores the original `.conf`)."""
    host = make_host(tmp_path)
    conf = tmp_path / "10-calico.conf"
    conf.write_bytes(put_config(host, "10-calico.conf", "10-calico.conf").read_bytes())
    (host.net_dir / "10-calico.conf").unlink()
    listing, err = _in_fresh_tmpfs(host, "--once", conf=conf)
    assert listing.split() == ["10-calico.conflist", "ZZZ-linkerd-cni-kubeconfig"], err
    boot = host.bin_dir / ".cnibox-install-cni" / "boot"
    assert boot.read_text().strip() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    if rebooted:
        boot.write_text("00000000-0000-0000-0000-000000000000\n")
    listing, err = _in_fresh_tmpfs(host, "--uninstall")  # the new boot's empty /etc/cni
    if rebooted:
        assert listing == "", err
        assert "forgot the config records of an earlier boot" in err
    else:
        assert listing.split() == ["10-calico.conf"], err
    assert os.listdir(host.bin_dir) == []
