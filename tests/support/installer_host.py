"""A fake node for install-cni tests: a host root seen through a mount prefix, and a kubelet
service-account directory that rotates its token the way kubelet's atomic writer does."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from multicall.core.installer import conflist
from tests.support import FIXTURES, cnibox_argv

TESTDATA = FIXTURES / "upstream" / "proxy-init" / "internal-cni-testdata"
NETWORK_CONFIG = (TESTDATA / "cni-src.json").read_text()


@dataclass
class Host:
    root: Path

    @property
    def prefix(self) -> Path:
        return self.root / "host"

    @property
    def net_dir(self) -> Path:
        return self.prefix / "etc" / "cni" / "net.d"

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "opt" / "cni" / "bin"

    @property
    def sa_dir(self) -> Path:
        return self.root / "serviceaccount"

    @property
    def binary(self) -> Path:
        built = os.environ.get("CNIBOX")
        return Path(built) if built else self.root / "cnibox-under-test"

    @property
    def kubeconfig(self) -> Path:
        return self.net_dir / "ZZZ-linkerd-cni-kubeconfig"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "CNIBOX")}
        env.update(
            CNIBOX_EXE=str(self.binary),
            CONTAINER_MOUNT_PREFIX=str(self.prefix),
            SERVICE_ACCOUNT_DIR=str(self.sa_dir),
            KUBERNETES_SERVICE_HOST="localhost",
            KUBERNETES_SERVICE_PORT="8080",
            CNI_NETWORK_CONFIG=NETWORK_CONFIG,
            INSTALL_CNI_PID_FILE=str(self.root / "install-cni.pid"),
        )
        env.update(extra)
        return env

    def swap_token(self, token: bytes, generation: int) -> None:
        """kubelet's AtomicWriter: new timestamped dir, `..data_tmp` link renamed to `..data`."""
        stamp = f"..2026_11_30_00_00_{generation:02d}.{generation}"
        new = self.sa_dir / stamp
        new.mkdir()
        (new / "token").write_bytes(token)
        (new / "ca.crt").write_bytes((TESTDATA / "ca.crt").read_bytes())
        old = os.readlink(self.sa_dir / "..data") if (self.sa_dir / "..data").is_symlink() else None
        os.symlink(stamp, self.sa_dir / "..data_tmp")
        os.rename(self.sa_dir / "..data_tmp", self.sa_dir / "..data")
        for name in ("token", "ca.crt"):
            if not (self.sa_dir / name).is_symlink():
                os.symlink(f"..data/{name}", self.sa_dir / name)
        if old:
            for child in (self.sa_dir / old).iterdir():
                child.unlink()
            (self.sa_dir / old).rmdir()

    def run(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cnibox_argv("install-cni"), *args],
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def start(self, *args: str, **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*cnibox_argv("install-cni"), *args],
            env=self.env(**extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def make_host(root: Path, *, token: bytes | None = None) -> Host:
    host = Host(root)
    for d in (host.net_dir, host.bin_dir, host.sa_dir):
        d.mkdir(parents=True)
    if not os.environ.get("CNIBOX"):
        host.binary.write_bytes(b"#!/bin/false\ncnibox stand-in\n")
        host.binary.chmod(0o755)
    host.swap_token(token or (TESTDATA / "auth-token").read_bytes(), 0)
    return host


def put_config(host: Host, name: str, source: str = "10-calico.conflist") -> Path:
    path = host.net_dir / name
    path.write_bytes((TESTDATA / source).read_bytes())
    path.chmod(0o644)
    return path


def linkerd_count(path: Path) -> int:
    doc = json.loads(path.read_bytes())
    return sum(1 for p in doc["plugins"] if p.get("type") == "linkerd-cni")


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under root: mode and content hash (or link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                what = "-> " + os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                what = "dir"
            out[str(path.relative_to(root))] = (stat.S_IMODE(st.st_mode), what)
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def count_linkerd(data: bytes) -> int:
    """How many linkerd entries a conflist holds (ConfigError when it is not one)."""
    return sum(
        1 for p in conflist._plugins_of(conflist.parse_document(data)) if conflist.is_linkerd(p)
    )


def record_file(records_dir: Path, name: str) -> Path:
    """The file in the installer's records dir holding the current record of the config
    `name` (a group file, or a version 2 per-name record): the last group naming it."""
    found = records_dir / name
    for path in sorted(records_dir.iterdir()):
        if path.name.startswith("group-"):
            doc = json.loads(path.read_bytes())
            if any(item["path"].rsplit("/", 1)[-1] == name for item in doc["records"]):
                found = path
    return found
