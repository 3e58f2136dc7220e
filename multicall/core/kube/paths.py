"""API paths: names and namespaces as single path segments (the plugin's client and the
repair controller's ask for the same paths).

`segment` is `urllib.parse.quote(value, safe="")` (UTF-8, every byte but ASCII letters,
digits and `_.-~` as %XX); tests/pure/test_kube_paths.py holds it to urllib's output.
"""

from __future__ import annotations

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def segment(value: str) -> str:
    """`value` as one path segment: a `/` in a name cannot reach another resource."""
    data = value.encode("utf-8", "strict")
    if all(byte in _UNRESERVED for byte in data):
        return value
    return "".join(chr(byte) if byte in _UNRESERVED else f"%{byte:02X}" for byte in data)


def pod(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{segment(namespace)}/pods/{segment(name)}"


def namespace(name: str) -> str:
    return f"/api/v1/namespaces/{segment(name)}"


def service(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{segment(namespace)}/services/{segment(name)}"


def events(namespace: str) -> str:
    return f"/apis/events.k8s.io/v1/namespaces/{segment(namespace)}/events"
