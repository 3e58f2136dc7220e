"""Which pods get rules, and with which options (docs/upstream-behaviour.md §3, steps 4-7).

Rules of this module:
1. A pod is meshed iff a container or an init container (native sidecar) is named
   `linkerd-proxy` and no init container is named `linkerd-init`. Nothing else is consulted.
2. Overrides apply in upstream's order: skip-outbound-ports replaces, skip-inbound-ports
   appends, skip-subnets replaces, proxy-uid and proxy-gid replace (Go Atoi, or the ADD fails
   with Go's error text); then control-plane pods get the API server's ports (443, 6443 when
   the `kubernetes` service could not be read). Each annotation comes from the pod, or from
   the namespace when the pod's is absent or empty.
3. Upstream GETs the namespace once per missing annotation; here the caller fetches it at most
   once, and only when `needs_namespace` says an annotation must come from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from multicall.core.firewall.model import ProxyInitOptions
from multicall.core.go.strconv import NumError, go_atoi
from multicall.core.kube.objects import Pod, Service
from multicall.errors import CNI_INTERNAL, CniError

PROXY_CONTAINER = "linkerd-proxy"
INIT_CONTAINER = "linkerd-init"
SKIP_OUTBOUND = "config.linkerd.io/skip-outbound-ports"
SKIP_INBOUND = "config.linkerd.io/skip-inbound-ports"
SKIP_SUBNETS = "config.linkerd.io/skip-subnets"
PROXY_UID = "config.linkerd.io/proxy-uid"
PROXY_GID = "config.linkerd.io/proxy-gid"
OVERRIDES = (SKIP_OUTBOUND, SKIP_INBOUND, SKIP_SUBNETS, PROXY_UID, PROXY_GID)
CONTROL_PLANE_LABEL = "linkerd.io/control-plane-component"
API_SERVER_FALLBACK_PORTS = ("443", "6443")


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a pod gets redirect rules, and the line upstream logs for it."""

    meshed: bool
    message: str  # upstream's debug log line for this outcome


def decide(pod: Pod) -> Decision:
    has_init = INIT_CONTAINER in pod.init_containers
    has_proxy = PROXY_CONTAINER in pod.containers or PROXY_CONTAINER in pod.init_containers
    if has_proxy and not has_init:
        return Decision(
            True, f"linkerd-cni: setting up iptables firewall for {pod.namespace}/{pod.name}"
        )
    if has_init:
        return Decision(False, "linkerd-cni: linkerd-init initContainer is present, skipping.")
    return Decision(False, "linkerd-cni: linkerd-proxy is not present, skipping.")


def needs_namespace(pod: Pod) -> bool:
    """Whether any override annotation has to be looked up on the namespace."""
    return any(pod.annotation(key) == "" for key in OVERRIDES)


def needs_service(pod: Pod) -> bool:
    """Whether the `default/kubernetes` service's ports are added (control-plane pods)."""
    return pod.label(CONTROL_PLANE_LABEL) != ""


def annotation(pod: Pod, namespace_annotations: Mapping[str, str] | None, key: str) -> str:
    """getAnnotationOverride: the pod's value, else the namespace's, else ""."""
    value = pod.annotation(key)
    if value:
        return value
    return (namespace_annotations or {}).get(key, "")


def _owner_id(value: str, what: str) -> int:
    try:
        return go_atoi(value)
    except NumError as exc:
        # upstream logs "could not parse {what} to integer" and returns Go's bare error text
        error = CniError(CNI_INTERNAL, str(exc))
        error.hint = f"could not parse {what} to integer"
        raise error from None


def service_ports(service: Service | None) -> tuple[str, ...]:
    """getAPIServerPorts: each port, and each integer targetPort; the fallback on error."""
    if service is None:
        return API_SERVER_FALLBACK_PORTS
    ports: list[str] = []
    for port in service.ports:
        ports.append(str(port.port))
        if isinstance(port.target_port, int):
            ports.append(str(port.target_port))
    return tuple(ports)


def effective_options(
    base: ProxyInitOptions,
    pod: Pod,
    namespace_annotations: Mapping[str, str] | None,
    service: Service | None = None,
) -> ProxyInitOptions:
    """The options after the annotation overrides and the control-plane additions.

    `namespace_annotations` is needed when `needs_namespace(pod)`; `service` is the
    `default/kubernetes` service, None when it could not be read (upstream then skips
    443 and 6443); it is only consulted when `needs_service(pod)`.
    """
    options = base
    value = annotation(pod, namespace_annotations, SKIP_OUTBOUND)
    if value:
        options = replace(options, outbound_ports_to_ignore=tuple(value.split(",")))
    value = annotation(pod, namespace_annotations, SKIP_INBOUND)
    if value:
        appended = options.inbound_ports_to_ignore + tuple(value.split(","))
        options = replace(options, inbound_ports_to_ignore=appended)
    value = annotation(pod, namespace_annotations, SKIP_SUBNETS)
    if value:
        options = replace(options, subnets_to_ignore=tuple(value.split(",")))
    value = annotation(pod, namespace_annotations, PROXY_UID)
    if value:
        options = replace(options, proxy_uid=_owner_id(value, "ProxyUID"))
    value = annotation(pod, namespace_annotations, PROXY_GID)
    if value:
        options = replace(options, proxy_gid=_owner_id(value, "ProxyGID"))
    if needs_service(pod):
        extra = service_ports(service)
        options = replace(
            options, outbound_ports_to_ignore=options.outbound_ports_to_ignore + extra
        )
    return options
