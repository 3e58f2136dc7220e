"""A full-system arm64 VM for the firewall paths qemu-user cannot run (tests/arm64/test_vm.py).

qemu-system-aarch64 (TCG: no KVM here) boots Debian's arm64 kernel (linux-image-arm64, unpacked
from the .deb the arm64 toolchain root downloads) straight from its Image with -kernel, over an
initramfs made here from two newc cpio archives, concatenated (the kernel unpacks both):

1. the base, cached in build/out/arm64-vm/: Debian's arm64 busybox-static, iproute2's `ip`, the
   iptables binaries (the oracles: iptables-legacy-save, iptables-nft-save, ip6tables-*), their
   xtables extensions, every library they need (DT_NEEDED closure, resolved in the root's
   arm64 multiarch directories) and the kernel modules of netfilter and virtio-net (modules.dep
   closure, loaded in dependency order by /init);
2. the run's own: /cnibox (the artifact under test) with one link per applet, the test's
   inputs under /in and the script /in/run.sh that /init runs.

/init mounts what a system needs, loads the modules, brings up eth0 and runs /in/run.sh; the
script's output reaches the host on the serial console between markers (`@@cbx <name>` …
`@@cbx-end <name> <rc>`), then the VM powers off. Its only network is QEMU's user-mode stack,
whose gateway 10.0.2.2 is the loopback of the netns QEMU runs in: a throwaway netns the test
makes, holding only `lo` and the test API server, so the guest can reach nothing else.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from multicall.applets import all_names

REPO = Path(__file__).resolve().parent.parent.parent
ROOT = REPO / "build" / "out" / "arm64-root"
CACHE = REPO / "build" / "out" / "arm64-vm"
DEBS = ROOT / "opt" / "arm64-debs"
MULTIARCH = "aarch64-linux-gnu"
LIBDIRS = (f"lib/{MULTIARCH}", f"usr/lib/{MULTIARCH}")
# QEMU user networking: the guest's view of the host's loopback (of QEMU's netns).
GUEST_HOST = "10.0.2.2"
# The kernel modules the tests need: both firewall interfaces with what upstream's rules use,
# and the virtio NIC. Their dependencies come from each module's .modinfo; crc32c_generic is
# libcrc32c's soft dependency (its init fails without it, and there is no modprobe to ask).
MODULES = (
    "crc32c_generic", "nf_tables", "nft_compat", "nft_chain_nat", "nft_nat", "nft_redir",
    "nfnetlink", "x_tables", "ip_tables", "iptable_nat", "ip6_tables", "ip6table_nat",
    "xt_tcpudp", "xt_multiport", "xt_owner", "xt_comment", "xt_REDIRECT", "xt_nat",
    "xt_conntrack", "xt_mark", "virtio_net", "virtio_pci",
)  # fmt: skip
# The x_tables-free kernel (tests/arm64/test_vm_no_xtables.py): what `iptables-mode: nftables`
# needs and nothing of x_tables. x_tables, nft_compat, ip(6)_tables and every xt_* are not in
# that initramfs at all (and it has no modprobe for the kernel's request_module to run), so
# they cannot be loaded, as on a kernel built without them; veth for its traffic.
NATIVE_MODULES = (
    "crc32c_generic", "nf_tables", "nft_chain_nat", "nft_nat", "nft_redir", "nfnetlink",
    "veth", "virtio_net", "virtio_pci",
)  # fmt: skip
XTABLES_MODULE = re.compile(r"^(x_tables|nft_compat|ip6?_tables|ip6?table_\w+|xt_\w+)$")
# Programs of the root copied into the VM (paths inside the root); links name applets of them.
PROGRAMS = ("bin/busybox", "bin/ip", "usr/sbin/xtables-legacy-multi", "usr/sbin/xtables-nft-multi")
XTABLES_LINKS = {
    f"{tool}-{mode}{suffix}": f"xtables-{mode}-multi"
    for tool in ("iptables", "ip6tables")
    for mode in ("legacy", "nft")
    for suffix in ("", "-save")
}
BUSYBOX_APPLETS = ("sh", "mount", "mkdir", "insmod", "cat", "echo", "poweroff", "sleep", "ls",
                   "grep", "base64", "sync", "ln", "rm", "env", "true", "stat", "nc")  # fmt: skip
INIT = """#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /run /tmp /var/run/netns
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
echo 1 > /proc/sys/kernel/printk
while read -r module; do
  insmod "$module" || echo "@@cbx-module-failed $module"
