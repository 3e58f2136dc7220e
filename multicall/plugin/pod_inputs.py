"""What ADD and CHECK read from the Kubernetes API for one pod: the pod, its namespace's
annotations when an override is not on the pod, and the `default/kubernetes` service for
control-plane pods (docs/upstream-behaviour.md §3 steps 3-7)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from multicall.core.kube.objects import Pod, Service
from multicall.core.kube.paths import pod_get_refusal
from multicall.core.kube.pod_policy import decide, needs_namespace, needs_service
from multicall.errors import KubeError

if TYPE_CHECKING:
    from multicall.plugin.ports import PodApi


@dataclass(frozen=True, slots=True)
class PodInputs:
    """What ADD reads from the API for one pod."""

    pod: Pod
    namespace_annotations: Mapping[str, str] | None
    service: Service | None


def _ignore(_exc: KubeError) -> None:
    """The default for a failed service GET: upstream falls back to 443,6443 silently."""


def read_pod_inputs(
    api: PodApi,
    namespace: str,
    name: str,
    *,
    namespace_annotations: Mapping[str, str] | None = None,
    service: Service | None = None,
    on_service_error: Callable[[KubeError], None] = _ignore,
) -> PodInputs:
    """The pod, then for a meshed pod its namespace (only when an override annotation is not
    on the pod) and the `default/kubernetes` service (only for control-plane pods): at most
    three GETs. Given namespace annotations or service are used instead of a GET. A name
    that cannot name a pod is refused before any request (core/kube/paths.py)."""
    if (refusal := pod_get_refusal(namespace, name)) is not None:
        raise KubeError(refusal)
    pod = api.get_pod(namespace, name)
    if not decide(pod).meshed:
        return PodInputs(pod, namespace_annotations, service)
    if namespace_annotations is None and needs_namespace(pod):
        namespace_annotations = api.get_namespace(pod.namespace or namespace).annotations
    if service is None and needs_service(pod):
        try:
            service = api.get_service("default", "kubernetes")
        except KubeError as exc:
            on_service_error(exc)  # effective_options then adds upstream's 443,6443
    return PodInputs(pod, namespace_annotations, service)
