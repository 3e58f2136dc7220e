"""The empty root of the artifact suites: a read-only chroot holding only the single file, one
symlink per applet, /tmp, /proc and the netns directory (tests/binary/test_empty_root.py for
x86_64, tests/arm64/test_qemu_user.py, which enters the same root through qemu-user).

The binary runs in the chroot only through `root.run([...])` (or `root.started`); a subclass
changes how the root is entered by overriding `script`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from multicall.applets import all_names
from tests.support.artifact import started
from tests.support.installer_host import NETWORK_CONFIG, linkerd_count, make_host, put_config
from tests.support.rig import NETNS_DIR

TIMEOUT = 120

ENVIRONMENTS: dict[str, dict[str, str]] = {
    "env-i": {},
    "c-utf8": {"LANG": "C.UTF-8"},
    "bogus-locale": {"LANG": "de_DE.UTF-8", "LC_ALL": "xx_YY.UTF-8"},
    "inherited": {k: v for k, v in os.environ.items() if k != "CNIBOX_CACHE"},
}


@dataclass
class EmptyRoot:
    """A chroot directory holding only /cnibox, one symlink per applet name, /tmp, /proc."""

    path: Path
    tmp: Path  # bind-mounted on <root>/tmp, so the unpacked copy survives between runs
    writable_tmp: bool = True

    def script(self, argv: list[str]) -> list[str]:
        root = str(self.path)
        quoted = " ".join(f"'{a}'" for a in argv)
        ro = "ro," if not self.writable_tmp else ""
        return [
            shutil.which("unshare") or "unshare",
            "-m",
            "--propagation",
            "private",
            shutil.which("sh") or "/bin/sh",
            "-ec",
            f"mount --bind '{root}' '{root}'\n"
            f"mount -t proc proc '{root}/proc'\n"
            f"mount --rbind {NETNS_DIR} '{root}{NETNS_DIR}'\n"
            f"mount --bind -o {ro}nosuid '{self.tmp}' '{root}/tmp'\n"
            f"mount -o remount,bind,ro '{root}'\n"
            f"exec {shutil.which('chroot') or '/usr/sbin/chroot'} '{root}' {quoted}",
        ]

    def run(
        self, argv: list[str], env: Mapping[str, str], input_: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.script(argv),
            env=dict(env),
            input=input_,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )

    def started(
        self, argv: list[str], env: Mapping[str, str]
    ) -> AbstractContextManager[subprocess.Popen[str]]:
        return started(self.script(argv), env)


def make_root(base: Path, artifact: Path) -> EmptyRoot:
    """The root under `base`, with a copy of `artifact` as /cnibox."""
    root = base / "root"
    for sub in ("tmp", "proc", NETNS_DIR.lstrip("/")):
        (root / sub).mkdir(parents=True)
    shutil.copy2(artifact, root / "cnibox")
    for name in all_names():
        (root / name).symlink_to("cnibox")
    tmp = base / "root-tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    return EmptyRoot(root, tmp)


def install_cni_once(root: EmptyRoot, env: Mapping[str, str]) -> None:
    """--once copies the binary it runs from (CNIBOX_EXE: the single file), links linkerd-cni,
    writes the kubeconfig and patches the network config, all inside the root."""
    node = make_host(root.tmp / "node")
    put_config(node, "10-calico.conflist")
    inside = "/tmp/node"
    installer_env = {
        **env,
        "CONTAINER_MOUNT_PREFIX": f"{inside}/host",
        "SERVICE_ACCOUNT_DIR": f"{inside}/serviceaccount",
        "KUBERNETES_SERVICE_HOST": "localhost",
        "KUBERNETES_SERVICE_PORT": "8080",
        "CNI_NETWORK_CONFIG": NETWORK_CONFIG,
        "INSTALL_CNI_PID_FILE": f"{inside}/install-cni.pid",
    }
    result = root.run(["/install-cni", "--once"], installer_env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (node.bin_dir / "cnibox").read_bytes() == (root.path / "cnibox").read_bytes()
    assert os.readlink(node.bin_dir / "linkerd-cni") == "cnibox"
    assert linkerd_count(node.net_dir / "10-calico.conflist") == 1
    assert node.kubeconfig.is_file()