done < /modules.order
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
echo "@@cbx-booted"
sh /in/run.sh
echo "@@cbx-done"
sync
poweroff -f
"""


@dataclass(frozen=True, slots=True)
class Kernel:
    image: Path
    release: str
    modules: Path  # lib/modules/<release> of the unpacked package

    def config(self) -> dict[str, str]:
        """The kernel's build configuration (boot/config-<release>): CONFIG_X -> y/m/..."""
        text = (self.image.parent / f"config-{self.release}").read_text()
        return dict(line.split("=", 1) for line in text.splitlines() if line.startswith("CONFIG_"))


def kernel() -> Kernel:
    """Debian's arm64 kernel, unpacked once from the toolchain root's download."""
    (deb,) = sorted(DEBS.glob("linux-image-*-arm64_*_arm64.deb"))
    target = CACHE / "kernel" / deb.stem
    if not (target / ".ok").exists():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
        (target / ".ok").touch()
    (image,) = sorted((target / "boot").glob("vmlinuz-*"))
    release = image.name.removeprefix("vmlinuz-")
    return Kernel(image, release, target / "lib" / "modules" / release)


def modinfo_depends(module: Path) -> list[str]:
    """The `depends=` of a kernel module's .modinfo section (what depmod reads; the package
    ships no modules.dep: it is made at install time)."""
    data = module.read_bytes()
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shentsize, shnum = (
        int.from_bytes(data[0x3A:0x3C], "little"),
        int.from_bytes(data[0x3C:0x3E], "little"),
    )
    shstrndx = int.from_bytes(data[0x3E:0x40], "little")

    def section(i: int) -> tuple[int, int, int]:
        h = data[shoff + i * shentsize : shoff + (i + 1) * shentsize]
        name = int.from_bytes(h[0:4], "little")
        return name, int.from_bytes(h[0x18:0x20], "little"), int.from_bytes(h[0x20:0x28], "little")

    _, names_off, _ = section(shstrndx)
    for i in range(shnum):
        name, offset, size = section(i)
        if data[names_off + name : data.index(b"\0", names_off + name)] == b".modinfo":
            for field in data[offset : offset + size].split(b"\0"):
                if field.startswith(b"depends="):
                    return [d for d in field[8:].decode().split(",") if d]
    return []


def module_closure(kern: Kernel, wanted: Iterable[str]) -> list[str]:
    """Module paths (relative to the modules dir) in load order: dependencies first."""
    by_name = {
        p.name.split(".ko")[0].replace("-", "_"): p for p in (kern.modules / "kernel").rglob("*.ko")
    }
    order: list[str] = []

    def visit(name: str) -> None:
        path = by_name[name.replace("-", "_")]
        rel = str(path.relative_to(kern.modules))
        if rel in order:
            return
        for dep in modinfo_depends(path):
            visit(dep)
        order.append(rel)

    for name in wanted:
        if name in by_name:  # else built into this kernel
            visit(name)
    return order


def needed(path: Path) -> tuple[list[str], str | None]:
    """(DT_NEEDED sonames, PT_INTERP) of an ELF file, by readelf (any machine's ELF)."""
    out = subprocess.run(
        ["readelf", "-d", "-l", "-W", str(path)], capture_output=True, text=True, check=True
    ).stdout
    interp = re.search(r"\[Requesting program interpreter: ([^\]]+)\]", out)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out), (
        interp.group(1) if interp else None
    )


