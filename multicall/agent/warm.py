"""What makes a worker's request fast, and the per-process state it takes: made explicit
here instead of living in the adapters' globals.

- In the parent, once (`Warmth.preload`): every module a request may need is imported
  (workers fork from there), libiptc is loaded, and an empty scratch netns is made where
  workers load x_tables extensions (libxtables asks the kernel for each extension's
  revisions on a raw socket of the current netns; nothing of a preload belongs in the
  node's netns, not even a read).
- In a worker, before its request (`Warmth.prepare`, agent/server.py's `Prepare`), from
  what the previous requests needed (`Warmth.report`): dial the API server they used
  (`Warmth.connections`, effects/kube/warm.py's `WarmConnections`) and load the x_tables
  extensions of a one-family legacy apply (this worker then hands the other family back:
  legacy rule 3).
- `Warmth.single_use`: the worker's `SingleUse` (legacy.py), made in the worker process on
  first need and passed to its firewall (plugin/ports.py `RealFirewall(single_use=)`).
Failures of a preparation are the request's to see, or nobody's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from multicall.effects.kube.warm import WarmConnections

if TYPE_CHECKING:
    from multicall.effects.firewall.legacy.isolation import SingleUse


# Parsed once by the parent (`preload`) so that the kubeconfig parser's imports are done.
PRELOAD_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


class Warmth:
    """The agent's warm state: made once in the parent, copied into each worker by the fork
    (so what a worker changes is its own)."""

    def __init__(self) -> None:
        # The API connections a worker keeps or dials ahead (its requests' `RealKube`).
        self.connections = WarmConnections()
        # An empty netns made by the parent (`preload`); None: no CAP_SYS_ADMIN, workers
        # preload no x_tables extensions.
        self.scratch_fd: int | None = None
        # This process's SingleUse: None in the parent (which never serves), and in a new
        # worker until it needs one (each worker has its own copy of this object).
        self._single_use: SingleUse | None = None

    def single_use(self) -> SingleUse:
        """This worker's `SingleUse`, made on first need (in the worker, never the parent)."""
        if self._single_use is None:
            from multicall.effects.firewall.legacy.isolation import SingleUse

            self._single_use = SingleUse()
        return self._single_use

    def ran_xtables(self) -> bool:
        """Whether this worker ran x_tables code itself (it may not serve another request)."""
        return self._single_use is not None and self._single_use.ran is not None

    def preload(self) -> None:
        """Import once, in the parent, everything a request may need: workers fork from
        here."""
        # Besides the request path's own modules, what a request imports on its way when
        # first used: a worker that serves several requests pays that once, but each legacy
        # request has a fresh fork of this parent (single-use), which paid it every time:
        # PyYAML's loader and its regexes (the kubeconfig), datetime (through yaml), the
        # caller's judgement, the record of what was programmed (~10 ms of a legacy ADD,
        # found with py-spy).
        import ssl  # noqa: F401

        from multicall.agent import authority, caller_files, keeper  # noqa: F401
        from multicall.core.cni import netconf, result, skel  # noqa: F401
        from multicall.core.firewall import diff, proxy_init  # noqa: F401
        from multicall.core.kube import pod_policy  # noqa: F401
        from multicall.core.kube.kubeconfig import parse_kubeconfig
        from multicall.effects import inputs, peer, sandbox_records  # noqa: F401
        from multicall.effects.firewall import engine, locks, nft  # noqa: F401
        from multicall.effects.firewall.legacy import isolation  # noqa: F401
        from multicall.effects.kube import client  # noqa: F401
        from multicall.errors import FirewallError
        from multicall.plugin import commands, expected, pod_inputs, ports, recording, run  # noqa: F401

        parse_kubeconfig(PRELOAD_KUBECONFIG, context=None)

        self.connections.keep_spare_tls_context()
        from multicall.effects import ns

        self.scratch_fd = ns.scratch_netns()  # before any thread: made on, kept by, this one
        try:
            from multicall.effects.firewall.legacy.loading import iptc

            iptc()
        except FirewallError:
            pass  # no libiptc here: legacy requests will fail in their worker as one-shot would

    def prepare(self, hint: object) -> None:
        """In a new worker, from what the previous requests needed (`report`)."""
        if not isinstance(hint, dict):
            return
        if isinstance(api := hint.get("api"), dict):
            self.connections.warm_up(api)
        if (xtables := hint.get("xtables")) in ("ipv4", "ipv6") and self.scratch_fd is not None:
            from multicall.core.firewall.model import Family
            from multicall.effects import ns

            single_use = self.single_use()  # this worker serves one request, then exits
            with ns.entered_netns(ns.NetnsRef("the agent's scratch netns", self.scratch_fd)):
                single_use.preload(Family(xtables))

    def report(self, applied: bool) -> dict[str, object]:
        """What this successful request leaves for the next workers: its API server (not
        when it used a CA file), and, when it applied rules, the family of a one-family
        legacy apply run here ("" for nft or dual-stack legacy: preload nothing)."""
        warm: dict[str, object] = {}
        if (api := self.connections.warm_hint()) is not None:
            warm["api"] = api
        if applied:
            ran = self._single_use.ran if self._single_use is not None else None
            warm["xtables"] = ran.value if ran is not None else ""
        return warm
