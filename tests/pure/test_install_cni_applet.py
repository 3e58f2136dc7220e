"""install-cni's pieces in-process: arguments, own-write detection, pid file, inotify parsing."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from multicall.applets import find_applet, install_cni
from multicall.core.installer.config import parse_environment
from multicall.core.installer.journal import Record
from multicall.dispatch import run_applet
from multicall.effects import inotify, pidfile
from multicall.effects.log import Logger
from multicall.errors import ConfigError, UsageError
from multicall.installer.install import Installer, Options
from multicall.installer.state import sha256
from tests.support.installer_host import TESTDATA, Host, make_host, put_config
from tests.support.waiting import wait_for


def installer_for(root: Path) -> tuple[Installer, io.BytesIO, Host]:
    host = make_host(root)
    log = io.BytesIO()
    config = parse_environment(host.env())
    inst = Installer(config, Options(), Logger(log, "debug"), str(host.binary))
    inst.load_network_config()
    return inst, log, host


class TestArguments:
    def test_modes_and_flags(self) -> None:
        """--once / --uninstall / --link-nsenter / -v / --log-* parse into Options."""
        assert install_cni.parse_args([]) == Options()
        opts = install_cni.parse_args(["--uninstall", "--link-nsenter", "-v"])
        assert (opts.mode, opts.link_nsenter, opts.log_level) == ("uninstall", True, "debug")
        opts = install_cni.parse_args(["--log-level=WARN", "--log-format", "json"])
        assert (opts.log_level, opts.log_format) == ("warning", "json")

    @pytest.mark.parametrize(
        "args",
        [
            ["--once", "--uninstall"],
            ["-x"],
            ["extra"],
            ["--log-level", "loud"],
            ["--log-format", "xml"],
        ],
    )
    def test_bad_arguments(self, args: list[str]) -> None:
        """Conflicting modes and unknown words are usage errors."""
        with pytest.raises(UsageError):
            install_cni.parse_args(args)

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--log-level", "loud"], "invalid --log-level 'loud': debug, info, warn or error"),
            (["--log-format", "xml"], "invalid --log-format 'xml': plain or json"),
        ],
    )
    def test_bad_log_options_name_the_option(self, args: list[str], message: str) -> None:
        """The checks shared with the node agent (core/logs.parse_log_options), word for word."""
        with pytest.raises(UsageError) as raised:
            install_cni.parse_args(args)
        assert raised.value.message == message

    def test_help_goes_to_stdout(self) -> None:
        """--help prints the usage text and exits 0."""
        out = io.BytesIO()
        applet = find_applet("install-cni")
        assert applet is not None
        assert run_applet(applet, ["install-cni", "--help"], {}, (io.BytesIO(), out, out)) == 0
        assert out.getvalue().startswith(b"usage: install-cni ")


class TestPatch:
    def test_file_hash_exists_skips(self, tmp_path: Path) -> None:
        """Upstream FileHashExists: a file whose hash was recorded is not touched."""
        inst, log, host = installer_for(tmp_path)
        path = put_config(host, "10-calico.conflist")
        inst.state.records[str(path)] = Record(str(path), None, 0o644, sha256(path.read_bytes()))
        inst.patch(path.name)
        assert path.read_bytes() == (TESTDATA / "10-calico.conflist").read_bytes()
        assert b"our own write, ignored" in log.getvalue()

    def test_missing_file_is_ignored(self, tmp_path: Path) -> None:
        """Upstream NoSuchConfigFilename: no error, nothing written."""
        inst, _, host = installer_for(tmp_path)
        inst.patch("10-calico-no-such-file.conflist")
        assert not (host.net_dir / "10-calico-no-such-file.conflist").exists()

    def test_symlinked_config_is_left_alone(self, tmp_path: Path) -> None:
        """A config that is a symlink is not replaced by a regular file."""
        inst, log, host = installer_for(tmp_path)
        real = tmp_path / "real.conflist"
        real.write_bytes((TESTDATA / "10-calico.conflist").read_bytes())
        link = host.net_dir / "10-link.conflist"
        link.symlink_to(real)
        inst.patch(link.name)
        assert link.is_symlink()
        assert real.read_bytes() == (TESTDATA / "10-calico.conflist").read_bytes()
        assert b"a symlink, left alone" in log.getvalue()

    def test_own_temp_names_are_not_configs(self, tmp_path: Path) -> None:
        """The installer's temp files never count as CNI configs."""
        inst, _, _ = installer_for(tmp_path)
        assert not inst.wanted(".10-calico.conflist.0a1b2c3d.cnibox-tmp")
        assert inst.wanted("10-calico.conflist")