def library_closure(elves: Iterable[Path]) -> dict[str, Path]:
    """Root-relative path -> file in the root, for every library the ELF files need."""
    found: dict[str, Path] = {}
    queue = list(elves)
    while queue:
        sonames, interp = needed(queue.pop())
        if interp and interp.lstrip("/") not in found:
            found[interp.lstrip("/")] = (ROOT / interp.lstrip("/")).resolve()
        for soname in sonames:
            where = [f"{d}/{soname}" for d in LIBDIRS if (ROOT / d / soname).exists()]
            if not where:
                raise FileNotFoundError(f"{soname}: not in the arm64 root's {LIBDIRS}")
            rel = where[0]
            if rel not in found:
                found[rel] = (ROOT / rel).resolve()
                queue.append(found[rel])
    return found


# ---- newc cpio ------------------------------------------------------------------------------


def cpio(entries: Iterable[tuple[str, int, bytes]]) -> bytes:
    """A newc archive of (path, st_mode, data-or-link-target), parents before children."""
    out = bytearray()
    ino = 1
    for name, mode, data in [*entries, ("TRAILER!!!", 0, b"")]:
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out += b"070701" + b"".join(b"%08x" % f for f in fields) + encoded
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
        ino += 1
    return bytes(out)


def _dir(path: str) -> tuple[str, int, bytes]:
    return (path, 0o040755, b"")


def _file(path: str, data: bytes, mode: int = 0o755) -> tuple[str, int, bytes]:
    return (path, 0o100000 | mode, data)


def _link(path: str, target: str) -> tuple[str, int, bytes]:
    return (path, 0o120777, target.encode())


def _with_parents(entries: list[tuple[str, int, bytes]]) -> list[tuple[str, int, bytes]]:
    paths = {e[0] for e in entries}
    dirs = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent and parent not in paths:
            dirs.add(parent)
            parent = os.path.dirname(parent)
    return sorted([*(_dir(d) for d in dirs), *entries], key=lambda e: e[0])


def base_initramfs(modules: tuple[str, ...] = MODULES) -> tuple[Kernel, Path]:
    """The kernel and the cached base cpio with `modules` (and their dependencies) loaded at
    boot; one cache entry per module set, rebuilt when the root or this file changes."""
    kern = kernel()
    stamp = (ROOT / ".cnibox-ready").read_text() if (ROOT / ".cnibox-ready").exists() else ""
    key = hashlib.sha256((stamp + Path(__file__).read_text() + kern.release).encode())
    variant = hashlib.sha256(",".join(modules).encode()).hexdigest()[:8]
    archive = CACHE / f"base-{variant}-{key.hexdigest()[:16]}.cpio"
    if archive.exists():
        return kern, archive
    entries: list[tuple[str, int, bytes]] = [
        _dir(d) for d in ("proc", "sys", "dev", "run", "tmp", "in", "etc")
    ]
    entries.append(_link("var/run", "/run"))  # as on Debian: iproute2 keeps netns in /run/netns
    entries.append(_file("init", INIT.encode()))
    entries.append(_file("etc/passwd", b"root:x:0:0:root:/:/bin/sh\n", 0o644))
    programs = [ROOT / p for p in PROGRAMS]
    extensions = sorted((ROOT / f"usr/lib/{MULTIARCH}/xtables").glob("*.so"))
    for program in PROGRAMS:
        entries.append(_file(program, (ROOT / program).read_bytes()))
    entries += [_link(f"bin/{name}", "busybox") for name in BUSYBOX_APPLETS]
    entries += [_link(f"usr/sbin/{name}", target) for name, target in XTABLES_LINKS.items()]
    for ext in extensions:
        entries.append(_file(str(ext.relative_to(ROOT)), ext.read_bytes()))
    for rel, source in library_closure([*programs, *extensions]).items():
        entries.append(_file(rel, source.read_bytes()))
    order = module_closure(kern, modules)
    for rel in order:
        entries.append(_file(f"mod/{rel}", (kern.modules / rel).read_bytes(), 0o644))
    entries.append(_file("modules.order", "".join(f"/mod/{r}\n" for r in order).encode(), 0o644))
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob(f"base-{variant}-*.cpio"):
        old.unlink()
    tmp = archive.with_suffix(".tmp")
    tmp.write_bytes(cpio(_with_parents(entries)))
    tmp.rename(archive)
    return kern, archive


