"""The single file's launcher: extraction, the fast path, races, cleanup, errors, signals.

Each test gets its own empty extraction root through CNIBOX_CACHE (the only candidate when
set), so first-run behaviour is tested from a clean state every time.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from multicall.applets import APPLETS, all_names
from tests.support import require_root, require_tool
from tests.support.artifact import env_with_cache, read_trailer, started

pytestmark = pytest.mark.binary
TIMEOUT = 60


def run(argv: list[str], cache: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env=env_with_cache(cache, **extra),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_first_and_warm_run_list_every_applet(
    artifact: Path, cache: Path, content_hash: str
) -> None:
    first = run([str(artifact), "--list"], cache)
    assert (first.returncode, first.stderr) == (0, "")
    assert first.stdout.split() == all_names()
    unpacked = cache / content_hash
    assert (unpacked / ".ok").read_text() == content_hash
    inode = unpacked.stat().st_ino
    warm = run([str(artifact), "--list"], cache)
    assert warm.stdout == first.stdout
    assert unpacked.stat().st_ino == inode, "the warm run must not unpack again"
    assert [p.name for p in cache.iterdir()] == [content_hash]


def test_symlink_names_reach_the_dispatcher(artifact: Path, cache: Path, tmp_path: Path) -> None:
    links = tmp_path / "bin"
    links.mkdir()
    for name in [*all_names(), "cnibox", "no-such-applet"]:
        (links / name).symlink_to(artifact)
    unknown = run([str(links / "no-such-applet")], cache)
    assert unknown.returncode == 127
    assert unknown.stderr == "no-such-applet: applet not found\n"
    assert run([str(links / "cnibox"), "--list"], cache).stdout.split() == all_names()
    for applet in APPLETS:
        for name in applet.names:
            result = run([str(links / name), "--help"], cache)
            assert "applet not found" not in result.stderr, name
            assert (result.returncode, bool(result.stdout)) == (0, True), (name, result.stderr)


def test_argv0_is_passed_unchanged_by_exec(artifact: Path, cache: Path, tmp_path: Path) -> None:
    # exec -a: argv[0] differs from the file name; dispatch must see the caller's argv[0].
    result = subprocess.run(
        ["bash", "-c", f'exec -a /some/where/no-such-applet "{artifact}"'],
        env=env_with_cache(cache),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert (result.returncode, result.stderr) == (127, "no-such-applet: applet not found\n")


def test_exit_codes_pass_through(artifact: Path, cache: Path) -> None:
    assert run([str(artifact)], cache).returncode == 0  # the usage, from Python (BusyBox)
    assert run([str(artifact), "--version"], cache).returncode == 0
    assert run([str(artifact), "--no-such-option"], cache).returncode == 2
    # A non-deployment Nuitka build refuses any "-c X" / "-m X" in argv with its own exit 2.
    assert run([str(artifact), "nsenter", "sh", "-c", "exit 3"], cache).returncode == 3
    nsenter_m = run([str(artifact), "nsenter", "-m", "-t", "1", "-c", "x"], cache)
    assert "tried to call itself" not in nsenter_m.stderr


def test_inspect_is_imported_late_and_still_patched_for_compiled_code(
    artifact: Path, cache: Path
) -> None:
    """build/lazy_inspect.py: start-up no longer imports inspect (Nuitka did, ~5-10 ms), and
    importing it later still applies Nuitka's patch (stock getgeneratorstate fails on a
    compiled generator)."""
    version = run([str(artifact), "--version"], cache, PYTHONPROFILEIMPORTTIME="1")
    assert version.returncode == 0, version.stderr
    imported = {line.split("|")[-1].strip() for line in version.stderr.splitlines()}
    assert "dataclasses" in imported, "PYTHONPROFILEIMPORTTIME must list the imports"
    assert not imported & {"inspect", "ast", "dis", "tokenize"}, sorted(imported)
    done = run([str(artifact), "selftest", "inspect"], cache)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith("GEN_CREATED GEN_SUSPENDED GEN_CLOSED ("), done.stdout


def test_sigterm_reaches_the_python_handler_in_the_same_process(
    artifact: Path, cache: Path
) -> None:
    with started([str(artifact), "selftest", "signal"], env_with_cache(cache)) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == f"ready {proc.pid}\n", "the launcher must exec, not fork"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT) == 42


def test_sigint_maps_to_130(artifact: Path, cache: Path) -> None:
    with started([str(artifact), "selftest", "signal"], env_with_cache(cache)) as proc:
        assert proc.stdout is not None
        proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=TIMEOUT) == 130


def test_cnibox_exe_names_the_single_file(artifact: Path, cache: Path, tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    result = run([str(artifact), "--install", "-s", str(links)], cache)
    assert result.returncode == 0, result.stderr
    for name in all_names():
        assert os.readlink(links / name) == str(artifact)


@pytest.mark.slow
def test_concurrent_first_starts(artifact: Path, tmp_path: Path, content_hash: str) -> None:
    """16 simultaneous first starts from an empty cache, 5 rounds: no failure, one copy."""
    expected = "".join(f"{name}\n" for name in all_names())
    for round_ in range(5):
        cache = tmp_path / f"round{round_}"
        cache.mkdir()
        argv = [str(artifact), "--list"]
        with ThreadPoolExecutor(max_workers=16) as pool:
            results = list(pool.map(run, [argv] * 16, [cache] * 16))
        failures = [
            (r.returncode, r.stderr) for r in results if r.returncode or r.stdout != expected
        ]
        assert failures == [], f"round {round_}"
        assert sorted(p.name for p in cache.iterdir()) == [content_hash], "leftovers"
        shutil.rmtree(cache)


def fake_version(cache: Path, name: str) -> Path:
    old = cache / name
    old.mkdir()
    (old / ".ok").write_text(name)
    (old / "payload").write_text("old version")
    return old


def test_old_versions_are_removed_unless_in_use(artifact: Path, cache: Path) -> None:
    unused = fake_version(cache, "0123456789abcdef")
    in_use = fake_version(cache, "fedcba9876543210")
    stale_tmp = cache / ".tmp-0000000000000000-abcdef"
    stale_tmp.mkdir()
    hour_ago = time.time() - 3600
    os.utime(stale_tmp, (hour_ago, hour_ago))
    fresh_tmp = cache / ".tmp-1111111111111111-abcdef"
    fresh_tmp.mkdir()
    with open(in_use / ".ok") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # what a running old binary holds
        result = run([str(artifact), "--version"], cache)
    assert result.returncode == 0, result.stderr
    assert not unused.exists()
    assert not stale_tmp.exists()
    assert (in_use / ".ok").exists()
    assert fresh_tmp.exists(), "a temp dir younger than 10 minutes may be another first start"


def test_running_copy_is_never_removed(artifact: Path, cache: Path, content_hash: str) -> None:
    """A process of this version holds its directory against another version's cleanup."""
    with started([str(artifact), "selftest", "signal"], env_with_cache(cache)) as proc:
        assert proc.stdout is not None
        proc.stdout.readline()
        ok = cache / content_hash / ".ok"
        with open(ok) as probe, pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT) == 42


