"""API paths: names and namespaces as single path segments (the plugin's client and the
repair controller's ask for the same paths)."""

from __future__ import annotations

from urllib.parse import quote


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
