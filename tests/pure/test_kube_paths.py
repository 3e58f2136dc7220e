"""core/kube/paths.py: `segment` is urllib.parse.quote(value, safe="") (which the API client no
longer imports), and the paths the plugin and the repair controller ask for."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicall.core.kube import paths


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.text())
def test_segment_is_urllib_quote_with_nothing_safe(value: str) -> None:
    try:
        expected = quote(value, safe="")
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            paths.segment(value)
        return
    assert paths.segment(value) == expected


@pytest.mark.parametrize(
    "value",
    ["emojivoto", "web-5f86686c4d-abcde", "a/b", "..", "a b", "ä", "%2F", "~x_y.z", "", "\x00"],
)
def test_segment_examples(value: str) -> None:
    assert paths.segment(value) == quote(value, safe="")


def test_paths() -> None:
    assert paths.pod("emojivoto", "web/x") == "/api/v1/namespaces/emojivoto/pods/web%2Fx"
    assert paths.namespace("a b") == "/api/v1/namespaces/a%20b"
    assert paths.service("default", "kubernetes") == (
        "/api/v1/namespaces/default/services/kubernetes"
    )
    assert paths.events("linkerd") == "/apis/events.k8s.io/v1/namespaces/linkerd/events"
