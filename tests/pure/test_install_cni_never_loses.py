"""Issue 30 (items 1-6): the installer never loses a file, whatever the config dir holds."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from multicall.applets import install_cni
from multicall.core.installer.journal import RECORD_LIMIT
from multicall.effects import fs
from multicall.installer import lock
from tests.support.installer_host import (
    TESTDATA,
    Host,
    linkerd_count,
    make_host,
    put_config,
    record_file,
)
from tests.support.waiting import wait_for

STATE = ".cnibox-install-cni"
CONF = (TESTDATA / "10-calico.conf").read_bytes()
CONFLIST = (TESTDATA / "10-calico.conflist").read_bytes()


def run(host: Host, *args: str, **extra: str) -> tuple[int, str]:
    """The applet in-process (no interpreter start per run: the big cases stay fast)."""
    err = io.BytesIO()
    code = install_cni.main(["install-cni", *args], host.env(**extra), io.BytesIO(), err, err)
    return code, err.getvalue().decode()


def configs(host: Host) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in host.net_dir.iterdir() if p.is_file()}


def test_a_conf_beside_its_conflist_name_is_left_alone(tmp_path: Path) -> None:
    """Item 1: `10-a.conf` is not converted over an existing `10-a.conflist`; both survive
    install and uninstall byte for byte, and the log says why."""
    host = make_host(tmp_path)
    (host.net_dir / "10-a.conf").write_bytes(CONF)
    (host.net_dir / "10-a.conflist").write_bytes(CONFLIST)
    code, err = run(host, "--once")
    assert code == 0, err
    assert (host.net_dir / "10-a.conf").read_bytes() == CONF
    assert linkerd_count(host.net_dir / "10-a.conflist") == 1
    assert "10-a.conf: left alone: converting it would replace" in err
    code, err = run(host, "--uninstall")
    assert code == 0, err
    assert configs(host) == {"10-a.conf": CONF, "10-a.conflist": CONFLIST}


def test_a_conf_written_again_after_its_conversion_is_kept(tmp_path: Path) -> None:
    """The primary CNI writes `x.conf` again after cnibox converted it: the undo keeps the
    new `x.conf` (never the journal's older bytes over it) and removes cnibox's `.conflist`."""
    host = make_host(tmp_path)
    (host.net_dir / "10-a.conf").write_bytes(CONF)
    assert run(host, "--once")[0] == 0
    newer = CONF.replace(b'"mtu": 0', b'"mtu": 1400')
    (host.net_dir / "10-a.conf").write_bytes(newer)
    code, err = run(host, "--uninstall")
    assert code == 0, err
    assert configs(host) == {"10-a.conf": newer}


def test_records_already_undone_are_passed_over_quietly(tmp_path: Path) -> None:
    """A group file kept after a partial undo (it goes only when all its records are
    undone) still names configs an earlier undo restored: a later undo leaves them as they
    are without saying the primary CNI wrote them again. (Modelled by putting the group and
    undo.json back after a complete undo: the same state for those records.)"""
    host = make_host(tmp_path)
    for name in ("10-a.conf", "20-b.conf"):
        (host.net_dir / name).write_bytes(CONF)
    assert run(host, "--once")[0] == 0
    state = host.bin_dir / STATE
    kept = {p.relative_to(state): p.read_bytes() for p in state.rglob("*") if p.is_file()}
    assert any(p.name.startswith("group-") for p in kept)
    code, err = run(host, "--uninstall")
    assert code == 0, err
    restored = configs(host)
    assert restored == {"10-a.conf": CONF, "20-b.conf": CONF}
    for relative, data in kept.items():
        (state / relative).parent.mkdir(parents=True, exist_ok=True)
        (state / relative).write_bytes(data)
    code, err = run(host, "--uninstall")
    assert code == 0, err
    assert "written again" not in err
    assert configs(host) == restored


@pytest.mark.parametrize("name", ["10-calico.conflist", "00-x.conf", "k.json"])
def test_a_kubeconfig_name_libcni_would_load_is_refused(tmp_path: Path, name: str) -> None:
    """Item 2: KUBECONFIG_FILE_NAME naming a network config is refused before anything is
    written, in every mode; the primary CNI's config survives both."""
    host = make_host(tmp_path)
    put_config(host, "10-calico.conflist")
    before = configs(host)
    for mode in ("--once", "--uninstall"):
        code, err = run(host, mode, KUBECONFIG_FILE_NAME=name)
        assert code == 1
        assert f"KUBECONFIG_FILE_NAME={name!r}: a kubeconfig may not end in" in err
        assert "Traceback" not in err
        assert configs(host) == before
        assert list(host.bin_dir.iterdir()) == []


def test_a_kubeconfig_name_taken_by_another_file_is_refused(tmp_path: Path) -> None:
    """Item 2: a kubeconfig name held by a file that is not linkerd's (Calico's own
    kubeconfig) is neither overwritten nor removed."""
    host = make_host(tmp_path)
    calico = host.net_dir / "calico-kubeconfig"
    calico.write_bytes(b"apiVersion: v1\nkind: Config\n# calico's\n")
    code, err = run(host, "--once", KUBECONFIG_FILE_NAME="calico-kubeconfig")
    assert code == 1
    assert "exists and is not a linkerd-cni kubeconfig" in err
    assert list(host.bin_dir.iterdir()) == []
    code, err = run(host, "--uninstall", KUBECONFIG_FILE_NAME="calico-kubeconfig")
    assert code == 0, err
    assert calico.read_bytes() == b"apiVersion: v1\nkind: Config\n# calico's\n"


def big_conf(size: int, i: int) -> bytes:
    doc = json.loads(CONF)
    doc["padding"] = f"{i:06d}" + "x" * (size - len(CONF) - 32)
    return json.dumps(doc, indent=2).encode()


def test_a_large_journal_is_bounded_per_record_and_fully_undone(tmp_path: Path) -> None:
    """Item 3: 20 `.conf` files of 900 KB (a 24 MB journal as one document) are journaled
    one conversion per record file (a group never exceeds the read limit), and all restored
    by --uninstall."""
    host = make_host(tmp_path)
    originals = {f"{i:02d}-big.conf": big_conf(900_000, i) for i in range(20)}
    for name, data in originals.items():
        (host.net_dir / name).write_bytes(data)
    code, err = run(host, "--once")
    assert code == 0, err
    records = list((host.bin_dir / STATE / "patched").iterdir())
    assert len(records) == 20  # two 1.2 MB records never share a group
    assert max(r.stat().st_size for r in records) < RECORD_LIMIT
    code, err = run(host, "--uninstall")
    assert code == 0, err
    assert configs(host) == originals
    assert not (host.bin_dir / STATE).exists()


def version2_record(path: str, original: bytes | None, mode: int, written: str) -> bytes:
    """A record as cnibox before record groups wrote it (its `encode_record`, spelled out
    here so a change to the current encoder cannot hide a format change)."""
    encoded = None if original is None else base64.b64encode(original).decode("ascii")
    doc = {"version": 2, "path": path, "original": encoded, "mode": mode, "written": written}
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


@pytest.mark.parametrize("then", ["--uninstall", "--once"])
def test_an_upgraded_installer_undoes_version2_per_name_records(tmp_path: Path, then: str) -> None:
    """A node an earlier cnibox installed, its journal one version 2 record per config name
    (a `.conf` converted: its original only in the journal): the new code's --uninstall
    restores every file byte for byte and name for name; after a new --once (a config the
    primary CNI rewrote since: its record replaced by a group) too; nothing is left."""
    host = make_host(tmp_path)
    (host.net_dir / "10-a.conf").write_bytes(CONF)
    (host.net_dir / "20-b.conflist").write_bytes(CONFLIST)
    before = configs(host)
    assert run(host, "--once")[0] == 0
    records = host.bin_dir / STATE / "patched"
    for group in list(records.iterdir()):
        for item in json.loads(group.read_bytes())["records"]:
            original = item["original"]
            old = version2_record(
                item["path"],
                None if original is None else base64.b64decode(original),
                item["mode"],
                item["written"],
            )
            (records / item["path"].rsplit("/", 1)[-1]).write_bytes(old)
        group.unlink()
    assert sorted(p.name for p in records.iterdir()) == [
        "10-a.conf",
        "10-a.conflist",
        "20-b.conflist",
    ]
    if then == "--once":
        (host.net_dir / "20-b.conflist").write_bytes(CONFLIST)  # the primary CNI rewrites it
        before["20-b.conflist"] = CONFLIST
        code, err = run(host, "--once")
        assert code == 0, err
        assert linkerd_count(host.net_dir / "20-b.conflist") == 1
        assert not (records / "20-b.conflist").exists()  # superseded by its group
    code, err = run(host, "--uninstall")
    assert code == 0, err
    assert configs(host) == before
    assert not (host.bin_dir / STATE).exists()


def test_an_unreadable_record_fails_install_and_uninstall_clearly(tmp_path: Path) -> None:
    """Item 3: a record that cannot be read is never ignored: --once refuses before any
    change, --uninstall undoes the rest and exits 1 saying what to do; the record stays."""
    host = make_host(tmp_path)
    (host.net_dir / "10-a.conf").write_bytes(CONF)
    put_config(host, "20-b.conflist")
    assert run(host, "--once")[0] == 0
    record = record_file(host.bin_dir / STATE / "patched", "10-a.conf")
    record.write_bytes(b"x" * (RECORD_LIMIT + 1))
    (host.net_dir / "20-b.conflist").write_bytes(CONFLIST)  # the primary CNI rewrites it
    code, err = run(host, "--once")
    assert code == 1
    assert "the undo journal cannot be read" in err
    assert (host.net_dir / "20-b.conflist").read_bytes() == CONFLIST  # not re-patched
    code, err = run(host, "--uninstall")
    assert code == 1
    assert f"{record.name}: the undo record is larger than" in err
    assert "restore it by hand" in err
    assert "Traceback" not in err
    assert record.exists()
    assert linkerd_count(host.net_dir / "10-a.conflist") == 0


def test_a_second_installer_waits_bounded_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 4: while another installer holds the host's lock, a second one waits (bounded)
    and exits 1 naming the lock, having changed nothing."""
    host = make_host(tmp_path)
    put_config(host, "10-calico.conflist")
    monkeypatch.setattr(lock, "WAIT_SECONDS", 0.5)
    state = host.bin_dir / STATE
    state.mkdir(mode=0o700)
    holder = os.open(state / lock.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    import fcntl

    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        code, err = run(host, "--once")
        took = time.monotonic() - started
    finally:
        os.close(holder)
    assert code == 1
    assert "another install-cni holds" in err
    assert "stopped waiting after 0.5s" in err
    assert 0.4 < took < 10
    assert configs(host) == {"10-calico.conflist": CONFLIST}
    assert [p.name for p in host.bin_dir.iterdir()] == [STATE]  # the holder's, as it made it
    assert os.listdir(state) == [lock.LOCK_NAME]
    code, err = run(host, "--once")  # the holder is gone: its lock went with it
    assert code == 0, err


def test_two_installers_at_once_leave_every_file_as_it_was(tmp_path: Path) -> None:
    """Item 4: two `--once` installers started together over 72 configs (a rollout
    overlap), then `--uninstall`: every config is back, byte for byte."""
    host = make_host(tmp_path)
    for i in range(36):
        (host.net_dir / f"{i:02d}-a.conf").write_bytes(CONF)
        (host.net_dir / f"{i:02d}-b.conflist").write_bytes(CONFLIST)
    before = configs(host)
    procs = [host.start("--once") for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert all(linkerd_count(host.net_dir / f"{i:02d}-b.conflist") == 1 for i in range(36))
    undo = host.run("--uninstall")
    assert undo.returncode == 0, undo.stderr
    assert configs(host) == before


def test_an_empty_plugin_list_is_left_alone(tmp_path: Path) -> None:
    """Item 5: `"plugins": []` (invalid for libcni) is not made a linkerd-only list."""
    host = make_host(tmp_path)
    empty = b'{"cniVersion": "0.4.0", "name": "empty", "plugins": []}'
    (host.net_dir / "05-empty.conflist").write_bytes(empty)
    code, err = run(host, "--once")
    assert code == 0, err
    assert (host.net_dir / "05-empty.conflist").read_bytes() == empty
    assert "05-empty.conflist: left alone: the plugin list holds no plugin besides" in err


def test_journal_writes_grow_linearly_with_the_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 6: the journal bytes written for N configs stay within a constant times the
    configs' own bytes (one record per config), not N times the whole journal."""
    host = make_host(tmp_path)
    count = 300
    for i in range(count):
        (host.net_dir / f"{i:04d}.conflist").write_bytes(CONFLIST)
    written = {"journal": 0}
    real = fs.write_atomic
    state = str(host.bin_dir / STATE)

    def counting(path: str, data: bytes, mode: int = 0o644) -> None:
        if path.startswith(state):
            written["journal"] += len(data)
        real(path, data, mode)

    monkeypatch.setattr(fs, "write_atomic", counting)
    code, err = run(host, "--once")
    assert code == 0, err
    assert written["journal"] <= 3 * count * len(CONFLIST)


def test_install_flushes_per_batch_not_per_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 6: installing 1,000 configs flushes to disk a bounded number of times (three
    syncfs per batch and the fsyncs of the binary, kubeconfig and undo.json), not twice per
    config; every config is patched and uninstall restores each one. (The time is a bench
    row: bench/installer.py, docs/benchmarks.md.)"""
    host = make_host(tmp_path)
    for i in range(1000):
        (host.net_dir / f"{i:04d}.conf").write_bytes(CONF)
    before = configs(host)
    flushes = {"fsync": 0, "syncfs": 0}
    real_fsync, real_syncfs = os.fsync, fs.sync_filesystem

    def fsync(fd: int) -> None:
        flushes["fsync"] += 1
        real_fsync(fd)

    def syncfs(directory: str) -> None:
        flushes["syncfs"] += 1
        real_syncfs(directory)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(fs, "sync_filesystem", syncfs)
    code, err = run(host, "--once")
    assert code == 0, err
    assert err.count("patched ") == 1000
    assert all(linkerd_count(host.net_dir / f"{i:04d}.conflist") == 1 for i in range(1000))
    assert flushes["fsync"] <= 20
    assert 1 <= flushes["syncfs"] <= 3
    # One file creation per config (its .conflist) and one per group of records, not
    # three per config: 1,000 records of 1 KB configs fit two groups of RECORD_LIMIT.
    assert len(list((host.bin_dir / STATE / "patched").iterdir())) <= 2
    monkeypatch.undo()
    code, err = run(host, "--uninstall")
    assert code == 0, err
    assert configs(host) == before


def test_two_watching_installers_overlapping_leave_every_file_as_it_was(tmp_path: Path) -> None:
    """Item 4, a DaemonSet rollout: the old pod's installer watches; the new one starts and
    waits on the host lock; the primary CNI writes a config meanwhile; the old one gets
    SIGTERM and undoes, the new one then installs (the new config too) and is stopped in
    turn. After both: every config has its original bytes and name, nothing else is left."""
    host = make_host(tmp_path)
    for i in range(10):
        (host.net_dir / f"{i:02d}-a.conf").write_bytes(CONF)
        (host.net_dir / f"{i:02d}-b.conflist").write_bytes(CONFLIST)
    before = {**configs(host), "50-new.conflist": CONFLIST}

    def chained() -> bool:
        names = [p for p in host.net_dir.iterdir() if p.name.endswith(".conflist")]
        return len(names) >= 20 and all(linkerd_count(p) == 1 for p in names)

    old = host.start()
    new = None
    try:
        wait_for(chained, "the old installer's patches", 60)
        new = host.start()
        lines: list[str] = []
        stream = new.stderr
        assert stream is not None
        reader = threading.Thread(target=lambda: lines.extend(stream), daemon=True)
        reader.start()
        wait_for(lambda: any("another install-cni holds" in x for x in lines), "the wait", 60)
        (host.net_dir / "50-new.conflist").write_bytes(CONFLIST)
        wait_for(lambda: linkerd_count(host.net_dir / "50-new.conflist") == 1, "a watch patch")
        old.send_signal(15)
        _, old_err = old.communicate(timeout=60)
        assert old.returncode == 0, old_err
        wait_for(lambda: chained() and (host.net_dir / "50-new.conflist").exists(), "new", 60)
        wait_for(lambda: linkerd_count(host.net_dir / "50-new.conflist") == 1, "new's patch")
        new.send_signal(15)
        new.wait(timeout=60)
        reader.join(timeout=10)
        new_err = "".join(lines)
        for pipe in (new.stdout, stream):
            if pipe is not None:
                pipe.close()
        assert new.returncode == 0, new_err
    finally:
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert "Traceback" not in old_err + new_err
    assert configs(host) == before
    assert list(host.bin_dir.iterdir()) == []
    assert not (host.net_dir / STATE).exists()


@pytest.mark.slow
def test_sigkill_across_group_boundaries_loses_nothing(tmp_path: Path) -> None:
    """Installers killed (SIGKILL) at random moments of a run whose records span several
    group files (configs of 500 KB: about two conversions' records per group, with small
    ones between): every later --uninstall puts back each name and byte, and leaves no
    journal. The kill tests above use configs small enough to share one group."""
    host = make_host(tmp_path)
    originals = {f"{i:02d}-big.conf": big_conf(500_000, i) for i in range(4)}
    originals.update({f"{i:02d}-small.conf": CONF for i in range(4, 10)})
    originals["50-list.conflist"] = CONFLIST
    rng = random.Random(30)
    groups_seen = 0
    for _ in range(25):
        for name, data in originals.items():
            (host.net_dir / name).write_bytes(data)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns
            try:
                out = open(os.devnull, "wb")  # noqa: SIM115  # lives until os._exit
                install_cni.main(["install-cni", "--once"], host.env(), io.BytesIO(), out, out)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.0, 0.12))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        patched = host.bin_dir / STATE / "patched"
        if patched.is_dir():
            groups_seen = max(groups_seen, sum(1 for p in patched.iterdir()))
        code, err = run(host, "--uninstall")
        assert code == 0, err
        assert configs(host) == originals
        left = sorted(str(p.relative_to(host.bin_dir)) for p in host.bin_dir.rglob("*"))
        assert left == [], left
    assert groups_seen >= 2  # the kills did land while records spanned groups
