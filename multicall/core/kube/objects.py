"""The few Kubernetes objects the plugin reads, as frozen values parsed from decoded JSON.

Rules of this module: only the fields the decision and the overrides use are kept (names of
containers and init containers, annotations, labels, service ports); a document that is not
the object it claims to be is a `ConfigError`, never a KeyError deep in the policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from multicall.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Pod:
    """The fields of a Pod the plugin reads."""

    name: str
    namespace: str
    containers: tuple[str, ...] = ()
    init_containers: tuple[str, ...] = ()
    annotations: Mapping[str, str] | None = None
    labels: Mapping[str, str] | None = None

    def annotation(self, key: str) -> str:
        return (self.annotations or {}).get(key, "")

    def label(self, key: str) -> str:
        return (self.labels or {}).get(key, "")


@dataclass(frozen=True, slots=True)
class Namespace:
    """The fields of a Namespace the plugin reads."""

    name: str
    annotations: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One port of a Service."""

    port: int
    target_port: int | str | None = None  # an IntOrString; None when unset


@dataclass(frozen=True, slots=True)
class Service:
    """The fields of a Service the plugin reads."""

    name: str
    namespace: str
    ports: tuple[ServicePort, ...] = ()


def _obj(value: object, what: str) -> Mapping[str, object]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what}: expected an object")
    return value


def _str_map(value: object, what: str) -> dict[str, str]:
    return {str(k): v for k, v in _obj(value, what).items() if isinstance(v, str)}


def _names(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError(f"{what}: expected a list")
    return tuple(str(_obj(c, what).get("name", "")) for c in value)


def _meta(doc: Mapping[str, object], kind: str) -> Mapping[str, object]:
    if doc.get("kind") not in (None, kind):
        raise ConfigError(f"expected a {kind}, got {doc.get('kind')!r}")
    return _obj(doc.get("metadata"), f"{kind}.metadata")


def parse_pod(doc: Mapping[str, object]) -> Pod:
    meta = _meta(doc, "Pod")
    spec = _obj(doc.get("spec"), "Pod.spec")
    return Pod(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        containers=_names(spec.get("containers"), "Pod.spec.containers"),
        init_containers=_names(spec.get("initContainers"), "Pod.spec.initContainers"),
        annotations=_str_map(meta.get("annotations"), "Pod.metadata.annotations"),
        labels=_str_map(meta.get("labels"), "Pod.metadata.labels"),
    )


def parse_namespace(doc: Mapping[str, object]) -> Namespace:
    meta = _meta(doc, "Namespace")
    return Namespace(
        name=str(meta.get("name", "")),
        annotations=_str_map(meta.get("annotations"), "Namespace.metadata.annotations"),
    )


def _port(value: object) -> ServicePort:
    item = _obj(value, "Service.spec.ports")
    port = item.get("port")
    target = item.get("targetPort")
    if not isinstance(port, int) or isinstance(port, bool):
        raise ConfigError("Service.spec.ports: port must be an integer")
    if not isinstance(target, int | str) or isinstance(target, bool):
        target = None
    return ServicePort(port, target)


def parse_service(doc: Mapping[str, object]) -> Service:
    meta = _meta(doc, "Service")
    spec = _obj(doc.get("spec"), "Service.spec")
    ports = spec.get("ports") or []
    if not isinstance(ports, list):
        raise ConfigError("Service.spec.ports: expected a list")
    return Service(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        ports=tuple(_port(p) for p in ports),
    )
