"""The real libcni as the container runtime: a Go driver (driver.go) built once per source hash
into build/out/, a plugin directory of symlinks (linkerd-cni -> cnibox, Debian's reference
plugins), conflists with a primary plugin first and linkerd-cni chained last.

The driver always runs inside the rig's node netns (`ip netns exec NODE driver ...`): libcni
calls plugins in its own netns, and bridge/ptp create their host side there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import REPO, cnibox_executable, require_tool

SOURCE = Path(__file__).with_name("driver.go")
# A TCP listener/connector run inside pod netns: proves where the rules send traffic.
TCP_PROBE = Path(__file__).with_name("tcp_probe.py")
REFERENCE_PLUGINS = Path("/usr/lib/cni")
GOCODE = "/usr/share/gocode"


def build_driver() -> Path:
    """Build driver.go against Debian's libcni sources (GOPATH mode); cached by source hash."""
    return build_go(SOURCE, "libcni-driver")


def build_go(source: Path, name: str) -> Path:
    """`go build` one main package in GOPATH mode (no network), cached in build/out/."""
    go = require_tool("go")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    out = REPO / "build" / "out" / f"{name}-{digest}"
    if out.exists():
        return out
    gopath = REPO / "build" / "out" / f"{name}-gopath-{digest}"
    src = gopath / "src" / name
    src.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, src / "main.go")
    env = dict(os.environ, GO111MODULE="off", GOPATH=f"{gopath}:{GOCODE}",
               GOCACHE=str(gopath / "cache"), GOFLAGS="")  # fmt: skip
    tmp = out.with_suffix(f".tmp{os.getpid()}")  # concurrent sessions never share a file
    subprocess.run([go, "build", "-o", str(tmp), "."], cwd=src, env=env, check=True,
                   capture_output=True)  # fmt: skip
    tmp.rename(out)
    return out


def plugin_dir(directory: Path, cnibox: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "linkerd-cni").symlink_to(cnibox or cnibox_executable())
    for name in ("bridge", "ptp", "host-local", "loopback"):
        (directory / name).symlink_to(REFERENCE_PLUGINS / name)
    return directory


CHART_LINKERD = {
    "incoming-proxy-port": 4143,
    "outgoing-proxy-port": 4140,
    "proxy-uid": 2102,
    "ports-to-redirect": [],
    "inbound-ports-to-ignore": ["4191", "4190"],
    "simulate": False,
    "use-wait-flag": False,
    "iptables-mode": "nft",
    "ipv6": False,
}


def primary_plugin(kind: str, data_dir: Path, subnet: str, bridge: str) -> dict[str, Any]:
    ipam = {"type": "host-local", "subnet": subnet, "dataDir": str(data_dir),
            "routes": [{"dst": "0.0.0.0/0"}]}  # fmt: skip
    if kind == "bridge":
        return {"type": "bridge", "bridge": bridge, "isGateway": True, "ipMasq": False,
                "ipam": ipam}  # fmt: skip
    return {"type": "ptp", "ipMasq": False, "ipam": ipam}


def conflist(
    primary: dict[str, Any],
    kubeconfig: Path | str,
    *,
    version: str = "1.0.0",
    linkerd: dict[str, Any] | None = None,
    log_level: str = "debug",
) -> dict[str, Any]:
    """A network list as upstream's installer leaves it: primary first, linkerd-cni last."""
    return {
        "cniVersion": version,
        "name": "cbxnet",
        "plugins": [
            primary,
            {
                "name": "linkerd-cni",
                "type": "linkerd-cni",
                "log_level": log_level,
                "kubernetes": {"kubeconfig": str(kubeconfig)},
                "linkerd": {**CHART_LINKERD, **(linkerd or {})},
            },
        ],
    }


@dataclass
class Runtime:
    """libcni, run inside the node netns."""

    driver: Path
    node: str  # netns name
    plugins: Path
    cache: Path

    def run(
        self,
        command: str,
        conf: dict[str, Any],
        netns: str,
        *,
        container_id: str,
        pod: tuple[str, str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
        pod_uid: str = "0c9b6f0e-uid",
    ) -> subprocess.CompletedProcess[str]:
        path = self.cache / f"{container_id}.conflist"
        path.write_text(json.dumps(conf))
        args = "IgnoreUnknown=1"
        if pod is not None:
            args += f";K8S_POD_NAMESPACE={pod[0]};K8S_POD_NAME={pod[1]}"
            args += f";K8S_POD_INFRA_CONTAINER_ID={container_id};K8S_POD_UID={pod_uid}"
        full_env = dict(os.environ, DRIVER_PLUGIN_DIR=str(self.plugins), DRIVER_NETNS=netns,
                        DRIVER_CONTAINERID=container_id, DRIVER_CACHE_DIR=str(self.cache),
                        CNI_ARGS=args, **(env or {}))  # fmt: skip
        return subprocess.run(
            ["ip", "netns", "exec", self.node, str(self.driver), command, str(path)],
            env=full_env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
