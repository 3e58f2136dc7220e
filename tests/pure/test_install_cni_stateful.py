"""The installer never loses a file: a hypothesis state machine over a CNI config dir.

The outside world (the primary CNI, an operator) writes, rewrites and deletes configs:
`.conf` and `.conflist` of clashing names, symlinks, invalid JSON, empty plugin lists.
Between its steps the installer runs `--once`, possibly killed before any one of its
writes or removals (a SIGKILL: no undo, nothing after that instant), and `--uninstall`.
Invariant after every `--uninstall`: the dir holds exactly what the outside world last put
there, every name with its bytes (or link), and nothing of the installer's.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from multicall.applets import install_cni
from multicall.effects import fs
from tests.support.installer_host import TESTDATA, Host, make_host

NAMES = ("10-a.conf", "10-a.conflist", "20-b.conf", "20-b.conflist", "30-c.conflist")
CONTENTS = (
    (TESTDATA / "10-calico.conf").read_bytes(),
    (TESTDATA / "10-calico.conflist").read_bytes(),
    json.dumps({"cniVersion": "0.4.0", "name": "n", "type": "bridge", "k": 1}).encode(),
    b'{"cniVersion": "0.4.0", "name": "empty", "plugins": []}',
    b'{"plugins": [',  # invalid JSON
    b"[1, 2]",  # not an object
)


# Every effect of fs.py the installer writes or removes with, the batch steps included: a
# kill may land before any one of them.
EFFECTS = (
    "write_atomic",
    "remove_durably",
    "symlink_atomic",
    "write_unsynced",
    "stage",
    "sync_filesystem",
    "commit_staged",
    "unlink_unsynced",
)


class Killed(BaseException):
    """The simulated SIGKILL: raised instead of the installer's next effect."""


def run(host: Host, *args: str) -> tuple[int, str]:
    err = io.BytesIO()
    code = install_cni.main(["install-cni", *args], host.env(), io.BytesIO(), err, err)
    return code, err.getvalue().decode()


class NeverLosesAFile(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="i30-"))
        self.host = make_host(self.root)
        self.expected: dict[str, tuple[str, bytes]] = {}  # name -> (kind, bytes or target)

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def on_disk(self) -> dict[str, tuple[str, bytes]]:
        out = {}
        for path in self.host.net_dir.iterdir():
            if path.is_symlink():
                out[path.name] = ("link", os.readlink(path).encode())
            elif path.is_file():
                out[path.name] = ("file", path.read_bytes())
            else:
                out[path.name] = ("dir", b"")
        return out

    def _clear(self, path: Path) -> None:
        if path.is_symlink() or path.is_file():
            path.unlink()

    @rule(name=st.sampled_from(NAMES), content=st.sampled_from(CONTENTS))
    def outside_writes(self, name: str, content: bytes) -> None:
        path = self.host.net_dir / name
        self._clear(path)
        path.write_bytes(content)
        self.expected[name] = ("file", content)

    @rule(name=st.sampled_from(NAMES))
    def outside_links(self, name: str) -> None:
        path = self.host.net_dir / name
        self._clear(path)
        target = str(self.root / "elsewhere.conflist")
        os.symlink(target, path)
        self.expected[name] = ("link", target.encode())

    @rule(name=st.sampled_from(NAMES))
    def outside_deletes(self, name: str) -> None:
        path = self.host.net_dir / name
        if os.path.lexists(path):  # only what it sees can the outside world delete
            self._clear(path)
            self.expected.pop(name, None)

    @rule(kill_at=st.none() | st.integers(0, 40))
    def install_once(self, kill_at: int | None) -> None:
        calls = {"n": 0}
        real = {f: getattr(fs, f) for f in EFFECTS}

        def effect(name: str):  # type: ignore[no-untyped-def]
            def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
                if kill_at is not None and calls["n"] == kill_at:
                    raise Killed
                calls["n"] += 1
                return real[name](*args, **kwargs)

            return wrapped

        mp = pytest.MonkeyPatch()
        try:
            for name in real:
                mp.setattr(fs, name, effect(name))
            try:
                code, err = run(self.host, "--once")
            except Killed:
                return
        finally:
            mp.undo()
        assert code == 0, err
        assert "Traceback" not in err

    @rule()
    def uninstall(self) -> None:
        code, err = run(self.host, "--uninstall")
        assert code == 0, err
        assert self.on_disk() == self.expected
        assert list(self.host.bin_dir.iterdir()) == []

    @invariant()
    def at_most_one_linkerd_entry(self) -> None:
        for name, (kind, data) in self.on_disk().items():
            if kind == "file" and b'"linkerd-cni"' in data:
                plugins = json.loads(data)["plugins"]
                assert sum(p.get("type") == "linkerd-cni" for p in plugins) <= 1, name


NeverLosesAFile.TestCase.settings = settings(
    max_examples=int(os.environ.get("I30_EXAMPLES", "60")),
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_installer_never_loses_a_file = NeverLosesAFile.TestCase
