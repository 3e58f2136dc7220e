"""core/kube/paths.py: names as single path segments, and the paths the plugin and the repair
controller ask for."""

from __future__ import annotations

import pytest

from multicall.core.kube import paths


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("emojivoto", "emojivoto"),
        ("web-5f86686c4d-abcde", "web-5f86686c4d-abcde"),
        ("a/b", "a%2Fb"),
        ("..", ".."),
        ("a b", "a%20b"),
        ("ä", "%C3%A4"),
        ("%2F", "%252F"),
        ("~x_y.z", "~x_y.z"),
        ("", ""),
        ("\x00", "%00"),
        ("?#&=", "%3F%23%26%3D"),
    ],
)
def test_segment_examples(value: str, expected: str) -> None:
    assert paths.segment(value) == expected


def test_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(UnicodeEncodeError):
        paths.segment("\udc80")


def test_paths() -> None:
    assert paths.pod("emojivoto", "web/x") == "/api/v1/namespaces/emojivoto/pods/web%2Fx"
    assert paths.namespace("a b") == "/api/v1/namespaces/a%20b"
    assert paths.service("default", "kubernetes") == (
        "/api/v1/namespaces/default/services/kubernetes"
    )
    assert paths.events("linkerd") == "/apis/events.k8s.io/v1/namespaces/linkerd/events"