class TestPidFile:
    def test_stale_pid_file_names_no_process(self, tmp_path: Path) -> None:
        """A pid file of a dead process, a live pid whose start time, executable or command
        line differ, or garbage, names no running installer."""
        pid_file = tmp_path / "pid"
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            wait_for(lambda: pidfile.identity(child.pid) is not None, "the child")
            alive = pidfile.identity(child.pid)
            assert alive is not None
        finally:
            child.kill()
            child.wait()
        parent = pidfile.identity(os.getppid())
        assert parent is not None
        for stale in (
            alive,  # dead now
            dataclasses.replace(parent, start="1"),
            dataclasses.replace(parent, exe="/usr/bin/other"),
            dataclasses.replace(parent, cmdline="0" * 64),
        ):
            pid_file.write_text(json.dumps(dataclasses.asdict(stale)))
            assert pidfile.running(str(pid_file)) is None
        pid_file.write_text("garbage")
        assert pidfile.running(str(pid_file)) is None

    def test_live_process_is_found(self, tmp_path: Path) -> None:
        """The pid file written by a running process names it."""
        pid_file = tmp_path / "pid"
        code = (
            "import time\nfrom multicall.effects import pidfile\n"
            f"pidfile.write({str(pid_file)!r})\ntime.sleep(30)\n"
        )
        child = subprocess.Popen([sys.executable, "-c", code])
        try:
            wait_for(pid_file.exists, "the pid file")
            found = pidfile.running(str(pid_file))
            assert found is not None
            assert found.pid == child.pid
            assert pid_file.stat().st_mode & 0o777 == 0o600
        finally:
            child.kill()
            child.wait()

    def test_a_pid_that_is_not_the_installer_is_never_signalled(self, tmp_path: Path) -> None:
        """A pid file naming another live process (here: the test's sleeping child, with the
        installer's identity otherwise) is not signalled."""
        pid_file = tmp_path / "pid"
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            wait_for(lambda: pidfile.identity(child.pid) is not None, "the child")
            me = pidfile.identity(os.getpid())
            assert me is not None
            forged = dataclasses.replace(me, pid=child.pid)
            pid_file.write_text(json.dumps(dataclasses.asdict(forged)))
            assert pidfile.stop(str(pid_file), 0.1) is None
            assert child.poll() is None
        finally:
            child.kill()
            child.wait()

    def test_pid_file_in_a_shared_directory_is_refused(self, tmp_path: Path) -> None:
        """A directory others may write to (like /tmp) is no place for the pid file."""
        shared = tmp_path / "shared"
        shared.mkdir()
        shared.chmod(0o1777)
        with pytest.raises(ConfigError, match="others may write to it"):
            pidfile.write(str(shared / "pid"))
        (shared / "pid").write_text(json.dumps({"pid": os.getppid()}))
        with pytest.raises(ConfigError, match="others may write to it"):
            pidfile.stop(str(shared / "pid"), 0.1)


class TestInotify:
    def test_parse_events(self) -> None:
        """read(2) buffers split into events; names lose their NUL padding."""

        def raw(wd: int, mask: int, name: bytes) -> bytes:
            padded = name + b"\0" * (16 - len(name))
            return struct.pack("iIII", wd, mask, 0, len(padded)) + padded

        events = inotify.parse_events(
            raw(1, inotify.IN_MOVED_TO, b"..data") + raw(2, inotify.IN_MODIFY, b"a.conflist")
        )
        assert [(e.wd, e.mask, e.name) for e in events] == [
            (1, inotify.IN_MOVED_TO, "..data"),
            (2, inotify.IN_MODIFY, "a.conflist"),
        ]

    def test_real_events_from_a_directory(self, tmp_path: Path) -> None:
        """The ctypes binding reports a create and a rename in a watched directory."""
        with inotify.Inotify() as ino:
            ino.add_watch(str(tmp_path), inotify.IN_CREATE | inotify.IN_MOVED_TO)
            assert ino.read_events() == []
            (tmp_path / "a").write_text("x")
            os.rename(tmp_path / "a", tmp_path / "b")
            names = [
                (e.name, e.mask & (inotify.IN_CREATE | inotify.IN_MOVED_TO))
                for e in ino.read_events()
            ]
        assert names == [("a", inotify.IN_CREATE), ("b", inotify.IN_MOVED_TO)]

    def test_watch_on_a_missing_directory_fails(self, tmp_path: Path) -> None:
        """add_watch raises OSError with the path."""
        with inotify.Inotify() as ino, pytest.raises(OSError, match="nowhere"):
            ino.add_watch(str(tmp_path / "nowhere"), inotify.IN_CREATE)
