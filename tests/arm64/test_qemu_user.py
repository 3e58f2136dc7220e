"""dist/cnibox-arm64 in an empty root under qemu-user: the empty-root suite's non-firewall parts.

qemu-user runs every aarch64 program of the root, the launcher, the bundled glibc loader and
the programs netns-exec starts, through a binfmt_misc rule that exists only inside a user
namespace of the test's own (Linux >= 6.7 gives each user namespace its own binfmt_misc):
nothing is registered on the machine. Explicit `qemu-aarch64-static FILE` is not enough: the
launcher execs the loader, and qemu-user hands execve to the host kernel.

The root is the x86_64 suite's (tests/support/empty_root.py: only the binary, its applet
links, /tmp, /proc, read-only). What differs from that suite:
- the throwaway netns is created inside the user namespace (a netns of the machine's own user
  namespace cannot be entered from a child one), bind-mounted into the root, and gone with it;
- no firewall: qemu 7.2 refuses NETLINK_NETFILTER sockets and the iptables getsockopts, so
  the plugin ADD and `iptables-verify --netns` run in the full-system VM (tests/arm64/test_vm.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from multicall import __version__
from multicall.applets import all_names
from tests.arm64.artifact import EM_AARCH64, PT_DYNAMIC, PT_INTERP, arm64_artifact, elf_facts
from tests.support import require_root, require_tool
from tests.support.empty_root import ENVIRONMENTS, EmptyRoot, install_cni_once, make_root
from tests.support.scenarios import SCENARIOS, netconf, scenario_family

pytestmark = [pytest.mark.binary, pytest.mark.netns]
# Generous: a first start unpacks ~40 MB under emulation on a shared 2-core machine.
TIMEOUT = 300
QEMU = "qemu-aarch64-static"
# Debian's qemu-user-static rule for aarch64 ELF executables (magic and mask of the ELF
# header: 64-bit, little-endian, ET_EXEC/ET_DYN, EM_AARCH64), with F: the interpreter is opened
# now, so it need not exist inside the chroot.
BINFMT_MAGIC = r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
BINFMT_MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
NETNS_IN_ROOT = "/var/run/netns/cbx-arm64"


@dataclass
class QemuRoot(EmptyRoot):
    """The empty root, entered through a user namespace whose binfmt_misc runs qemu-user;
    with `with_netns`, a fresh netns is made in that user namespace and bind-mounted at
    NETNS_IN_ROOT, and the first output line is `netns <inode>`. The x86_64 suite's `run` and
    `started` (and its cases that use only them) work unchanged."""

    base: Path = Path()
    qemu: str = QEMU
    with_netns: bool = False

    def script(self, argv: list[str]) -> list[str]:
        root, base = str(self.path), str(self.base)
        rule = self.base / "binfmt.rule"
        rule.write_text(f":cnibox-aarch64:M::{BINFMT_MAGIC}:{BINFMT_MASK}:{self.qemu}:F\n")
        (self.base / "binfmt").mkdir(exist_ok=True)
        quoted = " ".join(f"'{a}'" for a in argv)
        make_netns = (
            f"touch '{base}/netns' '{root}{NETNS_IN_ROOT}'\n"
            f"unshare --net='{base}/netns' true\n"
            f"echo \"netns $(stat -L -c %i '{base}/netns')\"\n"
            f"mount --bind '{base}/netns' '{root}{NETNS_IN_ROOT}'\n"
            if self.with_netns
            else ""
        )
        return [
            shutil.which("unshare") or "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
            shutil.which("sh") or "/bin/sh",
            "-ec",
            f"mount -t binfmt_misc binfmt_misc '{base}/binfmt'\n"
            f"cat '{rule}' > '{base}/binfmt/register'\n"
            f"mount --bind '{root}' '{root}'\n"
            f"{make_netns}"
            # A user namespace may not mount a new proc without its own pid namespace.
            f"mount --rbind /proc '{root}/proc'\n"
            f"mount --bind -o nosuid '{self.tmp}' '{root}/tmp'\n"
            f"mount -o remount,bind,ro '{root}'\n"
            f"exec {shutil.which('chroot') or '/usr/sbin/chroot'} '{root}' {quoted}",
        ]


@pytest.fixture(scope="module")
def artifact() -> Path:
    return arm64_artifact()


@pytest.fixture
def qroot(artifact: Path, tmp_path: Path) -> QemuRoot:
    require_root()
    for tool in ("unshare", "chroot", "mount", "stat"):
        require_tool(tool)
    empty = make_root(tmp_path, artifact)
    return QemuRoot(empty.path, empty.tmp, base=tmp_path, qemu=require_tool(QEMU))


def test_artifact_is_a_static_aarch64_executable(artifact: Path) -> None:
    """The launcher at the head of the file: ELF64, EM_AARCH64, no interpreter, no dynamic
    section (it must start on a node with no libc at all)."""
    elf_class, machine, segments = elf_facts(artifact)
    assert (elf_class, machine) == (2, EM_AARCH64)
    assert PT_INTERP not in segments
    assert PT_DYNAMIC not in segments


@pytest.mark.parametrize("env_name", ["env-i", "bogus-locale"])
def test_list_and_version(qroot: QemuRoot, env_name: str) -> None:
    """--list and --version from the read-only root, unpacking into its /tmp."""
    env = ENVIRONMENTS[env_name]
    listed = qroot.run(["/cnibox", "--list"], env)
    assert (listed.returncode, listed.stderr) == (0, "")
    assert listed.stdout.split() == all_names()
    assert [p.name for p in qroot.tmp.iterdir()] == ["cnibox"], "unpacked into /tmp/cnibox"
    version = qroot.run(["/cnibox", "--version"], env)
    assert version.returncode == 0, version.stderr
    assert __version__ in version.stdout


def test_unpacked_copy_is_aarch64_only(qroot: QemuRoot) -> None:
    """What the launcher unpacked holds the aarch64 loader and no ELF for another machine."""
    assert qroot.run(["/cnibox", "--list"], {}).returncode == 0
    (unpacked,) = (qroot.tmp / "cnibox").iterdir()
    assert (unpacked / "ld-linux-aarch64.so.1").is_file()
    assert not (unpacked / "ld-linux-x86-64.so.2").exists()
    machines = set()
    for path in unpacked.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.read_bytes()[:4] == b"\x7fELF":
            machines.add(elf_facts(path)[1])
    assert machines == {EM_AARCH64}


@pytest.mark.parametrize("name", ["netns-exec", "nsenter"])
def test_netns_exec_enters_a_netns(qroot: QemuRoot, name: str) -> None:
    """netns-exec (and its nsenter name) enters the throwaway netns: the aarch64 program it
    runs lives in that netns, not in ours."""
    qroot.with_netns = True
    argv = [f"/{name}", f"--net={NETNS_IN_ROOT}", "/cnibox", "selftest", "signal"]
    with qroot.started(argv, {}) as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[:1] == ["netns"], f"no netns made: {first}"
        line = proc.stdout.readline()
        assert line.startswith("ready "), f"{name}: no output"
        pid = int(line.split()[1])
        inside = os.stat(f"/proc/{pid}/ns/net").st_ino
        assert inside == int(first[1])
        assert inside != os.stat("/proc/self/ns/net").st_ino
        os.kill(pid, signal.SIGTERM)
        assert proc.wait(timeout=TIMEOUT) == 42


def test_install_cni_once(qroot: QemuRoot) -> None:
    """The installer's --once run (the x86_64 suite's case): copies the single file it runs
    from, links linkerd-cni, writes the kubeconfig, patches the network config."""
    install_cni_once(qroot, {})


@pytest.mark.parametrize("scenario", ["default-legacy", "default-ipv6-nft"])
def test_iptables_verify_input(qroot: QemuRoot, scenario: str) -> None:
    """iptables-verify --input: upstream's save text passes (exit 0); with one rule gone it
    fails with exit 1 and names the rule."""
    family = scenario_family(scenario).value
    save = (SCENARIOS / f"{scenario}.iptables-save.txt").read_text()
    (qroot.tmp / "conf.json").write_text(json.dumps(netconf(scenario)))
    (qroot.tmp / "good.txt").write_text(save)
    dropped = next(line for line in save.splitlines() if line.startswith("-A PROXY_INIT_OUTPUT"))
    (qroot.tmp / "bad.txt").write_text(save.replace(dropped + "\n", "", 1))
    argv = ["/iptables-verify", "--config", "/tmp/conf.json", "--family", family, "--input"]
    good = qroot.run([*argv, "/tmp/good.txt"], {})
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.startswith(f"{family} nat table of /tmp/good.txt: OK")
    bad = qroot.run([*argv, "/tmp/bad.txt"], {})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "PROXY_INIT_OUTPUT" in bad.stdout
