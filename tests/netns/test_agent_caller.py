"""The firewall and the files as a node agent's worker reaches them (agent/caller_files.py,
the descriptors passed explicitly), from source, in forked children that hold what a worker
gets from the launcher: nf_tables
through the netlink socket the caller made inside the pod's netns, never entering it, with the
hardened backend's batch sizing, generation-id guard and read-back verdicts (issue 12) working
on that socket; legacy under the caller's xtables lock, and the config's log_file, both opened
by the caller on the worker's FILE requests: here a forked "caller" chrooted into a directory
that stands for the node's /, answering as the launcher does (tests/support/agent_client.py).

Every lock is a file under the test's own directory. Cost: about 3 s.
"""

from __future__ import annotations

import fcntl
import io
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from multicall.agent.caller_files import AskedFiles
from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.firewall.proxy_init import expected_table, strip_counters
from multicall.effects import ns
from multicall.effects.firewall import engine
from multicall.effects.firewall.locks import XtablesLock
from multicall.effects.firewall.nft import NETLINK_NETFILTER, HandedSocket, NftBackend
from multicall.errors import FirewallConflict
from multicall.plugin.ports import PluginDeps, RealFirewall
from multicall.plugin.run import PluginRequest, run_plugin
from tests.support import agent_client, require_tool
from tests.support.concurrency import Forked, add_env, add_stdin, flock_held, release
from tests.support.fakes import FakeKube
from tests.support.nft import big_change
from tests.support.oracles import save_text
from tests.support.pods import MESHED
from tests.support.rig import Netns, Rig
from tests.support.scenarios import fixture_text

pytestmark = pytest.mark.netns

V4 = Family.IPV4
CHART_INBOUND = ("4191", "4190")


@dataclass(frozen=True)
class Handed:
    """What a worker holds of its caller, as it passes them down: its files, and the pod
    netns with the netlink socket the caller made in it."""

    files: AskedFiles
    pod: ns.NetnsRef

    @property
    def socket(self) -> HandedSocket:
        assert self.pod.netlink_fd is not None
        return HandedSocket(self.pod.netlink_fd, self.pod.fd)


def caller_in(
    root: str, sock: socket.socket, named: tuple[str, ...], worker_end: socket.socket
) -> Forked:
    """A forked caller whose / is `root` (chroot), answering the FILE frames that arrive on
    `sock` as the launcher does for a request that named `named`, until EOF (the worker's
    end closed everywhere: this child's copy first)."""

    def serve() -> int:
        worker_end.close()
        if root != "/":
            os.chroot(root)
            os.chdir("/")
        call = agent_client.Call(sock, [], [os.fsencode(n) for n in named])
        while (head := agent_client._exactly(sock, 8)) is not None:
            kind, length = struct.unpack("<II", head)
            assert kind == 4, kind  # FRAME_FILE: nothing else flows this way
            agent_client.answer_file(call, agent_client._exactly(sock, length) or b"")
        return call.asked

    return Forked(serve)


def as_worker(
    pod: Netns,
    root: str,
    work: Callable[[Handed], object],
    *,
    enter: bool = False,
    named: tuple[str, ...] = ("/run/xtables.lock",),
) -> Any:
    """`work(handed)` in a forked child that holds what a worker gets from the launcher: a
    caller whose / is `root` that opens the files the request `named`, the pod netns and a
    netlink socket made inside it. Unless `enter` (legacy: libiptc needs the netns entered)
    the child may not enter any netns: a setns fails the test."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    caller = caller_in(root, theirs, named, mine)
    theirs.close()

    def child() -> object:
        target = os.open(pod.path, os.O_RDONLY | os.O_CLOEXEC)
        home = os.open(ns.OWN_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        ns.setns(target, ns.CLONE_NEWNET)  # as the launcher does: in, socket(), back
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        ns.setns(home, ns.CLONE_NEWNET)
        files = AskedFiles(mine)
        ref = ns.NetnsRef(pod.path, fd=target, netlink_fd=sock.detach(), for_caller=True)

        def entered(fd: int, path: str, *, for_caller: bool = False) -> None:
            raise AssertionError(f"the worker entered {path}")

        if not enter:
            ns._switch = entered  # nft must not need setns
        return work(Handed(files, ref))

    worker = Forked(child)
    mine.close()
    release([caller, worker])
    try:
        return worker.result()
    finally:
        caller.result()


def test_a_batch_beyond_the_default_socket_buffers_through_the_callers_socket(rig: Rig) -> None:
    """3000 rules (~0.5 MB, over the default 208 KiB send buffer) in one batch: the handed
    socket is sized as the backend's own socket is (SO_SNDBUFFORCE)."""
    pod = rig.netns()
    change = big_change(3000)

    def work(handed: Handed) -> bool:
        with ns.entered_netns(handed.pod, netlink_only=True):
            NftBackend(handed=handed.socket).apply(V4, change)
            return NftBackend(handed=handed.socket).dump(V4).rules_of("BIG") == change.append

    assert as_worker(pod, "/", work)


