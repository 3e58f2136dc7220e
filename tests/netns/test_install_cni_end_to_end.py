"""The installer's output drives the real chain: install-cni patches a bridge conflist, then
the real libcni runs bridge + host-local + the linkerd-cni link the installer made, with the
kubeconfig the installer wrote, against a TLS test API inside a throwaway node netns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import cnibox_argv, cnibox_executable
from tests.support.installer_host import NETWORK_CONFIG
from tests.support.kubeapi import TOKEN, KubeApi
from tests.support.libcni import REFERENCE_PLUGINS, Runtime, build_driver, primary_plugin
from tests.support.oracles import save_text
from tests.support.pki import make_pki
from tests.support.pods import MESHED
from tests.support.rig import Rig, run
from tests.support.scenarios import fixture_text

pytestmark = pytest.mark.netns


def test_installed_chain_programs_the_pod(rig: Rig, tmp_path: Path) -> None:
    """ADD through libcni with the installer's conflist, link and kubeconfig gives upstream's
    nat table; after SIGTERM-style undo (--uninstall) the same ADD no longer runs linkerd."""
    driver = build_driver()
    node = rig.node()
    api = KubeApi(make_pki(tmp_path / "pki"))
    api.add_pod(MESHED)
    api.start(node.path)
    net_dir, bin_dir, sa_dir = tmp_path / "net.d", tmp_path / "bin", tmp_path / "sa"
    for d in (net_dir, bin_dir, sa_dir, tmp_path / "cache"):
        d.mkdir()
    (sa_dir / "token").write_text(TOKEN + "\n")
    (sa_dir / "ca.crt").write_bytes(api.pki.ca_cert.read_bytes())
    primary = primary_plugin("bridge", tmp_path / "ipam", "10.89.0.0/24", "cbxbr0")
    conf_path = net_dir / "10-bridge.conflist"
    conf_path.write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "cbxnet", "plugins": [primary]})
    )
    env = {
        "CONTAINER_MOUNT_PREFIX": "/",
        "DEST_CNI_NET_DIR": str(net_dir),
        "DEST_CNI_BIN_DIR": str(bin_dir),
        "SERVICE_ACCOUNT_DIR": str(sa_dir),
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(api.port),
        "CNI_NETWORK_CONFIG": NETWORK_CONFIG.replace('"legacy"', '"nft"'),
        "CNIBOX_EXE": cnibox_executable(),
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    }
    try:
        run(
            [
                "env",
                "-i",
                *(f"{k}={v}" for k, v in env.items()),
                *cnibox_argv("install-cni"),
                "--once",
            ]
        )
        conf = json.loads(conf_path.read_bytes())
        assert [p["type"] for p in conf["plugins"]] == ["bridge", "linkerd-cni"]
        runtime = Runtime(
            driver, node.name, Path(f"{bin_dir}:{REFERENCE_PLUGINS}"), tmp_path / "cache"
        )
        pod = rig.pod().netns
        identity = (MESHED["metadata"]["namespace"], MESHED["metadata"]["name"])
        proc = runtime.run("add", conf, pod.path, container_id="c1", pod=identity)
        assert proc.returncode == 0, proc.stderr
        assert save_text(pod, "iptables-nft-save") == fixture_text("default-nft")
        assert any(r.endswith("/pods/" + identity[1]) for r in api.requests)
        deleted = runtime.run("del", conf, pod.path, container_id="c1", pod=identity)
        assert deleted.returncode == 0, deleted.stderr

        run(
            [
                "env",
                "-i",
                *(f"{k}={v}" for k, v in env.items()),
                *cnibox_argv("install-cni"),
                "--uninstall",
            ]
        )
        undone = json.loads(conf_path.read_bytes())
        assert [p["type"] for p in undone["plugins"]] == ["bridge"]
        assert sorted(p.name for p in bin_dir.iterdir()) == []
    finally:
        api.stop()
