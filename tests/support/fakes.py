"""In-memory ports for the plugin seam (multicall.plugin): a Kubernetes API and a firewall
that need no root, no network and no kernel, so ADD/CHECK/DEL logic runs in the test process.

They answer the way the real adapters do: objects are parsed by the same core parsers from
the same JSON documents tests/support/kubeapi.py serves, errors carry client-go's texts,
and the firewall plans and applies with the same core functions as both kernel backends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from multicall.core.firewall.model import Family, Mode, ProxyInitOptions
from multicall.core.firewall.nft.native import NativeTable, native_table
from multicall.core.firewall.proxy_init import apply_change, empty_table, plan_change
from multicall.core.firewall.ruleset import Table
from multicall.core.kube.objects import (
    Namespace,
    Pod,
    Service,
    parse_namespace,
    parse_pod,
    parse_service,
)
from multicall.effects.ns import NetnsRef
from multicall.errors import FirewallError, KubeError
from multicall.plugin.ports import PluginDeps
from multicall.plugin.recording import Programmed


@dataclass
class FakeKube:
    """Pods, namespaces and services by name (API JSON documents); every GET is recorded.

    `kubeconfigs` are the paths that "exist"; `failure` makes every GET fail with that text.
    """

    pods: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    namespaces: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    services: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    kubeconfigs: frozenset[str] = frozenset({"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"})
    failure: str | None = None
    service_failure: str | None = None
    requests: list[str] = field(default_factory=list)
    connections: int = 0
    closed: int = 0

    def add_pod(self, doc: Mapping[str, Any]) -> None:
        meta = doc["metadata"]
        self.pods[(meta["namespace"], meta["name"])] = doc

    def check_kubeconfig(self, path: str) -> None:
        if path not in self.kubeconfigs:
            raise KubeError(f"stat {path}: no such file or directory", path=path)

    def connect(self, kubeconfig: str, env: Mapping[str, str]) -> FakeKube:
        self.check_kubeconfig(kubeconfig)
        self.connections += 1
        return self

    def close(self) -> None:
        self.closed += 1

    def _get(self, path: str) -> None:
        self.requests.append(path)
        if self.failure is not None:
            raise KubeError(self.failure)

    def get_pod(self, namespace: str, name: str) -> Pod:
        self._get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        doc = self.pods.get((namespace, name))
        if doc is None:
            raise KubeError(f'pods "{name}" not found')
        return parse_pod(doc)

    def get_namespace(self, name: str) -> Namespace:
        self._get(f"/api/v1/namespaces/{name}")
        doc = self.namespaces.get(name, {"kind": "Namespace", "metadata": {"name": name}})
        return parse_namespace(doc)

    def get_service(self, namespace: str, name: str) -> Service:
        self._get(f"/api/v1/namespaces/{namespace}/services/{name}")
        if self.service_failure is not None:
            raise KubeError(self.service_failure)
        doc = self.services.get((namespace, name))
        if doc is None:
            raise KubeError(f'services "{name}" not found')
        return parse_service(doc)


@dataclass
class MemoryFirewall:
    """One nat table per (netns path, family), changed the way both backends change theirs:
    every family planned first (core's plan_change), then each applied (core's apply_change).
    """

    tables: dict[tuple[str, Family], Table] = field(default_factory=dict)
    applied: list[Programmed] = field(default_factory=list)
    refusal: str | None = None  # the kernel's message when it refuses every rule set
    native: dict[tuple[str, Family], NativeTable] = field(default_factory=dict)  # nftables
    raw: dict[tuple[str, Family], Table] = field(default_factory=dict)  # raw tables, if set

    def table(self, path: str, family: Family) -> Table:
        return self.tables.get((path, family), empty_table())

    def apply(
        self,
        netns: NetnsRef,
        options: ProxyInitOptions,
        *,
        mode: Mode,
        families: tuple[Family, ...],
        log: Callable[[str], None],
    ) -> None:
        if self.refusal is not None:
            raise FirewallError(self.refusal, netns=netns.path, table="nat")
        if mode is Mode.NFTABLES:  # the engine's: every family planned, then replaced
            tables = [native_table(options, family) for family in families]
            self.native.update({(netns.path, t.family): t for t in tables})
            self.applied.append(Programmed(netns, options, mode, families))
            return
        backend = "legacy" if mode is Mode.LEGACY else "nft"
        plans = [
            (family, plan_change(self.table(netns.path, family), options, family, backend=backend))
            for family in families
        ]
        for family, change in plans:
            key = (netns.path, family)
            self.tables[key] = apply_change(self.table(netns.path, family), change)
            log(f"{family.value} nat in memory: appended {len(change.append)} rules")
        self.applied.append(Programmed(netns, options, mode, families))

    def dump_nat(
        self, netns: NetnsRef, *, mode: Mode, family: Family, log: Callable[[str], None]
    ) -> Table:
        return self.table(netns.path, family)

    def dump_raw(
        self, netns: NetnsRef, *, mode: Mode, family: Family, log: Callable[[str], None]
    ) -> Table | None:
        return self.raw.get((netns.path, family))

    def dump_native(
        self, netns: NetnsRef, *, family: Family, log: Callable[[str], None]
    ) -> NativeTable | None:
        return self.native.get((netns.path, family))


def fake_deps(kube: FakeKube | None = None, firewall: MemoryFirewall | None = None) -> PluginDeps:
    return PluginDeps(kube or FakeKube(), firewall or MemoryFirewall())
