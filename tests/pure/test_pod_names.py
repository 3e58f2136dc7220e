"""Names that cannot name a pod never reach an API path (issue 29 class 4).

client-go refuses `.`, `..`, and names with `/` or `%` before sending (its texts); any other
name that is not a valid Kubernetes name gets the API's NotFound, without a request.
"""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicall.core.kube.paths import pod_get_refusal
from multicall.plugin.run import PluginError, PluginResult
from tests.pure.test_plugin_seam import Node, env, error
from tests.support.fuzzing import fuzz
from tests.support.pods import MESHED, NS


def is_label(s: str, limit: int = 63) -> bool:
    """RFC 1123 label as Kubernetes documents it: at most 63 characters, lowercase
    alphanumerics or '-', starting and ending with an alphanumeric."""
    alnum = set(string.ascii_lowercase + string.digits)
    return 0 < len(s) <= limit and s[0] in alnum and s[-1] in alnum and set(s) <= alnum | {"-"}


def is_subdomain(s: str) -> bool:
    """RFC 1123 subdomain: at most 253 characters, dot-separated labels (apimachinery's
    IsDNS1123Subdomain bounds only the whole, not each label)."""
    return 0 < len(s) <= 253 and all(is_label(part, 253) for part in s.split("."))


def run_add(namespace: str, name: str) -> tuple[PluginResult, Node]:
    node = Node()
    pod: dict[str, Any] = {"metadata": {"namespace": namespace, "name": name}}
    environment = env("ADD", pod=pod)
    return node.run("ADD", env=environment), node


@pytest.mark.parametrize(
    ("namespace", "name", "message"),
    [
        ("..", "..", "invalid namespace \"..\": [may not be '..']"),
        (NS, "..", "invalid resource name \"..\": [may not be '..']"),
        (".", "web", "invalid namespace \".\": [may not be '.']"),
        (NS, "a%2fb", "invalid resource name \"a%2fb\": [may not contain '%']"),
        ("Emojivoto", "web", 'pods "web" not found'),
        (NS, "Web_1", 'pods "Web_1" not found'),
        (NS, "a" * 254, f'pods "{"a" * 254}" not found'),
        ("a" * 64, "web", 'pods "web" not found'),
    ],
)
def test_refused_before_any_request(namespace: str, name: str, message: str) -> None:
    """`..` used to make `GET /api/v1/namespaces/../pods/..`; now nothing is sent."""
    result, node = run_add(namespace, name)
    assert result == PluginResult(error(999, message), 1, PluginError(999, message))
    assert node.kube.requests == []
    assert node.firewall.applied == []


def test_a_slash_in_cni_args_is_refused() -> None:
    """`/` cannot come through a pod's metadata, but CNI_ARGS is a plain string."""
    node = Node()
    environment = env("ADD", pod=None)
    environment["CNI_ARGS"] += f";K8S_POD_NAMESPACE={NS};K8S_POD_NAME=x/../../y"
    result = node.run("ADD", env=environment)
    assert json.loads(result.stdout)["msg"] == (
        "invalid resource name \"x/../../y\": [may not contain '/']"
    )
    assert node.kube.requests == []


def test_a_valid_name_is_fetched() -> None:
    """The longest valid names are still asked for (and not found by the fake API)."""
    result, node = run_add("a" * 63, "b" * 253)
    assert json.loads(result.stdout)["msg"] == f'pods "{"b" * 253}" not found'
    assert node.kube.requests == [f"/api/v1/namespaces/{'a' * 63}/pods/{'b' * 253}"]


NAMEISH = st.text(st.sampled_from("ab9-._/%Z é"), min_size=1, max_size=12) | st.sampled_from(
    [".", "..", "a" * 63, "a" * 64, "a." * 126 + "b", "a." * 127 + "b"]
)


@fuzz(300)
@given(NAMEISH, NAMEISH)
def test_refusal_follows_kubernetes_name_rules(namespace: str, name: str) -> None:
    """Sent exactly when the namespace is a DNS-1123 label and the name a subdomain."""
    assert (pod_get_refusal(namespace, name) is None) == (
        is_label(namespace) and is_subdomain(name)
    )


def test_client_go_order() -> None:
    """The namespace is judged first; both `/` and `%` are listed, as client-go lists them."""
    assert (
        pod_get_refusal("a/%", "..")
        == "invalid namespace \"a/%\": [may not contain '/' may not contain '%']"
    )
    assert MESHED["metadata"]["namespace"] == NS
