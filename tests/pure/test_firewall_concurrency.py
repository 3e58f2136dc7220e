"""The firewall engine's conflict loop and the xtables lock, without root or a kernel table:
a backend double that conflicts on demand, and lock files in a temp dir.

(tests/netns/test_firewall_hardening.py proves the same against the kernel.) Cost: ~3 s.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from multicall.core.firewall.model import (
    Family,
    FirewallBackend,
    Mode,
    ProxyInitOptions,
    Snapshot,
    TableChange,
)
from multicall.core.firewall.proxy_init import apply_change, empty_table
from multicall.core.firewall.ruleset import Rule, Table
from multicall.effects.firewall import engine
from multicall.effects.firewall.locks import XT_LOCK_NAME, XtablesLock, xtables_lock
from multicall.errors import FirewallConflict, FirewallError
from tests.support.concurrency import flock_held, is_locked

V4 = Family.IPV4
OPTIONS = ProxyInitOptions(inbound_ports_to_ignore=("4191", "4190"))


@dataclass
class RacyBackend:
    """A table in memory whose `apply` refuses the first `conflicts` times, each time after
    someone else appended a rule to OUTPUT (so a stale plan would be visible)."""

    conflicts: int
    table: Table = field(default_factory=empty_table)
    version: int = 0
    snapshots: int = 0
    applied: list[TableChange] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "legacy"

    def dump(self, family: Family, table: str = "nat") -> Table:
        return self.table

    def snapshot(self, family: Family, table: str = "nat") -> Snapshot:
        self.snapshots += 1
        return Snapshot(self.table, self.version, frozenset(c.name for c in self.table.chains))

    def apply(self, family: Family, change: TableChange, base: Snapshot | None = None) -> None:
        if self.conflicts:
            self.conflicts -= 1
            other = TableChange("nat", (), (), (Rule("OUTPUT", ("-j", "RETURN")),))
            self.table, self.version = apply_change(self.table, other), self.version + 1
        assert base is not None
        if base.version != self.version:
            raise FirewallConflict("the table changed since it was read")
        self.table, self.version = apply_change(self.table, change), self.version + 1
        self.applied.append(change)

    def has_rules(self, family: Family) -> bool:
        return bool(self.table.rules)


def session(log: list[str], pauses: list[float] | None = None) -> engine._Session:
    sleep = (pauses if pauses is not None else []).append
    return engine._Session(
        Mode.LEGACY, OPTIONS, XtablesLock(), log.append, ExitStack(), sleep=sleep
    )


def test_backend_double_is_a_backend() -> None:
    backend: FirewallBackend = RacyBackend(0)
    assert backend.name == "legacy"


@pytest.mark.parametrize("conflicts", [1, 3, engine.ATTEMPTS - 1])
def test_conflicts_are_planned_again_from_a_fresh_snapshot(conflicts: int) -> None:
    """Each conflict re-reads and re-plans: the final table is one run's on the final table
    (the foreign rules kept, one jump each), after exactly `conflicts` extra snapshots."""
    backend, log = RacyBackend(conflicts), list[str]()
    run = session(log)
    run.apply(run.plan(V4, backend))
    assert backend.snapshots == conflicts + 1
    assert len(backend.applied) == 1
    assert backend.table.rules_of("OUTPUT")[:conflicts] == (Rule("OUTPUT", ("-j", "RETURN")),) * (
        conflicts
    )
    jumps = [r for r in backend.table.rules if r.spec[-2:] == ("-j", "PROXY_INIT_OUTPUT")]
    assert len(jumps) == 1
    assert [line for line in log if "planning again" in line] == [
        f"the table changed since it was read; planning again (attempt {n})"
        for n in range(2, conflicts + 2)
    ]


def test_endless_conflicts_fail_after_a_bounded_number_of_attempts() -> None:
    """A table that never holds still fails the ADD after ATTEMPTS tries, saying so, and the
    pauses between them add up to at most about a second."""
    pauses: list[float] = []
    backend = RacyBackend(10**6)
    run = session([], pauses)
    with pytest.raises(FirewallError, match=r"kept changing while being written \(8 attempts\)"):
        run.apply(run.plan(V4, backend))
    assert len(pauses) == engine.ATTEMPTS - 1
    assert sum(pauses) <= 1.0
    assert all(0 < p <= engine.PAUSE_MAX for p in pauses)


# ----------------------------------------------------------------------------- the lock


def test_lock_is_taken_and_released(tmp_path: Path) -> None:
    path = tmp_path / "xtables.lock"
    with xtables_lock(XtablesLock(str(path)), wait=False):
        assert is_locked(path)
        assert os.stat(path).st_mode & 0o777 == 0o600  # created as iptables creates it
    assert not is_locked(path)


def test_no_wait_fails_at_once_with_iptables_message(tmp_path: Path) -> None:
    path = tmp_path / "xtables.lock"
    with flock_held(path):
        start = time.monotonic()
        with pytest.raises(FirewallError) as err, xtables_lock(XtablesLock(str(path)), wait=False):
            pass
    assert time.monotonic() - start < 0.5
    assert err.value.message == (
        "Another app is currently holding the xtables lock. Perhaps you want to use the -w option?"
    )
    assert err.value.details == f"Can't lock {path}: Resource temporarily unavailable"


def test_wait_takes_the_lock_once_it_is_free(tmp_path: Path) -> None:
    path = tmp_path / "xtables.lock"
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with flock_held(path):
            held.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    threading.Timer(0.3, release.set).start()
    with xtables_lock(XtablesLock(str(path), wait_limit=5.0), wait=True):
        assert release.is_set()
    thread.join()


def test_lock_path_as_iptables_finds_it(tmp_path: Path) -> None:
    """$XTABLES_LOCKFILE when set and non-empty, else /run/xtables.lock; an explicit path wins."""
    assert XtablesLock(env={}).lock_path() == XT_LOCK_NAME
    assert XtablesLock(env={"XTABLES_LOCKFILE": ""}).lock_path() == XT_LOCK_NAME
    assert XtablesLock(env={"XTABLES_LOCKFILE": "/x/l"}).lock_path() == "/x/l"
    assert XtablesLock("/mine", env={"XTABLES_LOCKFILE": "/x/l"}).lock_path() == "/mine"


def test_missing_directory_means_nobody_can_hold_it(tmp_path: Path) -> None:
    """No such directory in this mount namespace: no program here can take the lock either,
    so it is skipped and said in the log (an empty root has no /run)."""
    logs: list[str] = []
    path = tmp_path / "no-run" / "xtables.lock"
    with xtables_lock(XtablesLock(str(path)), wait=False, log=logs.append):
        pass
    assert logs == [
        f"no {path.parent} in this mount namespace: nobody here can hold the xtables lock"
    ]
    assert not path.parent.exists()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_lock_path_that_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "odd.lock"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    start = time.monotonic()
    with (
        pytest.raises(FirewallError, match="lock file"),
        xtables_lock(XtablesLock(str(path)), wait=True),
    ):
        pass
    assert time.monotonic() - start < 0.5
