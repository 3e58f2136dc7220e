"""API paths: names and namespaces as single path segments (the plugin's client and the
repair controller's ask for the same paths)."""

from __future__ import annotations

import re
from urllib.parse import quote

from multicall.core.go.strconv import go_quote


def segment(value: str) -> str:
    """`value` as one path segment (UTF-8, every byte but ASCII letters, digits and `_.-~`
    as %XX): a `/` in a name cannot reach another resource."""
    return quote(value, safe="")


def pod(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{segment(namespace)}/pods/{segment(name)}"


def namespace(name: str) -> str:
    return f"/api/v1/namespaces/{segment(name)}"


def service(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{segment(namespace)}/services/{segment(name)}"


def events(namespace: str) -> str:
    return f"/apis/events.k8s.io/v1/namespaces/{segment(namespace)}/events"


def node(name: str) -> str:
    return f"/api/v1/nodes/{segment(name)}"


def node_status(name: str) -> str:
    return f"/api/v1/nodes/{segment(name)}/status"


# --- names that cannot name a pod ------------------------------------------------------
# client-go refuses some names before sending anything (rest.Request's Namespace and Name,
# IsValidPathSegmentName); any other name that is not a valid Kubernetes name would reach
# the API, which can hold no such pod and answers NotFound. Both are answered here, with
# those texts, and no request is made (a `..` never reaches a path).

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_MAX = 63
SUBDOMAIN_MAX = 253


def _path_segment_problems(name: str) -> list[str]:
    """apimachinery's IsValidPathSegmentName."""
    if name in (".", ".."):
        return [f"may not be '{name}'"]
    return [f"may not contain '{c}'" for c in ("/", "%") if c in name]


def pod_get_refusal(namespace: str, name: str) -> str | None:
    """Why `GET pods/NAME` in NAMESPACE is not sent: client-go's error, or the API's NotFound
    for a namespace that is not a DNS-1123 label or a name that is not a DNS-1123
    subdomain; None when the request may go."""
    if problems := _path_segment_problems(namespace):
        return f"invalid namespace {go_quote(namespace)}: [{' '.join(problems)}]"
    if not name:
        return "resource name may not be empty"
    if problems := _path_segment_problems(name):
        return f"invalid resource name {go_quote(name)}: [{' '.join(problems)}]"
    label = len(namespace) <= LABEL_MAX and _DNS1123_LABEL.fullmatch(namespace)
    subdomain = len(name) <= SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(name)
    return None if label and subdomain else f"pods {go_quote(name)} not found"