def corrupted_copy(artifact: Path, tmp_path: Path, how: str) -> Path:
    copy = tmp_path / f"cnibox-{how}"
    data = bytearray(artifact.read_bytes())
    offset, size, _raw, _hash = read_trailer(artifact)
    if how == "appended":
        data += b"x"
    elif how == "truncated":
        del data[offset + size // 2 : offset + size // 2 + 4096]
    elif how == "flipped":
        data[offset + size // 2] ^= 0xFF
    elif how == "trailer":
        data[-10] ^= 0xFF
    copy.write_bytes(bytes(data))
    copy.chmod(0o755)
    return copy


@pytest.mark.parametrize("how", ["appended", "truncated", "flipped", "trailer"])
def test_damaged_file_fails_with_127(artifact: Path, cache: Path, tmp_path: Path, how: str) -> None:
    result = run([str(corrupted_copy(artifact, tmp_path, how)), "--list"], cache)
    assert result.returncode == 127
    assert result.stderr.startswith("cnibox: "), result.stderr
    assert result.stdout == ""
    assert not any(p.name.endswith("ok") for p in cache.rglob(".ok")), "nothing marked complete"


def test_unusable_cache_is_a_clear_127(artifact: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run([str(artifact), "--list"], blocker / "cache")
    assert result.returncode == 127
    assert "no writable, exec-allowed directory" in result.stderr
    assert str(blocker / "cache") in result.stderr


OPEN_CALL = re.compile(
    r'^\d+\s+(?:open|openat|openat2|execve)\((?:AT_FDCWD, |\d+, )?"([^"]*)"', re.M
)


# Data files glibc and CPython read if present (locale aliases, the iconv module cache, the
# time zone) and do without in an empty root. Never a library: code comes from the bundle.
OPTIONAL_HOST_DATA = frozenset(
    {
        "/usr/share/locale/locale.alias",
        "/usr/lib/x86_64-linux-gnu/gconv/gconv-modules.cache",
        "/etc/localtime",
    }
)


def test_loads_nothing_from_the_host(artifact: Path, cache: Path, tmp_path: Path) -> None:
    """First and warm run on the host: no host library, locale or config file is used."""
    strace = require_tool("strace")
    allowed = (f"{cache}/", "/proc/self/")
    for run_ in ("first", "warm"):
        log = tmp_path / f"strace-{run_}.log"
        trace = ["-e", "trace=open,openat,openat2,execve", "-e", "status=successful"]
        result = run([strace, "-f", "-qq", *trace, "-o", str(log), str(artifact), "--list"], cache)
        assert result.returncode == 0, result.stderr
        paths = OPEN_CALL.findall(log.read_text())
        assert any(p.endswith("/libc.so.6") for p in paths), "strace saw no library loads"
        outside = {p for p in paths if not p.startswith(allowed)} - {str(cache), str(artifact)}
        assert sorted(outside - OPTIONAL_HOST_DATA) == [], run_


@pytest.mark.netns
def test_noexec_cache_is_refused_with_127(artifact: Path, tmp_path: Path) -> None:
    require_root()
    cache = tmp_path / "noexec"
    cache.mkdir()
    script = f"mount -t tmpfs -o noexec tmpfs '{cache}'\nexec '{artifact}' --list"
    result = run(["unshare", "-m", "--propagation", "private", "sh", "-ec", script], cache)
    assert result.returncode == 127
    assert f"{cache}: mounted noexec" in result.stderr


def test_killed_first_start_leaves_nothing_that_breaks_the_next(
    artifact: Path, cache: Path, content_hash: str
) -> None:
    """SIGKILL in the middle of unpacking: the next start unpacks again and works."""
    for delay in (0.02, 0.1, 0.2):
        shutil.rmtree(cache)
        cache.mkdir()
        with subprocess.Popen([str(artifact), "--list"], env=env_with_cache(cache)) as proc:
            time.sleep(delay)
            proc.kill()
        result = run([str(artifact), "--list"], cache)
        assert (result.returncode, result.stdout.split()) == (0, all_names()), delay
        assert (cache / content_hash / ".ok").is_file()


def test_unpack_only_unpacks_and_exits(artifact: Path, cache: Path, content_hash: str) -> None:
    """CNIBOX_UNPACK_ONLY=1 (install-cni's install-time unpack): the directory is printed,
    complete (.ok), and nothing else runs; a second call takes the fast path."""
    env = {**env_with_cache(cache), "CNIBOX_UNPACK_ONLY": "1"}
    first = subprocess.run(
        [str(artifact), "--list"], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert (first.returncode, first.stderr) == (0, "")
    assert first.stdout == f"{cache / content_hash}\n"
    assert (cache / content_hash / ".ok").read_text() == content_hash
    again = subprocess.run(
        [str(artifact)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert again.stdout == first.stdout


def test_install_cni_unpacks_for_the_node(
    artifact: Path, tmp_path: Path, content_hash: str
) -> None:
    """install-cni --once with CNIBOX_HOST_CACHE: the installed copy is unpacked into the
    node's launcher cache, so the first pod start after an install does not unpack."""
    from tests.support.installer_host import make_host, put_config

    host = make_host(tmp_path / "node")
    put_config(host, "10-calico.conflist")
    node_cache = tmp_path / "node-cache"
    env = host.env(CNIBOX_HOST_CACHE=str(node_cache), CNIBOX_CACHE=str(tmp_path / "own"))
    proc = subprocess.run(
        [str(artifact), "install-cni", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (node_cache / content_hash / ".ok").is_file()
    assert f"unpacked cnibox for the node into {node_cache / content_hash}" in proc.stderr
