"""install-cni as a command: one-shot install, uninstall, Talos node binary, SIGTERM undo."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.support import FIXTURES
from tests.support.installer_host import (
    TESTDATA,
    linkerd_count,
    make_host,
    put_config,
    record_file,
    snapshot,
)
from tests.support.waiting import wait_for

HASHES = json.loads((FIXTURES / "derived" / "linkerd-go-installer" / "hashes.json").read_text())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class TestOnce:
    def test_installs_binary_kubeconfig_and_patches_every_config(self, tmp_path: Path) -> None:
        """--once: binary copied, linkerd-cni linked, kubeconfig 0600, configs patched like Go."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conf", "10-calico.conf")
        put_config(host, "20-calico.conflist", "10-calico.conflist")
        put_config(host, "30-linkerd-first.conflist", "10-calico-linkerd.conflist")
        proc = host.run("--once")
        assert proc.returncode == 0, proc.stderr
        assert not (host.net_dir / "10-calico.conf").exists()
        assert sha(host.net_dir / "10-calico.conflist") == HASHES["10-calico.conf"]["sha256"]
        assert sha(host.net_dir / "20-calico.conflist") == HASHES["10-calico.conflist"]["sha256"]
        first = HASHES["10-calico-linkerd.conflist"]["sha256"]
        assert sha(host.net_dir / "30-linkerd-first.conflist") == first
        copy = host.bin_dir / "cnibox"
        assert copy.read_bytes() == host.binary.read_bytes()
        assert copy.stat().st_mode & 0o777 == 0o755
        assert os.readlink(host.bin_dir / "linkerd-cni") == "cnibox"
        assert not (host.bin_dir / "nsenter").exists()
        assert (
            host.kubeconfig.read_bytes() == (TESTDATA / "kubeconfig-exp-sibling.yaml").read_bytes()
        )
        assert host.kubeconfig.stat().st_mode & 0o777 == 0o600

    def test_second_run_changes_nothing(self, tmp_path: Path) -> None:
        """Running again over its own result rewrites nothing (same bytes, same inodes)."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        assert host.run("--once").returncode == 0
        inode = (host.net_dir / "10-calico.conflist").stat().st_ino
        before = snapshot(host.prefix)
        assert host.run("--once").returncode == 0
        assert snapshot(host.prefix) == before
        assert (host.net_dir / "10-calico.conflist").stat().st_ino == inode

    def test_invalid_primary_config_is_logged_and_left_alone(self, tmp_path: Path) -> None:
        """Broken JSON is neither fatal nor rewritten; the other configs are still patched."""
        host = make_host(tmp_path)
        bad = host.net_dir / "05-broken.conflist"
        bad.write_bytes(b'{"plugins": [')
        put_config(host, "10-calico.conflist")
        proc = host.run("--once")
        assert proc.returncode == 0, proc.stderr
        assert bad.read_bytes() == b'{"plugins": ['
        assert "05-broken.conflist: left alone: existing CNI configuration is not valid JSON" in (
            proc.stderr
        )
        assert linkerd_count(host.net_dir / "10-calico.conflist") == 1

    def test_link_nsenter_only_when_asked_and_never_over_a_host_file(self, tmp_path: Path) -> None:
        """--link-nsenter links nsenter; a foreign nsenter in the bin dir is left alone."""
        host = make_host(tmp_path)
        assert host.run("--once", "--link-nsenter").returncode == 0
        assert os.readlink(host.bin_dir / "nsenter") == "cnibox"
        other = make_host(tmp_path / "other")
        (other.bin_dir / "nsenter").write_bytes(b"util-linux")
        proc = other.run("--once", "--link-nsenter")
        assert proc.returncode == 0
        assert (other.bin_dir / "nsenter").read_bytes() == b"util-linux"
        assert "is not cnibox: left alone" in proc.stderr

    def test_node_binary_from_the_talos_extension_is_linked_not_copied(
        self, tmp_path: Path
    ) -> None:
        """With cnibox under /usr/local on the node, linkerd-cni points there; nothing is copied."""
        host = make_host(tmp_path)
        on_node = host.prefix / "usr" / "local" / "lib" / "cnibox" / "cnibox"
        on_node.parent.mkdir(parents=True)
        on_node.write_bytes(b"extension cnibox")
        on_node.chmod(0o755)
        proc = host.run("--once")
        assert proc.returncode == 0, proc.stderr
        assert os.readlink(host.bin_dir / "linkerd-cni") == "/usr/local/lib/cnibox/cnibox"
        assert not (host.bin_dir / "cnibox").exists()

    @pytest.mark.parametrize("mode", [("--once",), ()])
    def test_a_required_node_binary_that_is_missing_is_named_and_nothing_changes(
        self, mode: tuple[str, ...], tmp_path: Path
    ) -> None:
        """Issue 27 item 1: the chart's talos.extension sets CNIBOX_HOST_BINARY and mounts the
        extension dir's parent without a type; on a node without the extension install-cni
        says so in one line, exit 1, and copies nothing in its place."""
        host = make_host(tmp_path)
        (host.prefix / "usr" / "local" / "lib").mkdir(parents=True)
        put_config(host, "10-calico.conflist")
        before = snapshot(host.prefix)
        proc = host.run(*mode, CNIBOX_HOST_BINARY="/usr/local/lib/cnibox/cnibox")
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert "the cnibox Talos system extension is not on this node: " in last
        assert "/usr/local/lib/cnibox/cnibox is missing or not an executable file" in last
        assert "docs/talos.md, route B" in last
        assert "Traceback" not in proc.stderr
        assert snapshot(host.prefix) == before

    def test_cni_conf_name_restricts_patching(self, tmp_path: Path) -> None:
        """CNI_CONF_NAME=x patches only x."""
        host = make_host(tmp_path)
        put_config(host, "10-a.conflist")
        put_config(host, "20-b.conflist")
        assert host.run("--once", CNI_CONF_NAME="20-b.conflist").returncode == 0
        assert linkerd_count(host.net_dir / "10-a.conflist") == 0
        assert linkerd_count(host.net_dir / "20-b.conflist") == 1


class TestStateDir:
    """Issue 27 item 8: the installer's state lives outside the CNI config dir."""

    def test_the_config_dir_holds_only_configs_and_the_kubeconfig(self, tmp_path: Path) -> None:
        """What upstream's `CheckCNIPluginIsLast` integration check expects of the config
        dir: the primary conflist and linkerd's kubeconfig, nothing else, while installed
        (watching, too); the undo journal is in the bin dir's hidden state dir."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conf", "10-calico.conf")
        assert host.run("--once").returncode == 0
        assert sorted(os.listdir(host.net_dir)) == ["10-calico.conflist", host.kubeconfig.name]
        assert (host.bin_dir / ".cnibox-install-cni" / "patched").is_dir()
        put_config(host, "20-calico.conflist")
        proc = host.start()
        try:
            wait_for(lambda: linkerd_count(host.net_dir / "20-calico.conflist") == 1, "patch")
            assert sorted(os.listdir(host.net_dir)) == [
                "10-calico.conflist",
                "20-calico.conflist",
                host.kubeconfig.name,
            ]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)

    @pytest.mark.parametrize("then", ["--uninstall", "--once"])
    def test_an_older_cniboxs_state_dir_is_taken_over_losing_nothing(
        self, then: str, tmp_path: Path
    ) -> None:
        """A node an older cnibox installed (its state in `<net dir>/.cnibox-install-cni`,
        a `.conf` converted, so its original exists only in that journal): the new installer
        moves the journal to the bin dir and its undo still restores the node exactly."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conf", "10-calico.conf")
        put_config(host, "20-calico.conflist")
        before = snapshot(host.prefix)
        legacy = host.net_dir / ".cnibox-install-cni"
        assert host.run("--once", CNIBOX_STATE_DIR=str(legacy)).returncode == 0
        assert record_file(legacy / "patched", "10-calico.conf").is_file()
        proc = host.run(then)
        assert proc.returncode == 0, proc.stderr
        assert not legacy.exists()
        if then == "--once":
            assert "took over the undo journal of an earlier cnibox" in proc.stderr
            records = host.bin_dir / ".cnibox-install-cni" / "patched"
            assert record_file(records, "10-calico.conf").is_file()
            proc = host.run("--uninstall")
            assert proc.returncode == 0, proc.stderr
        assert snapshot(host.prefix) == before


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


