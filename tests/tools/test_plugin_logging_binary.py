"""The plugin's failure log line end to end: `linkerd-cni` as a runtime runs it (the built
file under `make test-binary`), against the TLS test API server on loopback, refusing the
token or not listening at all. The API call fails before any network namespace is used, so
no root is needed (docs/linkerd-cni.md "Logs"; the PKI needs the openssl CLI).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import cnibox_argv
from tests.support.kubeapi import TOKEN, KubeApi, refused_port
from tests.support.logfmt import errors
from tests.support.pki import Pki
from tests.support.pods import golden_pod

POD = golden_pod("_no_init_container")
NAME, NAMESPACE = POD["metadata"]["name"], POD["metadata"]["namespace"]


@pytest.fixture
def api(pki: Pki) -> Iterator[KubeApi]:
    server = KubeApi(pki)
    server.add_pod(POD)
    server.start(None)
    try:
        yield server
    finally:
        server.stop()


def add(kubeconfig: Path, log_file: Path) -> subprocess.CompletedProcess[str]:
    config = {
        "cniVersion": "1.0.0",
        "name": "k8s-pod-network",
        "type": "linkerd-cni",
        "log_file": str(log_file),
        "kubernetes": {"kubeconfig": str(kubeconfig)},
        "linkerd": {"incoming-proxy-port": 4143, "outgoing-proxy-port": 4140},
    }
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c0ffee",
        "CNI_NETNS": "/var/run/netns/cbx-never-opened",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={NAME}",
        "CNIBOX_KUBE_TIMEOUT": "3",
    }
    return subprocess.run(
        cnibox_argv("linkerd-cni"),
        input=json.dumps(config),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("case", ["unauthorized", "refused"])
def test_failed_add_is_one_error_line_on_stderr_and_in_the_log_file(
    api: KubeApi, tmp_path: Path, case: str
) -> None:
    """Exactly one error line with ContainerID, Namespace and Pod, on stderr and in the
    config's log_file; the CNI error JSON on stdout carries the same message."""
    port = refused_port(None) if case == "refused" else None
    token = "wrong" if case == "unauthorized" else TOKEN
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig", port=port, token=token)
    log_file = tmp_path / "linkerd-cni.log"
    proc = add(kubeconfig, log_file)
    assert proc.returncode == 1, proc.stderr
    msg = json.loads(proc.stdout)["msg"]
    expected = "Unauthorized" if case == "unauthorized" else "connection refused"
    assert expected in msg
    for text in (proc.stderr, log_file.read_text()):
        (line,) = errors(text)
        assert (line["ContainerID"], line["Namespace"], line["Pod"]) == ("c0ffee", NAMESPACE, NAME)
        assert line["msg"] == (
            f"linkerd-cni: ADD failed while reading pod {NAMESPACE}/{NAME} "
            f"from the Kubernetes API: {msg}"
        )
    assert proc.stderr == log_file.read_text()
