"""iptables-verify --namespace NS --pod NAME: what ADD reads, fetched from the TLS test API
server on loopback (the PKI needs the openssl CLI)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.support.cnibox import run_applet_inproc
from tests.support.kubeapi import KubeApi, service_doc
from tests.support.pki import Pki
from tests.support.scenarios import SCENARIOS, netconf

LINKERD = SCENARIOS


def write_json(tmp_path: Path, name: str, doc: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def run_inproc(args: list[str]) -> tuple[int, str, str]:
    return run_applet_inproc("iptables-verify", args)


@pytest.fixture
def api(pki: Pki) -> Iterator[KubeApi]:
    server = KubeApi(pki)
    server.start(None)  # the machine's loopback: only this client talks to it
    try:
        yield server
    finally:
        server.stop()


class TestFetch:
    POD: ClassVar[dict[str, Any]] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": "web-1", "namespace": "shop"},
        "spec": {"containers": [{"name": "web"}, {"name": "linkerd-proxy"}]},
    }

    def config(self, tmp_path: Path, api: KubeApi, name: str, **linkerd: object) -> str:
        doc = netconf(name, **linkerd)
        doc["kubernetes"] = {"kubeconfig": str(api.kubeconfig(tmp_path / "kc"))}
        return write_json(tmp_path, "conf.json", doc)

    def test_meshed_pod_and_namespace_from_the_api(self, tmp_path: Path, api: KubeApi) -> None:
        """--namespace/--pod GET the pod and its namespace (for annotations), as ADD does."""
        api.add_pod(self.POD)
        api.add_namespace("shop", {"config.linkerd.io/skip-outbound-ports": "443,6443"})
        config = self.config(tmp_path, api, "default-nft")
        save = str(LINKERD / "control-plane-nft.iptables-save.txt")
        rc, out, err = run_inproc(
            ["--config", config, "--namespace", "shop", "--pod", "web-1", "--input", save]
        )
        assert rc == 0, out + err
        assert api.requests == ["/api/v1/namespaces/shop/pods/web-1", "/api/v1/namespaces/shop"]

    def test_control_plane_pod_reads_the_kubernetes_service(
        self, tmp_path: Path, api: KubeApi
    ) -> None:
        """A control-plane pod adds the API service's port and targetPort."""
        pod = json.loads(json.dumps(self.POD))
        pod["metadata"]["labels"] = {"linkerd.io/control-plane-component": "destination"}
        api.add_pod(pod)
        api.services[("default", "kubernetes")] = service_doc([{"port": 443, "targetPort": 6443}])
        config = self.config(tmp_path, api, "default-nft")
        save = str(LINKERD / "control-plane-nft.iptables-save.txt")
        args = ["--config", config, "--namespace", "shop", "--pod", "web-1", "--input", save]
        rc, out, err = run_inproc(args)
        assert rc == 0, out + err
        assert "/api/v1/namespaces/default/services/kubernetes" in api.requests

    def test_api_errors_exit_2(self, tmp_path: Path, api: KubeApi) -> None:
        """A pod the API does not have is an input error, with the API's message."""
        config = self.config(tmp_path, api, "default-nft")
        save = str(LINKERD / "default-nft.iptables-save.txt")
        args = ["--config", config, "--namespace", "shop", "--pod", "ghost", "--input", save]
        rc, _, err = run_inproc(args)
        assert rc == 2
        assert 'pods "ghost" not found' in err

    def test_needs_a_kubeconfig(self, tmp_path: Path) -> None:
        """Without --kubeconfig and without kubernetes.kubeconfig in the config: exit 2."""
        config = write_json(tmp_path, "conf.json", netconf("default-nft"))
        save = str(LINKERD / "default-nft.iptables-save.txt")
        args = ["--config", config, "--namespace", "shop", "--pod", "web-1", "--input", save]
        rc, _, err = run_inproc(args)
        assert rc == 2
        assert "--namespace needs --kubeconfig" in err