class TestReadiness:
    """Issue 27 item 7: install-cni's readiness (`--ready`, the chart's probe) and its admin
    server (/healthz, /readyz, /metrics on loopback; issue 25's gate metrics go there)."""

    def test_ready_exits_1_until_installed_and_chained(self, tmp_path: Path) -> None:
        host = make_host(tmp_path)
        proc = host.run("--ready")
        assert proc.returncode == 1
        assert "not ready: PluginInstalled:" in proc.stderr
        assert host.run("--once").returncode == 0
        proc = host.run("--ready")
        assert proc.returncode == 1  # linkerd-cni is there, but no CNI config chains it yet
        assert "not ready: ChainConfigured: no CNI config in" in proc.stderr
        put_config(host, "10-calico.conflist")
        assert host.run("--once").returncode == 0
        proc = host.run("--ready")
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""

    def test_the_admin_server_follows_the_install(self, tmp_path: Path) -> None:
        host = make_host(tmp_path)
        port = _free_port()
        proc = host.start("--admin-addr", f"127.0.0.1:{port}")
        try:
            wait_for(lambda: _reachable(port), "the admin server")
            assert _get(port, "/healthz") == (200, "ok\n")
            assert _get(port, "/readyz") == (500, "not ready\n")  # no CNI config yet
            status, text = _get(port, "/metrics")
            assert status == 200
            assert "cnibox_install_cni_installed 0\n" in text
            assert "cnibox_node_gate_" not in text  # the gate is off
            put_config(host, "10-calico.conflist")
            wait_for(lambda: _get(port, "/readyz")[0] == 200, "ready")
            assert "cnibox_install_cni_installed 1\n" in _get(port, "/metrics")[1]
            assert _get(port, "/nothing")[0] == 404
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert f"admin server on 127.0.0.1:{port}" in err
        assert not _reachable(port)

    def test_a_bad_admin_address_is_a_usage_error_changing_nothing(self, tmp_path: Path) -> None:
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        before = snapshot(host.prefix)
        proc = host.run("--admin-addr", "localhost:99999")
        assert proc.returncode == 2
        assert "invalid socket address syntax" in proc.stderr
        assert snapshot(host.prefix) == before