def test_lost_acks_through_the_callers_socket_are_read_back(rig: Rig) -> None:
    """A receive buffer too small for the acks (ENOBUFS) on the handed socket: the commit is
    read back and reported as the success it is."""
    pod = rig.netns()
    change = big_change(400)

    def work(handed: Handed) -> tuple[list[str], bool]:
        verdicts: list[str] = []
        original = NftBackend._read_back_verdict

        def spy(self: NftBackend, *args: Any, **kwargs: Any) -> None:
            verdicts.append("read back")
            original(self, *args, **kwargs)

        NftBackend._read_back_verdict = spy  # type: ignore[method-assign]  # forked child
        with ns.entered_netns(handed.pod, netlink_only=True):
            NftBackend(receive_buffer=4096, handed=handed.socket).apply(V4, change)
            dumped = NftBackend(handed=handed.socket).dump(V4)
            return verdicts, dumped.rules_of("BIG") == change.append

    verdicts, committed = as_worker(pod, "/", work)
    assert verdicts == ["read back"]
    assert committed


def test_a_stale_snapshot_through_the_callers_socket_is_a_conflict(rig: Rig) -> None:
    """The generation-id guard on the handed socket: a change planned before someone else's
    commit is refused and changes nothing; the next snapshot on the same socket is not
    answered by a reply an earlier use left queued there, and its change applies."""
    pod = rig.netns()
    iptables = require_tool("iptables-nft")

    def work(handed: Handed) -> tuple[bool, str, bool]:
        backend = NftBackend(handed=handed.socket)
        with ns.entered_netns(handed.pod, netlink_only=True):
            base = backend.snapshot(V4)
            pod.exec([iptables, "-t", "nat", "-N", "SOMEONE_ELSE"])
            try:
                backend.apply(V4, big_change(3), base)
                refused = False
            except FirewallConflict:
                refused = True
            after_them = save_text(pod, "iptables-nft-save")
            _leave_an_error_reply_queued(handed.socket)
            again = NftBackend(handed=handed.socket)
            again.apply(V4, big_change(3), again.snapshot(V4))
            applied = again.dump(V4).rules_of("BIG") == big_change(3).append
        return refused, after_them, applied

    refused, after_them, applied = as_worker(pod, "/", work)
    assert refused
    assert ":SOMEONE_ELSE" in after_them
    assert "BIG" not in after_them
    assert applied


def _leave_an_error_reply_queued(handed: HandedSocket) -> None:
    """An nf_tables request the kernel answers with an error, sent on the caller's socket and
    never read: what a stale reply looks like to the next user of the socket."""
    sock = socket.socket(fileno=os.dup(handed.fd))
    nfgenmsg = struct.pack("=BBH", socket.AF_INET, 0, 0)
    header = struct.pack("=IHHII", 16 + len(nfgenmsg), (10 << 8) | 0xFF, 0x1 | 0x4, 7, 0)
    sock.send(header + nfgenmsg)  # NFNL_SUBSYS_NFTABLES, no such message: an error
    sock.detach()  # the caller's socket stays open (this was a dup)


def test_the_engine_through_the_callers_socket_programs_upstreams_table(rig: Rig) -> None:
    """apply_proxy_init in nft mode (IPv4 and IPv6) as a worker runs it: upstream's tables,
    and the thread never entered the pod's netns (as_worker fails any setns)."""
    pod = rig.pod().netns
    options = ProxyInitOptions(inbound_ports_to_ignore=CHART_INBOUND)

    def work(handed: Handed) -> bool:
        ref = handed.pod
        engine.apply_proxy_init(ref, options, mode=Mode.NFT, families=(V4, Family.IPV6))
        v6 = engine.dump_nat(ref, mode=Mode.NFT, family=Family.IPV6)
        return strip_counters(v6) == strip_counters(expected_table(options, Family.IPV6))

    assert as_worker(pod, "/", work)
    assert save_text(pod, "iptables-nft-save") == fixture_text("default-nft")


