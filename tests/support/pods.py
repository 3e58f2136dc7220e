"""Pods as the API returns them, built from upstream's injected emojivoto goldens: meshed with
the CNI (linkerd-network-validator + linkerd-proxy), with linkerd-init, and not injected."""

from __future__ import annotations

from typing import Any

from tests.support.kubeapi import pods_from_golden
from tests.support.paths import FIXTURES

GOLDENS = FIXTURES / "upstream" / "linkerd2" / "inject-goldens"
NS = "emojivoto"


def golden_pod(golden: str, index: int = 0) -> dict[str, Any]:
    return pods_from_golden(GOLDENS / f"inject_emojivoto_deployment{golden}.golden.yml")[index]


def renamed(pod: dict[str, Any], name: str, **annotations: str) -> dict[str, Any]:
    meta = {**pod["metadata"], "name": name}
    if annotations:
        meta["annotations"] = {**meta.get("annotations", {}), **annotations}
    return {**pod, "metadata": meta}


# linkerd-network-validator + linkerd-proxy: what the injector makes with CNI enabled
MESHED = renamed(golden_pod("_no_init_container"), "web-cni-7d4f8c9b5-x2x4q")
# linkerd-init + linkerd-proxy: the rules are linkerd-init's business
WITH_INIT = renamed(golden_pod(""), "web-init-7d4f8c9b5-x2x4q")
NOT_INJECTED = renamed(golden_pod("_overridden_noinject"), "web-plain-7d4f8c9b5-x2x4q")