def run_initramfs(artifact: Path, inputs: Mapping[str, bytes], script: str) -> bytes:
    """The run's own cpio: the artifact as /cnibox with applet links, inputs under /in."""
    entries = [_file("cnibox", artifact.read_bytes())]
    entries += [_link(name, "cnibox") for name in all_names()]
    entries += [_file(f"in/{name}", data, 0o644) for name, data in inputs.items()]
    entries.append(_file("in/run.sh", script.encode()))
    return cpio(_with_parents(entries))


@dataclass(frozen=True, slots=True)
class Boot:
    console: str  # the serial console, \r removed
    seconds: float

    def section(self, name: str) -> tuple[str, int]:
        """(stdout, exit status) of a named step of the script; `<name>.stderr` its stderr."""
        match = re.search(
            rf"^@@cbx {re.escape(name)}\n(.*?)\n^@@cbx-end {re.escape(name)} (\d+)$",
            self.console,
            re.MULTILINE | re.DOTALL,
        )
        if match is None:
            raise AssertionError(f"step {name} missing from the console:\n{self.console[-4000:]}")
        return match.group(1), int(match.group(2))


def step(name: str, command: str) -> str:
    """A script fragment running `command`: its stdout and exit status, then its stderr, each
    framed for Boot.section. A newline closes each (output need not end with one, as the
    plugin's JSON does not): section() removes it again."""
    return (
        f'echo "@@cbx {name}"\n'
        f"( {command} ) 2>/tmp/stderr; rc=$?\n"
        f'echo; echo "@@cbx-end {name} $rc"\n'
        f'echo "@@cbx {name}.stderr"; cat /tmp/stderr; echo; echo "@@cbx-end {name}.stderr 0"\n'
    )


def boot(
    artifact: Path, inputs: Mapping[str, bytes], script: str, *, workdir: Path, netns: str,
    timeout: float, modules: tuple[str, ...] = MODULES,
) -> Boot:  # fmt: skip
    """Boot the VM inside `netns` (its test API server on 127.0.0.1 is the guest's
    10.0.2.2) with the run's inputs and `modules` loaded, wait for it to power off; returns
    the console."""
    kern, base = base_initramfs(modules)
    initrd = workdir / "initrd.cpio"
    initrd.write_bytes(base.read_bytes() + run_initramfs(artifact, inputs, script))
    console = workdir / "console.log"
    netdev = "user,id=n0,net=10.0.2.0/24,host=10.0.2.2"
    command = [
        "nsenter", f"--net={netns}", "--",
        "qemu-system-aarch64", "-M", "virt", "-cpu", "cortex-a72", "-smp", "2", "-m", "1536",
        "-nographic", "-no-reboot", "-nodefaults", "-serial", f"file:{console}",
        "-kernel", str(kern.image), "-initrd", str(initrd),
        "-append", "console=ttyAMA0 panic=-1 quiet loglevel=1 rdinit=/init",
        "-netdev", netdev, "-device", "virtio-net-pci,netdev=n0,romfile=",
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    text = console.read_text(errors="replace").replace("\r", "") if console.exists() else ""
    if proc.returncode != 0:
        raise AssertionError(f"qemu exited {proc.returncode}: {proc.stderr}\n{text[-4000:]}")
    return Boot(text, time.monotonic() - started)
