"""install-cni against hostile nodes and environments (issue 12, classes 3b, 6b, 7, 8): FIFOs,
symlinks to devices, oversized files, paths that climb out of their directory, forged pid
files, undo after SIGKILL, undo that meets errors. No root needed (the read-only mount case is
in tests/netns/test_install_cni_hostile.py).

Every run is bounded (the command's own timeout, and explicit bounds where the point is not to
block); no output ever carries an exception name or a traceback. Cost: ~20 s from source.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.installer_host import (
    TESTDATA,
    Host,
    linkerd_count,
    make_host,
    put_config,
    record_file,
    snapshot,
)
from tests.support.logfmt import records
from tests.support.plain import assert_plain
from tests.support.waiting import wait_for

STATE = ".cnibox-install-cni"
MiB = 1 << 20


def run_measured(host: Host, *args: str, **env: str) -> tuple[int, str, int]:
    """(exit status, stderr, peak RSS in KiB) of one install-cni run (wait4's own rusage)."""
    proc = subprocess.Popen(
        [*host_argv(), *args], env=host.env(**env), stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    return proc.returncode, err, usage.ru_maxrss


def host_argv() -> list[str]:
    from tests.support import cnibox_argv

    return cnibox_argv("install-cni")


def baseline_rss(host: Host) -> int:
    """Peak RSS of a plain --once on a normal node: what 'bounded' is measured against."""
    put_config(host, "10-calico.conflist")
    code, err, rss = run_measured(host, "--once")
    assert code == 0, err
    return rss


# ----------------------------------------------------------------------------- class 3b


class TestFilesThatAreNotFiles:
    def test_fifo_in_net_d_neither_blocks_install_nor_undo(self, tmp_path: Path) -> None:
        """A FIFO named like a config is left alone by the patcher and the undo (neither
        waits for a writer); everything else is installed and removed."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        os.mkfifo(host.net_dir / "05-fifo.conflist")
        before = snapshot(host.prefix)
        once = host.run("--once")
        assert once.returncode == 0, once.stderr
        assert f"{host.net_dir}/05-fifo.conflist: a FIFO, not a regular file: left alone" in (
            once.stderr
        )
        assert linkerd_count(host.net_dir / "10-calico.conflist") == 1
        undo = host.run("--uninstall")
        assert undo.returncode == 0, undo.stderr
        assert snapshot(host.prefix) == before
        assert_plain(once.stderr + undo.stderr)

    def test_symlink_to_dev_zero_is_never_read(self, tmp_path: Path) -> None:
        """A config symlinked to /dev/zero: no endless read, no crash; the watcher's undo
        removes the kubeconfig, the binary and the link all the same."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        (host.net_dir / "06-zero.conflist").symlink_to("/dev/zero")
        before = snapshot(host.prefix)
        proc = host.start()
        wait_for(lambda: linkerd_count(host.net_dir / "10-calico.conflist") == 1, "patching")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "06-zero.conflist: a symlink, left alone" in err
        assert snapshot(host.prefix) == before
        assert_plain(err)

    @pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero-link"])
    def test_token_that_is_not_a_file_fails_fast_and_leaves_nothing(
        self, tmp_path: Path, kind: str
    ) -> None:
        """The service-account token as a FIFO, a directory or /dev/zero: a clear error
        naming the file, exit 1 within seconds, and the binary installed before is undone."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        token = host.sa_dir / "token"
        token.unlink()
        if kind == "fifo":
            os.mkfifo(token)
        elif kind == "directory":
            token.mkdir()
        else:
            token.symlink_to("/dev/zero")
        before = snapshot(host.prefix)
        start = time.monotonic()
        proc = host.start()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - start < 10
        assert proc.returncode == 1, err
        described = {"fifo": "a FIFO", "directory": "a directory",
                     "dev-zero-link": "a character device"}[kind]  # fmt: skip
        assert f"{token}: {described}, not a regular file" in err
        assert snapshot(host.prefix) == before
        assert_plain(err)

    def test_kubeconfig_path_taken_by_a_fifo_is_replaced_not_read(self, tmp_path: Path) -> None:
        host = make_host(tmp_path)
        os.mkfifo(host.kubeconfig)
        proc = host.run("--once")
        assert proc.returncode == 0, proc.stderr
        assert host.kubeconfig.is_file()
        assert host.kubeconfig.read_bytes().startswith(b"# kubeconfig file for linkerd.io")


class TestOversizedFiles:
    def test_oversized_config_is_left_alone_in_bounded_memory(self, tmp_path: Path) -> None:
        """A 2 GiB (sparse) .conflist: refused by name with the 1 MiB limit, never read
        whole: peak RSS stays within 50 MiB of a normal run's."""
        host = make_host(tmp_path)
        normal = baseline_rss(host)
        huge = host.net_dir / "20-huge.conflist"
        with huge.open("wb") as f:
            f.truncate(2 << 30)
        code, err, rss = run_measured(host, "--once")
        assert code == 0, err
        assert f"{huge}: the CNI network config is larger than the 1 MiB limit: left alone" in err
        assert rss - normal < 50 * 1024, (normal, rss)
        assert huge.stat().st_size == 2 << 30
        assert_plain(err)

    def test_oversized_network_config_file_is_a_clear_error(self, tmp_path: Path) -> None:
        host = make_host(tmp_path)
        big = tmp_path / "big.json"
        with big.open("wb") as f:
            f.truncate(3 * MiB)
        code, err, _ = run_measured(
            host, "--once", CNI_NETWORK_CONFIG="", CNI_NETWORK_CONFIG_FILE=str(big)
        )
        assert code == 1
        assert (
            records(err)[-1]["msg"] == f"{big}: the network config is larger than the 1 MiB limit"
        )
        assert_plain(err)


# ----------------------------------------------------------------------------- class 6b


class TestPathsFromTheEnvironment:
    @pytest.mark.parametrize(
        ("variable", "value", "message"),
        [
            ("KUBECONFIG_FILE_NAME", "../../x", "KUBECONFIG_FILE_NAME='../../x': a path from the "
             "environment may not contain '..'"),
            ("KUBECONFIG_FILE_NAME", ".", "must lie inside"),
            ("DEST_CNI_NET_DIR", "/etc/cni/../../../tmp", "may not contain '..'"),
            ("DEST_CNI_BIN_DIR", "/../x", "may not contain '..'"),
            ("CONTAINER_MOUNT_PREFIX", "/host/..", "may not contain '..'"),
            ("SERVICE_ACCOUNT_DIR", "/var/run/../../etc", "may not contain '..'"),
            ("CNI_CONF_NAME", "../10-calico.conflist", "must be a file name"),
            ("CNIBOX_STATE_DIR", "/tmp/../etc", "may not contain '..'"),
            ("INSTALL_CNI_PID_FILE", "/run/../tmp/pid", "may not contain '..'"),
            ("CNIBOX_HOST_CACHE", "/host/var/lib/../../../tmp", "may not contain '..'"),
        ],
    )  # fmt: skip
    def test_escaping_paths_are_refused_before_anything_changes(
        self, tmp_path: Path, variable: str, value: str, message: str
    ) -> None:
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        before = snapshot(tmp_path)
        for mode in ("--once", "--uninstall"):
            proc = host.run(mode, **{variable: value})
            assert proc.returncode == 1, proc.stderr
            assert message in proc.stderr
            assert_plain(proc.stderr)
        assert snapshot(tmp_path) == before

    def test_uninstall_never_signals_a_process_the_pid_file_only_pretends_to_be(
        self, tmp_path: Path
    ) -> None:
        """A pid file naming an unrelated live process (same pid, other start time and
        command line) is not acted on: that process lives on."""
        host = make_host(tmp_path)
        victim = subprocess.Popen(["sleep", "30"])
        try:
            pid_file = tmp_path / "install-cni.pid"
            forged = {"pid": victim.pid, "start": "1", "exe": "/bin/sleep", "cmdline": "0" * 64}
            pid_file.write_text(json.dumps(forged))
            proc = host.run("--uninstall")
            assert proc.returncode == 0, proc.stderr
            time.sleep(0.2)
            assert victim.poll() is None
        finally:
            victim.kill()
            victim.wait()

    def test_pid_file_in_a_world_writable_dir_is_not_trusted(self, tmp_path: Path) -> None:
        host = make_host(tmp_path)
        shared = tmp_path / "tmp"
        shared.mkdir()
        shared.chmod(0o1777)
        victim = subprocess.Popen(["sleep", "30"])
        try:
            (shared / "install-cni.pid").write_text(json.dumps({"pid": victim.pid}))
            proc = host.run("--uninstall", INSTALL_CNI_PID_FILE=str(shared / "install-cni.pid"))
            assert proc.returncode == 0, proc.stderr
            assert f"{shared}: others may write to it" in proc.stderr
            assert victim.poll() is None
        finally:
            victim.kill()
            victim.wait()


# ----------------------------------------------------------------------------- class 7


class TestUndoJournal:
    def test_sigkill_then_uninstall_restores_names_and_bytes(self, tmp_path: Path) -> None:
        """Killed (SIGKILL) after converting a .conf: --uninstall restores the .conf with its
        bytes and mode from the journal, and leaves no state behind."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conf", "10-calico.conf")
        (host.net_dir / "10-calico.conf").chmod(0o640)
        put_config(host, "20-calico.conflist")
        before = snapshot(host.prefix)
        proc = host.start()
        wait_for((host.net_dir / "10-calico.conflist").exists, "the .conf upgrade")
        wait_for(lambda: linkerd_count(host.net_dir / "20-calico.conflist") == 1, "patching")
        proc.kill()
        proc.communicate(timeout=30)
        assert not (host.net_dir / "10-calico.conf").exists()
        undo = host.run("--uninstall")
        assert undo.returncode == 0, undo.stderr
        assert snapshot(host.prefix) == before

    def test_restarted_installer_undoes_what_the_killed_one_did(self, tmp_path: Path) -> None:
        host = make_host(tmp_path)
        put_config(host, "10-calico.conf", "10-calico.conf")
        before = snapshot(host.prefix)
        first = host.start()
        wait_for((host.net_dir / "10-calico.conflist").exists, "the .conf upgrade")
        first.kill()
        first.communicate(timeout=30)
        log = tmp_path / "second.log"
        with log.open("w") as sink:
            second = subprocess.Popen(host_argv(), env=host.env(), stderr=sink)
            wait_for(lambda: "resumed the undo journal" in log.read_text(), "the resume")
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0, log.read_text()
        assert snapshot(host.prefix) == before

    def test_a_file_changed_since_only_loses_its_linkerd_entry(self, tmp_path: Path) -> None:
        """As the in-memory undo: a config rewritten by someone else after the installer's
        write is not restored from the journal (their bytes win); only linkerd goes."""
        host = make_host(tmp_path)
        path = put_config(host, "10-calico.conflist")
        proc = host.start()
        wait_for(lambda: linkerd_count(path) == 1, "patching")
        proc.kill()
        proc.communicate(timeout=30)
        doc = json.loads(path.read_bytes())
        doc["name"] = "rewritten-by-the-primary-cni"
        path.write_text(json.dumps(doc))
        undo = host.run("--uninstall")
        assert undo.returncode == 0, undo.stderr
        after = json.loads(path.read_bytes())
        assert after["name"] == "rewritten-by-the-primary-cni"
        assert linkerd_count(path) == 0

    @pytest.mark.parametrize(
        "journal",
        [b"{", b"[" * 100000, json.dumps({"version": 1, "patched": [{"target": "/etc/passwd",
         "original_path": "/etc/passwd", "original": "", "mode": 420, "written": ""}]}).encode()],
        ids=["truncated", "deep", "outside"],
    )  # fmt: skip
    def test_a_bad_journal_is_not_trusted(self, tmp_path: Path, journal: bytes) -> None:
        """A journal that is not JSON, nests too deep or names a path outside the CNI dir is
        not trusted and never ignored: the undo still removes linkerd, the kubeconfig and the
        binary, then fails (exit 1) saying what to do, and the journal stays."""
        host = make_host(tmp_path)
        path = put_config(host, "10-calico.conflist")
        assert host.run("--once").returncode == 0
        (host.bin_dir / STATE / "undo.json").write_bytes(journal)
        undo = host.run("--uninstall")
        assert undo.returncode == 1, undo.stderr
        assert "undo.json: the undo journal" in undo.stderr
        assert "restore it by hand" in undo.stderr
        assert (host.bin_dir / STATE / "undo.json").read_bytes() == journal
        assert linkerd_count(path) == 0
        assert sorted(p.name for p in host.bin_dir.iterdir()) == [STATE]  # the journal kept
        assert_plain(undo.stderr)

    def test_undo_goes_on_past_errors_and_reports_them_all(self, tmp_path: Path) -> None:
        """Two things that cannot be undone (the record of a converted config made unreadable,
        the kubeconfig turned into a non-empty directory): every other step still runs
        (binary and link removed, the other config restored), each error is reported, the
        exit status is 1 and the journal stays for a later retry."""
        host = make_host(tmp_path)
        good = put_config(host, "10-calico.conflist")
        assert host.run("--once").returncode == 0
        # A later run: its records in a group of their own (a batch's records share one
        # file, and an unreadable file loses the originals of all it holds).
        put_config(host, "20-calico.conf", "10-calico.conf")
        assert host.run("--once").returncode == 0
        record = record_file(host.bin_dir / STATE / "patched", "20-calico.conf")
        record.write_bytes(b"{")
        host.kubeconfig.unlink()
        host.kubeconfig.mkdir()
        (host.kubeconfig / "x").write_text("")
        undo = host.run("--uninstall")
        assert undo.returncode == 1, undo.stderr
        errors = [r["msg"] for r in records(undo.stderr) if r["msg"].startswith("undo: ")]
        assert len(errors) == 2, undo.stderr
        assert any(record.name in e for e in errors)
        assert any(str(host.kubeconfig) in e for e in errors)
        assert good.read_bytes() == (TESTDATA / "10-calico.conflist").read_bytes()
        assert sorted(p.name for p in host.bin_dir.iterdir()) == [STATE]  # the journal kept
        assert (host.bin_dir / STATE / "undo.json").exists()
        assert record.read_bytes() == b"{"
        assert_plain(undo.stderr)