def _reachable(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class TestFailures:
    def test_no_network_config_is_fatal(self, tmp_path: Path) -> None:
        """Without CNI_NETWORK_CONFIG or its file the installer exits 1 with upstream's words."""
        host = make_host(tmp_path)
        proc = host.run("--once", CNI_NETWORK_CONFIG="")
        assert proc.returncode == 1
        assert "cannot build configuration from any known source" in proc.stderr

    def test_network_config_from_file(self, tmp_path: Path) -> None:
        """CNI_NETWORK_CONFIG_FILE is read when the variable is empty."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        conf = tmp_path / "net.json"
        conf.write_bytes((TESTDATA / "cni-src.json").read_bytes())
        proc = host.run("--once", CNI_NETWORK_CONFIG="", CNI_NETWORK_CONFIG_FILE=str(conf))
        assert proc.returncode == 0, proc.stderr
        assert sha(host.net_dir / "10-calico.conflist") == HASHES["10-calico.conflist"]["sha256"]

    def test_missing_token_is_fatal(self, tmp_path: Path) -> None:
        """No service-account token: exit 1, naming the file."""
        host = make_host(tmp_path)
        proc = host.run("--once", SERVICE_ACCOUNT_DIR=str(tmp_path / "nowhere"))
        assert proc.returncode == 1
        assert "nowhere/token: no such file or directory" in proc.stderr

    @pytest.mark.parametrize("mode", [("--once",), ()])
    @pytest.mark.parametrize("missing", ["net_dir", "bin_dir"])
    def test_a_missing_host_dir_is_fatal_as_upstream(
        self, mode: tuple[str, ...], missing: str, tmp_path: Path
    ) -> None:
        """Issue 27 item 9: a missing DEST_CNI_NET_DIR (or bin dir) ends the installer with
        upstream's Go installer's last line and exit 1 (`log.Fatal("cannot run cni install")`
        with the os.Stat error), and nothing is created: no net dir, no state, no binary."""
        host = make_host(tmp_path)
        gone = getattr(host, missing)
        gone.rmdir()
        before = snapshot(host.prefix)
        proc = host.run(*mode)
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert 'level=fatal msg="cannot run cni install" ' in last
        assert last.endswith(f'error="stat {gone}: no such file or directory"')
        assert snapshot(host.prefix) == before

    def test_bad_argument_is_usage_error(self, tmp_path: Path) -> None:
        """Unknown arguments exit 2."""
        host = make_host(tmp_path)
        assert host.run("--bogus").returncode == 2
        assert host.run("--once", "--uninstall").returncode == 2


class TestUndo:
    def test_uninstall_removes_everything_it_installs(self, tmp_path: Path) -> None:
        """--uninstall (preStop hook) after --once: the original bytes back (from the undo
        journal), no kubeconfig, no binary, no link, no state left behind."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        before = snapshot(host.prefix)
        assert host.run("--once", "--link-nsenter").returncode == 0
        proc = host.run("--uninstall")
        assert proc.returncode == 0, proc.stderr
        assert snapshot(host.prefix) == before

    def test_uninstall_without_a_journal_removes_linkerd_as_go_does(self, tmp_path: Path) -> None:
        """With no journal (never installed by this cnibox), each linkerd entry is removed and
        the file re-serialised the way upstream's Go installer does."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        assert host.run("--once", "--link-nsenter").returncode == 0
        shutil.rmtree(host.bin_dir / ".cnibox-install-cni")
        proc = host.run("--uninstall")
        assert proc.returncode == 0, proc.stderr
        assert sorted(p.name for p in host.bin_dir.iterdir()) == []
        assert not host.kubeconfig.exists()
        after = HASHES["10-calico.conflist"]["after_remove_sha256"]
        assert sha(host.net_dir / "10-calico.conflist") == after

    def test_sigterm_leaves_the_host_exactly_as_before(self, tmp_path: Path) -> None:
        """A watching installer undoes on SIGTERM: same names, bytes and modes as before."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conf", "10-calico.conf")
        put_config(host, "20-calico.conflist")
        (host.net_dir / "20-calico.conflist").chmod(0o640)
        before = snapshot(host.prefix)
        proc = host.start()
        wait_for(lambda: linkerd_count(host.net_dir / "20-calico.conflist") == 1, "patching")
        wait_for((host.net_dir / "10-calico.conflist").exists, "the .conf upgrade")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert snapshot(host.prefix) == before

    def test_repeated_signals_do_not_cut_the_undo_short(self, tmp_path: Path) -> None:
        """SIGTERM, SIGTERM, SIGINT in a burst: one complete undo, exit 0, host as before."""
        host = make_host(tmp_path)
        for n in range(5):
            put_config(host, f"{n}0-calico.conflist")
        before = snapshot(host.prefix)
        proc = host.start()
        wait_for(lambda: linkerd_count(host.net_dir / "40-calico.conflist") == 1, "patching")
        for signum in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT):
            proc.send_signal(signum)
            time.sleep(0.005)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert snapshot(host.prefix) == before

    def test_a_signal_after_the_undo_cannot_kill_the_exiting_installer(self) -> None:
        """The burst above raced: the undo finished within the 5 ms between two signals, the
        handlers went back to SIG_DFL, and the next SIGTERM killed the process (-15) after a
        complete undo. A run a signal ended leaves further SIGTERM/SIGINT ignored."""
        from multicall.installer.watch import Stop

        saved = {n: signal.getsignal(n) for n in (signal.SIGTERM, signal.SIGINT)}
        try:
            stop = Stop()
            stop.install()
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.signum == signal.SIGTERM
            stop.restore()
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: the test process lives on

            quiet = Stop()  # a run no signal ended gives the previous handlers back
            quiet.install()
            quiet.restore()
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        finally:
            for signum, handler in saved.items():
                signal.signal(signum, handler)

    def test_uninstall_stops_the_running_installer_first(self, tmp_path: Path) -> None:
        """--uninstall signals the watcher via its pid file, so nothing re-patches afterwards."""
        host = make_host(tmp_path)
        put_config(host, "10-calico.conflist")
        before = snapshot(host.prefix)
        proc = host.start()
        wait_for(lambda: linkerd_count(host.net_dir / "10-calico.conflist") == 1, "patching")
        wait_for((tmp_path / "install-cni.pid").exists, "the pid file")
        done = host.run("--uninstall")
        assert done.returncode == 0, done.stderr
        assert "stopped the installer (pid " in done.stderr
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert snapshot(host.prefix) == before
        assert not (tmp_path / "install-cni.pid").exists()
