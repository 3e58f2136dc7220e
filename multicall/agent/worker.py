"""One request in a node agent's worker (read by the parent, agent/admission.py): check what
the caller handed over, run the plugin through the seam in the caller's context, answer.

The caller's context is passed explicitly, never installed in a global: the caller itself
as the `Files` every path of the request is opened by (agent/caller_files.py: the launcher
opens the kubeconfig, its token and CA, the xtables lock file, the config's log_file when
asked, and only paths the request named), its pod netns,
its own netns and its netfilter netlink socket as descriptors in the `PluginRequest`, and
this worker's `SingleUse` (agent/warm.py) to the firewall. A request this worker cannot
serve without more than it has comes back as `PluginResult.served_elsewhere` (nothing was
changed): the caller is told to run its one-shot path.

Least authority (issue 24): before anything runs, the process that connected is judged
(agent/authority.py: the one-shot plugin's capabilities in the agent's user namespace) and
every handed descriptor is checked to be what it claims (`check_descriptors`). Whatever
fails is handed back, never served and never a CNI error: the caller's own run then decides
with the caller's own authority.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
from typing import TYPE_CHECKING

from multicall.agent.worker_process import Again, Ask, Report

if TYPE_CHECKING:
    from multicall.agent.authority import Authority
    from multicall.agent.pod_cache import CachedKube
    from multicall.agent.warm import Warmth
    from multicall.core.agent_protocol import Request
    from multicall.effects.caller import Files
    from multicall.effects.sandbox_records import RecordStore
    from multicall.plugin.recording import RecordingFirewall

SEND_TIMEOUT = 5.0  # a caller that reads its reply slower than this runs one-shot


class RequestWorker:
    """Serves the requests one worker process takes (agent/server.py's `Serve`)."""

    def __init__(
        self,
        build: str,
        own_netns: tuple[int, int],
        warmth: Warmth,
        records: RecordStore | None = None,
        *,
        pod_cache: bool = False,
    ) -> None:
        self.build = build  # requests of another build are handed back
        self.own_netns = own_netns  # the agent's netns: never a request's target
        self.own_userns = identity("/proc/self/ns/user")  # the only one callers may be in
        self.warmth = warmth
        self.records = records  # the keeper's record of programmed sandboxes (agent/keeper.py)
        self.pod_cache = pod_cache  # the parent holds the node's pod cache (agent/pod_cache.py)

    def serve(
        self, conn: socket.socket, request: Request, report: Report, ask: Ask | None = None
    ) -> Again | None:
        """One request, read whole by the parent (agent/server.py rule 6), answered on
        `conn`. Returns what the worker prepares its next request with when it may serve
        another (agent/server.py rule 4): the request ran no x_tables code here (libxtables
        keeps one family's extensions per process) and left the worker in its own netns.
        None: the worker exits."""
        try:
            return self._serve_request(conn, report, request, ask)
        finally:
            for fd in request.fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _serve_request(
        self, conn: socket.socket, report: Report, request: Request, ask: Ask | None
    ) -> Again | None:
        from multicall.core import agent_protocol as proto
        from multicall.effects.firewall.legacy import isolation as legacy

        command = request.command or "unknown"
        if request.build != self.build:
            report("D", {"command": command, "fallback": "other build"})
            _send(conn, proto.fallback_frame("other build"))
            return None
        report("S", {"command": command})
        loaded = legacy.extensions_loaded()
        firewall: list[RecordingFirewall] = []
        reads: list[CachedKube] = []
        try:
            authority = self.caller(conn)
            code, out, err, cni_code = self.run_request(
                conn, request, authority, firewall, ask=ask if self.pod_cache else None, reads=reads
            )
        except Fallback as exc:
            fell_back: dict[str, object] = {"command": command, "fallback": exc.reason}
            if exc.reason == legacy.OTHER_FAMILY:  # the requests changed: stop preloading
                fell_back["warm"] = {"xtables": ""}
            report("D", fell_back)
            _send(conn, proto.fallback_frame(exc.reason))
            return None
        # Reported first: whoever asks /metrics once the caller has its result sees it counted.
        done: dict[str, object] = {"command": command, "exit": code, "cni_code": cni_code}
        done["xt_loads"] = legacy.extensions_loaded() - loaded
        if request.command == "ADD" and reads:
            done.update(reads[0].stats.report())  # the pod cache's metrics
        warm = self.warmth.report(bool(firewall) and firewall[0].programmed is not None)
        if code == 0:
            done["warm"] = warm
        if self.records is not None:
            from multicall.agent.keeper import note_request

            programmed = firewall[0].programmed if firewall else None
            done["record"] = note_request(
                self.records, request.env, request.stdin, programmed, code
            )
        report("D", done)
        _send(conn, proto.result_frame(code, out, err))
        reusable = legacy.extensions_loaded() == 0 and not self.warmth.ran_xtables()
        if not reusable or identity("/proc/thread-self/ns/net") != self.own_netns:
            return None
        return Again(
            {"api": warm["api"]} if "api" in warm else {}, self.warmth.connections.warm_fds()
        )

    def caller(self, conn: socket.socket) -> Authority:
        """What this worker may do for the process at the other end of `conn`; Fallback when
        it may not have the agent act for it at all (agent/authority.py)."""
        from multicall.agent.authority import Refused, caller_authority

        try:
            return caller_authority(conn, self.own_userns)
        except Refused as exc:
            raise Fallback(exc.reason) from None

    def run_request(
        self,
        conn: socket.socket,
        request: Request,
        authority: Authority,
        watched: list[RecordingFirewall] | None = None,
        *,
        ask: Ask | None = None,
        reads: list[CachedKube] | None = None,
    ) -> tuple[int, bytes, bytes, str]:
        """The plugin, in this process, in the caller's context: (exit code, stdout, log
        lines, CNI error code or ""). `conn`: the caller, which opens the request's files
        (agent/caller_files.py). `authority`: what the caller may have this worker do
        with its privileges. `watched` receives the firewall it used, `reads` the `Kube`
        port (the pod cache's, asked through `ask`; agent/pod_cache.py). Fallback when the
        caller must run it itself."""
        from multicall.agent.caller_files import AskedFiles
        from multicall.core import agent_protocol as proto
        from multicall.effects import ns
        from multicall.effects.firewall.locks import XtablesLock
        from multicall.errors import NetnsError
        from multicall.plugin.ports import PluginDeps, RealFirewall
        from multicall.plugin.recording import RecordingFirewall
        from multicall.plugin.run import PluginRequest, run_plugin

        fds = request.fds
        home, target = fds.get(proto.FD_CALLER_NETNS), fds.get(proto.FD_TARGET_NETNS)
        if home is None:
            raise Fallback("caller sent no netns")
        netns_path = request.env.get("CNI_NETNS", "")
        if target is None and netns_path and request.command in ("ADD", "CHECK", "DEL"):
            # Never look the caller's path up here: it names a file of the caller's mount
            # namespace (the launcher sends the descriptor, or runs one-shot itself).
            raise Fallback("CNI_NETNS not handed over")
        if target is not None:
            try:
                ns.check_netns_fd(target, netns_path)  # what run_plugin checks, before anything
            except NetnsError:
                raise Fallback("CNI_NETNS is not a network namespace") from None
            if identity(f"/proc/self/fd/{target}") == self.own_netns:
                raise Fallback("CNI_NETNS is the agent's own netns")
        check_descriptors(home, target, fds.get(proto.FD_NETLINK))
        if identity(f"/proc/self/fd/{home}") != identity("/proc/thread-self/ns/net"):
            # The API is reached from the caller's netns, as the one-shot plugin does. In a
            # DaemonSet with hostNetwork (or a Talos service) they are the same: no setns.
            if not authority.may_enter:
                raise Fallback(ns.CALLER_NOT_VERIFIED)
            try:
                ns.setns(home, ns.CLONE_NEWNET)
            except OSError as exc:
                raise Fallback(f"cannot enter the caller's netns: {exc.strerror}") from None
            self.warmth.connections.drop_warm()  # dialled from the agent's netns, not the caller's
        files = AskedFiles(conn)
        err = io.BytesIO()
        plugin_request = PluginRequest(
            env=request.env,
            stdin=b"" if request.command == "VERSION" else request.stdin,
            stderr=err,
            netns_fd=target,
            caller_netns_fd=home,
            netlink_fd=fds.get(proto.FD_NETLINK),
            for_caller=True,
            caller_may_enter=authority.may_enter,
        )
        # The request's API connection: the next request's warm one.
        self.warmth.connections.park_connections()
        # Legacy ADDs take the caller's xtables lock: its XTABLES_LOCKFILE (or
        # /run/xtables.lock) opened by the caller (locks.py rule 4), the lock the one-shot
        # plugin would take. A worker serves one request at a time, and exits after a legacy
        # apply: one of one family runs libiptc here instead of forking a child per table
        # operation (legacy.py rule 3).
        lock = XtablesLock(env=request.env, files=files)
        firewall = RecordingFirewall(RealFirewall(lock, single_use=self.warmth.single_use()))
        if watched is not None:
            watched.append(firewall)
        kube = self.kube(files, ask, reads)
        outcome = run_plugin(plugin_request, PluginDeps(kube, firewall, files))
        if outcome.served_elsewhere:
            raise Fallback(outcome.served_elsewhere)
        stdout, stderr = outcome.stdout, err.getvalue()
        if len(stdout) + len(stderr) > proto.MAX_OUTPUT:
            raise Fallback("output too large")
        cni_code = str(outcome.error.code) if outcome.error is not None else ""
        return outcome.exit_code, stdout, stderr, cni_code

    def kube(self, files: Files, ask: Ask | None, reads: list[CachedKube] | None) -> CachedKube:
        """The request's `Kube` port: its caller's kubeconfig through `files`, this worker's
        warm connection, the parent's pod cache through `ask` (None: no cache)."""
        from multicall.agent.pod_cache import CachedKube
        from multicall.plugin.ports import RealKube

        kube = CachedKube(RealKube(files, warm=self.warmth.connections), ask)
        if reads is not None:
            reads.append(kube)
        return kube


def check_descriptors(home: int, target: int | None, netlink: int | None) -> None:
    """Fallback unless the handed descriptors are what they claim: the caller's netns a
    network nsfs file, the netlink socket an AF_NETLINK/NETLINK_NETFILTER socket made in
    CNI_NETNS (`target`). A socket of another netns (the agent's own, another pod's) would
    program that netns and leave the pod empty; one of another family or protocol would fail
    as CNI error 999 where the caller's own run may succeed."""
    from multicall.effects import ns
    from multicall.effects.firewall.nft import NETLINK_NETFILTER
    from multicall.effects.peer import socket_kind
    from multicall.errors import NetnsError

    try:
        ns.check_netns_fd(home, "the caller's netns")
    except NetnsError:
        raise Fallback("caller's netns is not a network namespace") from None
    if netlink is None:
        return
    if target is None:
        raise Fallback("netlink socket without CNI_NETNS")
    try:
        kind = socket_kind(netlink)
    except OSError:
        raise Fallback("netlink descriptor is not a netfilter netlink socket") from None
    if (kind.domain, kind.protocol) != (socket.AF_NETLINK, NETLINK_NETFILTER):
        raise Fallback("netlink descriptor is not a netfilter netlink socket")
    if kind.netns is None:  # SIOCGSKNS needs CAP_NET_ADMIN over the socket's netns
        raise Fallback("netlink socket's netns unknown")
    if kind.netns != identity(f"/proc/self/fd/{target}"):
        raise Fallback("netlink socket is not in CNI_NETNS")


class Fallback(Exception):
    """The caller must run this request itself; `reason` says why (metrics, its log)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _send(conn: socket.socket, data: bytes) -> None:
    try:
        conn.settimeout(SEND_TIMEOUT)
        conn.sendall(data)
    except OSError:
        pass  # the caller went away; it runs the one-shot path if it still can


def identity(path: str) -> tuple[int, int]:
    """(device, inode) of a namespace file: which namespace it is."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino)
