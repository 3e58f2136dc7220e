"""The plugin's ports: what its commands need from the Kubernetes API and the firewall, as
Protocols, and the real adapters over `multicall.effects`.

Tests and the node agent pass their own `PluginDeps` (tests/support/fakes.py has fakes that
need no root); `real_deps()` is what the `linkerd-cni` binary uses. The real adapters import
their effects modules on first use, so a VERSION or DEL never loads ssl or libiptc.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
    from multicall.core.firewall.nft.native import NativeTable
    from multicall.core.firewall.ruleset import Table
    from multicall.core.kube.objects import Namespace, Pod, Service
    from multicall.effects.firewall.legacy.isolation import SingleUse
    from multicall.effects.firewall.locks import XtablesLock
    from multicall.effects.kube.warm import WarmConnections
    from multicall.effects.ns import NetnsRef

from multicall.core.logs import MessageLog
from multicall.effects.caller import OWN_FILES, Files


class PodApi(Protocol):
    """The three GETs the plugin makes (KubeError on any failure, with client-go's text)."""

    def get_pod(self, namespace: str, name: str) -> Pod: ...

    def get_namespace(self, name: str) -> Namespace: ...

    def get_service(self, namespace: str, name: str) -> Service: ...

    def close(self) -> None: ...


class Kube(Protocol):
    """Access to the API through the kubeconfig the network config names."""

    def check_kubeconfig(self, path: str) -> None:
        """STATUS: KubeError when the kubeconfig at `path` cannot be used."""
        ...

    def connect(self, kubeconfig: str, env: Mapping[str, str]) -> PodApi:
        """A client for one invocation (`env` is the plugin's: CNIBOX_KUBE_TIMEOUT)."""
        ...


class Firewall(Protocol):
    """Programs and reads a pod's nat table (FirewallError, NetnsError on failure)."""

    def apply(
        self,
        netns: NetnsRef,
        options: ProxyInitOptions,
        *,
        mode: Mode,
        families: tuple[Family, ...],
        log: MessageLog,
    ) -> None:
        """Program the PROXY_INIT chains for each family, all or nothing per table."""
        ...

    def dump_nat(self, netns: NetnsRef, *, mode: Mode, family: Family, log: MessageLog) -> Table:
        """The nat table of one family as iptables-save would print it."""
        ...

    def dump_raw(
        self, netns: NetnsRef, *, mode: Mode, family: Family, log: MessageLog
    ) -> Table | None:
        """The raw table of one family (CHECK judges untracking there: diff.untracked);
        None when it holds a rule the backend cannot read (logged)."""
        ...

    def dump_native(
        self, netns: NetnsRef, *, family: Family, log: MessageLog
    ) -> NativeTable | None:
        """The nftables mode's `linkerd-proxy-init` table of one family (None: absent)."""
        ...


@dataclass(frozen=True, slots=True)
class PluginDeps:
    """What run_plugin talks to: the API, the firewall, and the filesystem the paths of the
    config name (the log_file): this process's own, or a node agent's caller's
    (effects/caller.py). The real `Kube` and `Firewall` take their own `Files` (the
    kubeconfig, the xtables lock file): pass the same one to all three."""

    kube: Kube
    firewall: Firewall
    files: Files = OWN_FILES


class RealKube:
    """The kubeconfig from disk and `effects.kube.client.KubeClient` (one connection per
    client). `files`: whose filesystem the kubeconfig and the files it names are in.
    `warm`: a node agent worker's warm connections (effects/kube/warm.py), handed to every
    client; None (the one-shot plugin): each client dials its own."""

    def __init__(self, files: Files = OWN_FILES, *, warm: WarmConnections | None = None) -> None:
        self.files = files
        self.warm = warm

    def check_kubeconfig(self, path: str) -> None:
        from multicall.effects.kube.config import read_kubeconfig

        read_kubeconfig(path, files=self.files)

    def connect(self, kubeconfig: str, env: Mapping[str, str]) -> PodApi:
        from multicall.effects.kube.client import KubeClient
        from multicall.effects.kube.config import read_kubeconfig, timeout_from_env

        timeout = timeout_from_env(env)  # an invalid environment first, as skel orders it
        config = read_kubeconfig(kubeconfig, files=self.files)
        return KubeClient(config, timeout=timeout, files=self.files, warm=self.warm)


class RealFirewall:
    """The in-process engine (`effects.firewall.engine`): libiptc or nf_tables netlink.

    `lock` is where the legacy backend finds the xtables lock (None: as iptables does,
    `$XTABLES_LOCKFILE` or /run/xtables.lock in this process's mount namespace). The node
    agent, running in a pod, passes the caller's lock file through the caller's root
    (locks.py rule 4). `single_use`: this process serves one request (a node agent's
    worker), so one-family legacy operations may run in-process (legacy.py rule 3).
    """

    def __init__(
        self, lock: XtablesLock | None = None, *, single_use: SingleUse | None = None
    ) -> None:
        self.lock = lock
        self.single_use = single_use

    def apply(
        self,
        netns: NetnsRef,
        options: ProxyInitOptions,
        *,
        mode: Mode,
        families: tuple[Family, ...],
        log: MessageLog,
    ) -> None:
        from multicall.effects.firewall.engine import apply_proxy_init

        apply_proxy_init(
            netns,
            options,
            mode=mode,
            families=families,
            log=log,
            lock=self.lock,
            single_use=self.single_use,
        )

    def dump_nat(self, netns: NetnsRef, *, mode: Mode, family: Family, log: MessageLog) -> Table:
        from multicall.effects.firewall.engine import dump_nat

        return dump_nat(netns, mode=mode, family=family, log=log, single_use=self.single_use)

    def dump_raw(
        self, netns: NetnsRef, *, mode: Mode, family: Family, log: MessageLog
    ) -> Table | None:
        from multicall.effects.firewall.engine import dump_nat
        from multicall.errors import FirewallError

        try:
            return dump_nat(
                netns, mode=mode, family=family, log=log, single_use=self.single_use, table="raw"
            )
        except FirewallError as exc:  # nat is judged all the same
            log(f"the {family.value} raw table was not judged: {exc.message}")
            return None

    def dump_native(
        self, netns: NetnsRef, *, family: Family, log: MessageLog
    ) -> NativeTable | None:
        from multicall.effects.firewall.engine import dump_native

        return dump_native(netns, family=family, log=log)


def real_deps() -> PluginDeps:
    return PluginDeps(RealKube(), RealFirewall())
