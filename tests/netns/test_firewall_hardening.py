"""Issue 12, classes 4 and 5: large rule sets and concurrent writers, in throwaway netns.

nft: an ADD with 10 000 ports is one batch and leaves what Debian's iptables-nft leaves when it
runs upstream's argv for the same list; replies the kernel drops (a tiny receive buffer) are
read back to the kernel's verdict; a change planned from a stale snapshot is refused and
planned again. legacy: 10 000 ports likewise (Debian's iptables-legacy as the oracle); 20
pairs of ADDs on one netns at the same instant; pairs while Debian's iptables-legacy-restore
-w or a plain flock holds the xtables lock; without the wait flag a held lock fails the ADD
at once, and every wait is bounded; EAGAIN at commit is a conflict, planned again.

Every lock here is a file of the test's own (XTABLES_LOCKFILE / XtablesLock(path=...)), never
the machine's /run/xtables.lock. Cost: about 40 s from source on the 2-core machine (most of
it the two 10 000-port oracles: ~675 iptables commands each).
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from multicall.core.firewall.model import Family, Mode, ProxyInitOptions, TableChange
from multicall.core.firewall.proxy_init import build_argv, expected_table, strip_counters
from multicall.core.firewall.ruleset import Rule
from multicall.effects.firewall import engine
from multicall.effects.firewall.legacy import IptcBackend
from multicall.effects.firewall.legacy import apply as legacy_apply
from multicall.effects.firewall.locks import XtablesLock
from multicall.effects.firewall.nft import NftBackend
from multicall.effects.ns import entered_netns
from multicall.errors import FirewallConflict, FirewallError
from tests.support import cnibox_argv, require_tool
from tests.support.concurrency import (
    AddOutcome,
    Forked,
    add_env,
    add_stdin,
    flock_held,
    iptables_restore_holding,
    release,
    seam_add,
    together,
)
from tests.support.kubeapi import KubeApi
from tests.support.nft import big_change
from tests.support.oracles import SAVE, save_text
from tests.support.pki import Pki
from tests.support.pods import MESHED
from tests.support.rig import Netns, Rig
from tests.support.scenarios import fixture_text

pytestmark = pytest.mark.netns

V4, V6 = Family.IPV4, Family.IPV6
PORTS = tuple(str(p) for p in range(10000, 20000))  # 10 000 ports: 667 multiport rules
CHART_INBOUND = ("4191", "4190")


@pytest.fixture
def lock_file(tmp_path: Path) -> Path:
    return tmp_path / "xtables.lock"


# ----------------------------------------------------------------------------- 10 000 ports


@pytest.fixture
def api_node(rig: Rig, tmp_path: Path, pki: Pki) -> Iterator[tuple[Netns, Path]]:
    """A node netns serving the meshed pod on a TLS API, and the kubeconfig for it."""
    node = rig.node()
    api = KubeApi(pki)
    api.add_pod(MESHED)
    api.start(node.path)
    try:
        yield node, api.kubeconfig(tmp_path / "kubeconfig")
    finally:
        api.stop()


def command_add(
    node: Netns, pod: Netns, kubeconfig: Path, linkerd: dict[str, Any], **env: str
) -> subprocess.CompletedProcess[bytes]:
    """`linkerd-cni` ADD as the runtime runs it (the built binary under CNIBOX=...; through
    the session's node agent under `make test-agent`)."""
    agent = os.environ.get("CNIBOX_AGENT_SOCKET", "")
    return subprocess.run(
        ["ip", "netns", "exec", node.name, *cnibox_argv("linkerd-cni")],
        input=add_stdin(linkerd, str(kubeconfig)),
        env={**add_env(pod.path), "PATH": os.environ.get("PATH", ""),
             "CNIBOX_AGENT_SOCKET": agent, **env},
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip


def upstream_run(ns: Netns, options: ProxyInitOptions, mode: Mode) -> None:
    """Upstream's argv for `options` (one iptables command each) by Debian's iptables."""
    flavour = "iptables-nft" if mode is Mode.NFT else "iptables-legacy"
    commands = build_argv(options, V4, mode=mode)
    script = "\n".join(shlex.join([require_tool(flavour), *argv[1:]]) for argv in commands)
    ns.exec(["sh", "-e"], input_=script + "\n")


@pytest.mark.parametrize("mode", [Mode.NFT, Mode.LEGACY], ids=lambda m: m.value)
def test_10000_ports_leave_what_upstream_leaves(
    rig: Rig, api_node: tuple[Netns, Path], lock_file: Path, mode: Mode
) -> None:
    """One ADD with 10 000 inbound ports to ignore succeeds, and the save tool prints exactly
    what it prints after upstream's 675 iptables commands for the same list."""
    node, kubeconfig = api_node
    ours, theirs = rig.pod().netns, rig.pod().netns
    linkerd = {"iptables-mode": mode.value, "inbound-ports-to-ignore": [*CHART_INBOUND, *PORTS]}
    proc = command_add(node, ours, kubeconfig, linkerd, XTABLES_LOCKFILE=str(lock_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    upstream_run(theirs, ProxyInitOptions(inbound_ports_to_ignore=(*CHART_INBOUND, *PORTS)), mode)
    expected = save_text(theirs, SAVE[mode.value])
    assert expected.count("\n-A PROXY_INIT_REDIRECT ") == 668  # 667 groups + the REDIRECT
    assert save_text(ours, SAVE[mode.value]) == expected
    again = command_add(node, ours, kubeconfig, linkerd, XTABLES_LOCKFILE=str(lock_file))
    assert again.returncode == 0, again.stdout + again.stderr
    assert save_text(ours, SAVE[mode.value]) == expected  # flushed and refilled: no duplicates


# ----------------------------------------------------------------------------- nft verdicts


class TestNftVerdict:
    def test_lost_acks_of_a_committed_batch_are_success(
        self, rig: Rig, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """With a receive buffer too small for the acks, the kernel drops replies (ENOBUFS);
        the commit is read back and reported as the success it is."""
        verdicts: list[str] = []
        original = NftBackend._read_back_verdict

        def spy(self: NftBackend, *args: Any, **kwargs: Any) -> None:
            verdicts.append("read back")
            original(self, *args, **kwargs)

        monkeypatch.setattr(NftBackend, "_read_back_verdict", spy)
        ns, change = rig.netns(), big_change(400)
        with entered_netns(ns.path):
            NftBackend(receive_buffer=4096).apply(V4, change)
            table = NftBackend().dump(V4)
        assert verdicts == ["read back"]
        assert table.rules_of("BIG") == change.append

    def test_lost_error_reply_means_nothing_changed(self, rig: Rig) -> None:
        """A refused batch whose error reply was dropped with the acks is reported as a
        failure, and the table is as before (the generation did not move)."""
        ns = rig.netns()
        bad = Rule("BIG", ("-j", "NO_SUCH_CHAIN"))
        with entered_netns(ns.path):
            before = NftBackend().dump(V4)
            with pytest.raises(FirewallError, match="nothing was changed"):
                NftBackend(receive_buffer=4096).apply(V4, big_change(400, bad))
            assert NftBackend().dump(V4) == before

    def test_a_stale_snapshot_is_a_conflict_and_changes_nothing(self, rig: Rig) -> None:
        """A change applied against a snapshot taken before someone else's commit is refused
        by the kernel (generation id) as a conflict."""
        ns = rig.netns()
        backend = NftBackend()
        with entered_netns(ns.path):
            base = backend.snapshot(V4)
        ns.exec([require_tool("iptables-nft"), "-t", "nat", "-N", "SOMEONE_ELSE"])
        after_them = save_text(ns, "iptables-nft-save")
        with entered_netns(ns.path), pytest.raises(FirewallConflict):
            backend.apply(V4, big_change(3), base)
        assert save_text(ns, "iptables-nft-save") == after_them

    def test_socket_failure_is_a_plain_message(
        self, rig: Rig, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An OSError of the netlink socket (here: raising its buffers) is a FirewallError
        saying why, never an exception name; nothing is sent."""

        def no_memory(*_args: object) -> None:
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

        monkeypatch.setattr("multicall.effects.firewall.nft._Socket.size_buffers", no_memory)
        ns = rig.netns()
        with entered_netns(ns.path):
            with pytest.raises(FirewallError) as err:
                NftBackend().apply(V4, big_change(3))
            assert err.value.message == "nf_tables: Cannot allocate memory"
            assert NftBackend().dump(V4).rules == ()

    def test_concurrent_dual_stack_adds(self, rig: Rig, lock_file: Path) -> None:
        """Ten pairs of nft ADDs (IPv4 and IPv6) on one netns at once: all succeed, and each
        table is exactly upstream's (one jump each: stale plans are planned again)."""
        ns = rig.pod().netns
        linkerd = {"iptables-mode": "nft", "ipv6": True}
        lock = XtablesLock(str(lock_file))
        for _ in range(10):
            pair = together(*(lambda: seam_add(ns.path, linkerd, lock) for _ in range(2)))
            outcomes: list[AddOutcome] = [child.result() for child in pair]
            assert [o.exit_code for o in outcomes] == [0, 0], outcomes
        assert save_text(ns, "iptables-nft-save") == fixture_text("default-nft")
        with entered_netns(ns.path):
            v6 = NftBackend().dump(V6)
        assert strip_counters(v6) == strip_counters(
            expected_table(ProxyInitOptions(inbound_ports_to_ignore=CHART_INBOUND), V6)
        )


# ----------------------------------------------------------------------------- legacy locks


LEGACY = {"iptables-mode": "legacy"}
WAITING = {"iptables-mode": "legacy", "use-wait-flag": True}


def run_pair(ns: Netns, linkerd: dict[str, Any], lock: XtablesLock) -> list[AddOutcome]:
    pair = together(*(lambda: seam_add(ns.path, linkerd, lock) for _ in range(2)))
    return [child.result() for child in pair]


def test_twenty_pairs_of_concurrent_legacy_adds(rig: Rig, lock_file: Path) -> None:
    """Two ADDs of one pod at the same instant, 20 times (fresh netns: both race to create
    the chains; then the same netns: both flush and refill), without the wait flag: every ADD
    succeeds and the table is exactly upstream's."""
    lock = XtablesLock(str(lock_file))
    for _ in range(10):
        ns = rig.pod().netns
        for _ in range(2):
            outcomes = run_pair(ns, LEGACY, lock)
            assert [o.exit_code for o in outcomes] == [0, 0], outcomes
            assert save_text(ns, "iptables-legacy-save") == fixture_text("default-legacy")
        rig.remove(ns)


@pytest.mark.parametrize("holder", ["iptables-legacy-restore -w", "flock"])
def test_pairs_wait_while_another_program_holds_the_lock(
    rig: Rig, lock_file: Path, holder: str
) -> None:
    """With use-wait-flag, ADDs started while another program holds the xtables lock wait
    for it (still running while it is held), then all succeed exactly."""
    ns = rig.pod().netns
    lock = XtablesLock(str(lock_file))
    for _ in range(5):
        held = (
            iptables_restore_holding(ns, lock_file)
            if holder.startswith("iptables")
            else flock_held(lock_file)
        )
        pair = [Forked(lambda: seam_add(ns.path, WAITING, lock)) for _ in range(2)]
        with held:  # forked before: children must not inherit the holder's lock
            release(pair)
            time.sleep(0.2)
            assert all(child.running() for child in pair), "an ADD did not wait for the lock"
        outcomes: list[AddOutcome] = [child.result() for child in pair]
        assert [o.exit_code for o in outcomes] == [0, 0], outcomes
        assert save_text(ns, "iptables-legacy-save") == fixture_text("default-legacy")


def test_without_the_wait_flag_a_held_lock_fails_at_once(rig: Rig, lock_file: Path) -> None:
    """As iptables without -w: iptables' message, CNI error JSON, nothing programmed."""
    ns = rig.pod().netns
    with flock_held(lock_file):
        start = time.monotonic()
        outcome = seam_add(ns.path, LEGACY, XtablesLock(str(lock_file)))
        elapsed = time.monotonic() - start
    assert outcome.exit_code == 1
    assert elapsed < 1.0 + 1.0  # no waiting: well inside any deadline
    error = json.loads(outcome.stdout)
    assert error["msg"] == (
        "Another app is currently holding the xtables lock. Perhaps you want to use the -w option?"
    )
    assert "PROXY_INIT" not in save_text(ns, "iptables-legacy-save")


@pytest.mark.parametrize("which", ["xtables", "netns"])
def test_every_wait_is_bounded(rig: Rig, lock_file: Path, which: str) -> None:
    """A lock held for longer than the wait limit fails the ADD after the limit (+1 s at
    most) with a message saying so; nothing is programmed."""
    ns = rig.pod().netns
    lock = XtablesLock(str(lock_file), wait_limit=1.0)
    held = flock_held(lock_file) if which == "xtables" else flock_held(Path(ns.path))
    with held:
        start = time.monotonic()
        outcome = seam_add(ns.path, WAITING, lock)
        elapsed = time.monotonic() - start
    assert outcome.exit_code == 1
    assert 1.0 <= elapsed < 1.0 + 1.0
    message = json.loads(outcome.stdout)["msg"]
    if which == "xtables":
        assert (
            message
            == "Another app is currently holding the xtables lock. Stopped waiting after 1s."
        )
    else:
        assert message.endswith(
            "(it holds the lock on its network namespace); stopped waiting after 1s"
        )
    assert "PROXY_INIT" not in save_text(ns, "iptables-legacy-save")


def test_lock_file_that_is_not_a_file(rig: Rig, tmp_path: Path) -> None:
    """A FIFO planted at the lock path fails fast and clearly (the open never blocks)."""
    fifo = tmp_path / "fifo.lock"
    os.mkfifo(fifo)
    ns = rig.pod().netns
    start = time.monotonic()
    outcome = seam_add(ns.path, LEGACY, XtablesLock(str(fifo)))
    assert time.monotonic() - start < 1.0 + 1.0
    assert json.loads(outcome.stdout)["msg"] == (
        f"Fatal: the lock file {fifo} is not a regular file"
    )
    assert "PROXY_INIT" not in save_text(ns, "iptables-legacy-save")


def test_eagain_at_commit_is_a_conflict(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that ignores the lock changes the table between our read and our commit: the
    kernel refuses the commit (EAGAIN), nothing changes, and it is a conflict to plan again."""
    ns = rig.netns()
    real_commit = legacy_apply._commit

    def racing_commit(handle: Any, family: Family, table: str) -> None:
        ns.exec([require_tool("iptables-legacy"), "-t", "nat", "-N", "RACER"])
        real_commit(handle, family, table)

    monkeypatch.setattr(legacy_apply, "_commit", racing_commit)
    change = TableChange("nat", ("MINE",), (), (Rule("MINE", ("-j", "RETURN")),))
    with entered_netns(ns.path), pytest.raises(FirewallConflict, match="Resource temporarily"):
        IptcBackend().apply(V4, change)
    text = save_text(ns, "iptables-legacy-save")
    assert ":RACER" in text
    assert "MINE" not in text


def test_a_foreign_change_since_the_snapshot_is_a_conflict(rig: Rig) -> None:
    """The legacy handle no longer matching the snapshot (a lock-ignoring writer added a
    rule) is refused before anything is written."""
    ns = rig.netns()
    backend = IptcBackend()
    with entered_netns(ns.path):
        base = backend.snapshot(V4)
    ns.exec([require_tool("iptables-legacy"), "-t", "nat", "-A", "OUTPUT", "-j", "RETURN"])
    change = TableChange("nat", ("MINE",), (), (Rule("MINE", ("-j", "RETURN")),))
    with entered_netns(ns.path), pytest.raises(FirewallConflict, match="changed since"):
        backend.apply(V4, change, base)
    assert "MINE" not in save_text(ns, "iptables-legacy-save")


def test_engine_plans_again_after_a_conflict(rig: Rig, tmp_path: Path, lock_file: Path) -> None:
    """The engine's retry on a real conflict: a rule added between plan and apply is kept,
    and the result is exactly one run's on the new table."""
    ns = rig.pod().netns
    options = ProxyInitOptions(inbound_ports_to_ignore=CHART_INBOUND)
    logs: list[str] = []
    original = IptcBackend.snapshot
    raced: list[bool] = []

    def snapshot_then_race(self: IptcBackend, family: Family, table: str = "nat") -> Any:
        snap = original(self, family, table)
        if not raced:
            raced.append(True)
            ns.exec(["env", f"XTABLES_LOCKFILE={tmp_path / 'other.lock'}",
                     require_tool("iptables-legacy"),
                     "-t", "nat", "-A", "OUTPUT", "-j", "RETURN"])  # fmt: skip
        return snap

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(IptcBackend, "snapshot", snapshot_then_race)
        engine.apply_proxy_init(
            ns.path, options, mode=Mode.LEGACY, families=(V4,), log=logs.append,
            lock=XtablesLock(str(lock_file)),
        )  # fmt: skip
    assert any("planning again (attempt 2)" in line for line in logs), logs
    text = save_text(ns, "iptables-legacy-save")
    assert text.count("-j PROXY_INIT_OUTPUT") == 1
    assert "-A OUTPUT -j RETURN" in text