def legacy_add(handed: Handed, named: XtablesLock, *, wait: bool) -> tuple[int, bytes, bytes]:
    """One legacy ADD through the seam, as the agent's worker builds it (its deps): the lock
    `named` names, in the caller's files."""
    pod = handed.pod
    lock = XtablesLock(env=named.env, files=handed.files)
    kube = FakeKube()
    kube.add_pod(MESHED)
    log = io.BytesIO()
    linkerd = {"iptables-mode": "legacy", "use-wait-flag": wait}
    result = run_plugin(
        PluginRequest(
            env=add_env(pod.path),
            stdin=add_stdin(linkerd),
            stderr=log,
            netns_fd=pod.fd,
            for_caller=True,
            caller_may_enter=True,  # the worker saw a caller that could enter it itself
        ),
        PluginDeps(kube, RealFirewall(lock), handed.files),
    )
    return result.exit_code, result.stdout, log.getvalue()


def test_legacy_takes_the_lock_in_the_callers_root(rig: Rig, tmp_path: Path) -> None:
    """The worker's lock is the caller's XTABLES_LOCKFILE resolved in the caller's root (here a
    directory standing for the host's /): held there, a legacy ADD without the wait flag fails
    at once with iptables' message and changes nothing; the same path in the worker's own
    filesystem is not what it locks."""
    host = tmp_path / "host"
    (host / "run").mkdir(parents=True)
    caller_lock = host / "run" / "xtables.lock"
    pod = rig.pod().netns
    lock = XtablesLock(env={"XTABLES_LOCKFILE": "/run/xtables.lock"})  # as the caller names it

    with flock_held(caller_lock):
        code, stdout, _log = as_worker(
            pod, str(host), lambda h: legacy_add(h, lock, wait=False), enter=True
        )
    assert code == 1
    assert b"Another app is currently holding the xtables lock" in stdout
    assert "PROXY_INIT" not in save_text(pod, "iptables-legacy-save")

    code, stdout, _log = as_worker(
        pod, str(host), lambda h: legacy_add(h, lock, wait=False), enter=True
    )
    assert code == 0, stdout
    assert save_text(pod, "iptables-legacy-save") == fixture_text("default-legacy")
    assert _is_lock_file(caller_lock)


def _is_lock_file(path: Path) -> bool:
    """A regular file nobody holds now (the ADD let go of it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    finally:
        os.close(fd)


def test_the_log_file_is_the_callers(rig: Rig, tmp_path: Path) -> None:
    """The config's log_file, written and rotated by a worker, is the file in the caller's
    root (here a directory standing for the node's /), never one in the worker's own
    filesystem; a symlink planted there is not followed."""
    from multicall.effects.log import Logger

    host = tmp_path / "host"
    (host / "var" / "log").mkdir(parents=True)
    pod = rig.netns()
    name = f"/var/log/cbx-agent-{os.getpid()}.log"  # absent from the worker's own /var/log

    def work(handed: Handed) -> bool:
        log = Logger(None, "info")
        log.open_file(name, max_bytes=200, files=handed.files)
        for i in range(6):
            log.info(f"line {i} of a log that rotates at 200 bytes")
        log.close()
        return os.path.lexists(name)

    assert as_worker(pod, str(host), work, named=(name,)) is False
    current, rotated = host / name.lstrip("/"), host / (name.lstrip("/") + ".1")
    assert "line 5 of" in current.read_text()
    assert "line 3 of" in rotated.read_text()  # two ~90-byte lines per file
    (host / "etc").mkdir()
    current.unlink()
    current.symlink_to(host / "etc" / "target")

    def planted(handed: Handed) -> str:
        log = Logger(None, "info")
        log.open_file(name, files=handed.files)
        return "" if log.file is not None else "refused"

    assert as_worker(pod, str(host), planted, named=(name,)) == "refused"
    assert not (host / "etc" / "target").exists()
