"""The arm64 toolchain root: an amd64 Debian 12 chroot that cross-builds cnibox for aarch64.

    python build/arm64_root.py ensure    create or refresh build/out/arm64-root (idempotent)
    python build/arm64_root.py run CMD…  run CMD inside it (repo bind-mounted at /src)

Why a chroot (docs/arm64.md "Route"): the cross build needs arm64 `libpython3.11-dev`,
`libxtables-dev`, `zlib1g-dev`… from Debian's multiarch, and `dpkg --add-architecture arm64`
on the build machine itself upgrades amd64 packages in lockstep (libssl, python3.11 among
them), which would change what the x86_64 binary bundles. Inside this root the arm64
architecture is added to the root's own dpkg only; the host is untouched.

What it holds:
- amd64: Debian's python3.11 (the same 3.11 release as the arm64 libpython: multiarch keeps
  the two in lockstep), the aarch64 cross gcc, ccache, patchelf; a venv at /opt/venv with the
  project's pinned build dependencies (wheels fetched by the host's pip: the chroot needs no
  PyPI access of its own);
- arm64: the libraries the binary bundles (libpython3.11-stdlib, libssl3, libffi8, zlib,
  libip4tc/libip6tc/libxtables and the xtables extensions, glibc), musl-dev for the launcher,
  and the oracles of the VM test stage (iptables, iproute2, busybox-static);
- /opt/arm64-site: the aarch64 builds of the project's C extension modules (PyYAML's wheel
  for aarch64; python-iptables' libxtwrapper compiled with the cross gcc).

Reproducible: Debian's archive as the host's apt is configured (debootstrap reads the same
URIs); every installed package version is recorded in build/out/arm64-root.packages, and the
root is rebuilt only when this file or the pinned requirements in pyproject.toml change (a
stamp holds their hash).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "out"
ROOT = OUT / "arm64-root"
STAMP = ROOT / ".cnibox-ready"
PACKAGES_RECORD = OUT / "arm64-root.packages"
WHEELS = OUT / "arm64-wheels"
SUITE = "bookworm"
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY = "http://deb.debian.org/debian-security"

AMD64_PACKAGES = (
    "python3.11",
    "python3.11-venv",
    "gcc-aarch64-linux-gnu",
    "ccache",
    "make",  # Nuitka's parallel LTO link (gcc -flto=N runs make)
    "patchelf",
    "binutils",  # readelf: the plugin's DT_NEEDED walk over aarch64 files
)
ARM64_PACKAGES = (
    "libpython3.11-dev",
    "libpython3.11-stdlib",
    "libxtables-dev",
    "libxtables12",
    "libip4tc2",
    "libip6tc2",
    "zlib1g-dev",
    "libssl3",
    "libffi8",
    "musl-dev",
    # Oracles and userland of the full-system VM test stage (tests/arm64/vm.py).
    "iptables",
    "iproute2",
    "busybox-static",
)
# Downloaded, not installed: the kernel of the VM stage and libc-bin's C.utf8 locale (libc-bin
# is not co-installable across architectures).
ARM64_DOWNLOADS = ("linux-image-arm64", "libc-bin")
DOWNLOADS = "/opt/arm64-debs"
# libc-bin:arm64 unpacked (its C.utf8 locale is what the arm64 dist bundles).
LIBC_BIN = "/opt/arm64-libc-bin"
# From pyproject.toml's pins: the build tools, and the runtime dependencies Nuitka compiles.
BUILD_TOOLS = ("nuitka", "zstandard", "ordered-set")


def venv_requirements() -> tuple[str, ...]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    dev = {re.split(r"[=<>]", r)[0].lower(): r for r in project["optional-dependencies"]["dev"]}
    return (*project["dependencies"], *(dev[name] for name in BUILD_TOOLS))


def pinned(name: str) -> str:
    """The pinned requirement of distribution `name` (e.g. "PyYAML==6.0.4")."""
    return next(r for r in venv_requirements() if r.lower().startswith(name.lower() + "=="))


ARM64_SITE = "/opt/arm64-site"


def host_mirrors() -> tuple[str, str]:
    """The Debian and security archive URIs the host's apt uses (deb822 sources)."""
    mirror, security = DEFAULT_MIRROR, DEFAULT_SECURITY
    if SOURCES.is_file():
        for block in SOURCES.read_text().split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", block, re.MULTILINE)
            suites = re.search(r"^Suites:\s*(.+)$", block, re.MULTILINE)
            if not uris or not suites:
                continue
            if f"{SUITE}-security" in suites.group(1).split():
                security = uris.group(1)
            elif SUITE in suites.group(1).split():
                mirror = uris.group(1)
    return mirror, security


def inputs_hash() -> str:
    """What the root is made from: this file and the pinned requirements (not the rest of
    pyproject.toml: a new test dependency must not rebuild the root)."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update("\n".join(venv_requirements()).encode())
    return digest.hexdigest()[:16]


def chroot(*command: str, env: dict[str, str] | None = None, check: bool = True) -> int:
    """Run a command inside ROOT with /proc, /dev and the repo (at /src) mounted, in a private
    mount namespace so nothing stays mounted if we are interrupted."""
    base = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
    }
    base.update(env or {})
    script = (
        'set -e; r="$1"; shift\n'
        'mount -t proc proc "$r/proc"\n'
        'mount --rbind /dev "$r/dev"\n'
        'mkdir -p "$r/src" && mount --bind "$CNIBOX_REPO" "$r/src"\n'
        'exec chroot "$r" "$@"\n'
    )
    argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(ROOT)]
    result = subprocess.run(
        [*argv, "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in base.items()), *command],
        env=dict(os.environ, CNIBOX_REPO=str(REPO)),
        check=False,
    )
    if check and result.returncode != 0:
        raise SystemExit(f"arm64-root: `{' '.join(command)}` failed ({result.returncode})")
    return result.returncode


def debootstrap(mirror: str) -> None:
    if shutil.which("debootstrap") is None:
        raise SystemExit("arm64-root: debootstrap missing (make apt installs it)")
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["debootstrap", "--variant=minbase", "--arch=amd64", SUITE, str(ROOT), mirror],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def configure_apt(mirror: str, security: str) -> None:
    (ROOT / "etc/apt/sources.list").write_text(
        f"deb {mirror} {SUITE} main\n"
        f"deb {mirror} {SUITE}-updates main\n"
        f"deb {security} {SUITE}-security main\n"
    )
    # No daemons may start inside the root (postinst scripts of iproute2 & co).
    policy = ROOT / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    chroot("dpkg", "--add-architecture", "arm64")
    chroot("apt-get", "update", "-qq")


def install_packages() -> None:
    packages = [*AMD64_PACKAGES, *(f"{name}:arm64" for name in ARM64_PACKAGES)]
    chroot("apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages)
    chroot("mkdir", "-p", DOWNLOADS)
    chroot(
        "sh",
        "-c",
        f"cd {DOWNLOADS} && rm -f *.deb && apt-get download -qq "
        + " ".join(f"{name}:arm64" for name in ARM64_DOWNLOADS)
        # linux-image-arm64 is a metapackage: fetch the versioned image it depends on too.
        + " $(apt-cache depends linux-image-arm64:arm64 | sed -n 's/.*Depends: //p'"
        + " | grep '^linux-image-')",
    )
    chroot(
        "sh", "-c", f"rm -rf {LIBC_BIN} && dpkg-deb -x {DOWNLOADS}/libc-bin_*_arm64.deb {LIBC_BIN}"
    )


def static_libpython_shim() -> None:
    """Nuitka looks for Debian's static libpython in the running (amd64) interpreter's LIBPL;
    the root has only the arm64 one. Point the amd64 name at it: Nuitka's detection is then
    satisfied, and build/cross/gcc maps the path to the aarch64 file anyway, so nothing of
    the build machine's architecture can be linked."""
    libpl = "/usr/lib/python3.11/config-3.11-x86_64-linux-gnu"
    chroot("mkdir", "-p", libpl)
    chroot("ln", "-sf", "../config-3.11-aarch64-linux-gnu/libpython3.11-pic.a",
           f"{libpl}/libpython3.11-pic.a")  # fmt: skip


def cross_compiler_as_gcc() -> None:
    """SCons (inside Nuitka) picks its linker tool by finding `gcc` on its own default PATH,
    and the root has no amd64 gcc on purpose: name the cross wrapper (build/cross/gcc, seen at
    /src while a build runs) `gcc` there. Nothing else in the root compiles for amd64."""
    chroot("ln", "-sf", "/src/build/cross/gcc", "/usr/local/bin/gcc")


def fetch_wheels() -> None:
    """Wheels/sdists for the root's venv, and PyYAML's aarch64 wheel, via the host's pip."""
    shutil.rmtree(WHEELS, ignore_errors=True)
    WHEELS.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check"]
    build_backend = ("setuptools>=68", "wheel")  # the sdists' (Nuitka, python-iptables)
    subprocess.run([*pip, "-d", str(WHEELS / "amd64"), *venv_requirements(), *build_backend],
                   check=True)  # fmt: skip
    subprocess.run(
        [*pip, "-d", str(WHEELS / "aarch64"), "--no-deps", "--only-binary=:all:",
         "--platform", "manylinux2014_aarch64", "--python-version", "3.11",
         "--implementation", "cp", "--abi", "cp311", pinned("PyYAML")],
        check=True,
    )  # fmt: skip


def make_venv() -> None:
    wheels = "/src/build/out/arm64-wheels"
    chroot("rm", "-rf", "/opt/venv", ARM64_SITE, "/tmp/xt")
    chroot("python3.11", "-m", "venv", "/opt/venv")
    pip = ["/opt/venv/bin/pip", "install", "-q", "--no-index", "--disable-pip-version-check"]
    chroot(*pip, "--find-links", f"{wheels}/amd64",
           *(r for r in venv_requirements() if not r.startswith("python-iptables")))  # fmt: skip
    # PyYAML's aarch64 extension (_yaml): the same release, from its aarch64 wheel.
    chroot(*pip, "--find-links", f"{wheels}/aarch64", "--only-binary=:all:", "--no-deps",
           "--platform", "manylinux2014_aarch64", "--target", ARM64_SITE,
           pinned("PyYAML"))  # fmt: skip
    # python-iptables: pip builds its aarch64 wheel from the sdist (its libxtwrapper compiled by
    # the cross gcc with the EXT_SUFFIX of the aarch64 sysconfig that the arm64
    # libpython3.11-stdlib ships; the root has no amd64 C compiler), and installs it, with its
    # metadata (the RECORD build/bundled.py attributes files by), into the venv (Nuitka
    # compiles iptc from there) and into ARM64_SITE (the libxtwrapper the dist bundles).
    site = "/opt/venv/lib/python3.11/site-packages"
    cross = {
        "_PYTHON_HOST_PLATFORM": "linux-aarch64",
        "_PYTHON_SYSCONFIGDATA_NAME": "_sysconfigdata__aarch64-linux-gnu",
    }
    # --use-pep517: the sdist has no pyproject.toml, and without it the root's pip (23.0)
    # runs `setup.py bdist_wheel` with the venv's setuptools, which has no bdist_wheel; this
    # way the build backend is the one fetch_wheels downloaded (recorded in
    # arm64-root.packages), in an isolated environment.
    chroot("/opt/venv/bin/pip", "wheel", "-q", "--no-index", "--disable-pip-version-check",
           "--find-links", f"{wheels}/amd64", "--no-deps", "--use-pep517",
           "--wheel-dir", "/tmp/xt", pinned("python-iptables"), env=cross)  # fmt: skip
    for target in (site, ARM64_SITE):
        chroot(*pip, "--no-deps", "--only-binary=:all:", "--platform", "linux_aarch64",
               "--target", target, "--find-links", "/tmp/xt",
               pinned("python-iptables"))  # fmt: skip
    chroot("sh", "-c", "rm -rf /tmp/xt")


def record_packages() -> None:
    listing = subprocess.run(
        ["chroot", str(ROOT), "dpkg-query", "-W", "-f", "${Package}:${Architecture}\t${Version}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    downloads = sorted(p.name for p in (ROOT / DOWNLOADS.lstrip("/")).glob("*.deb"))
    # The venv's wheels and sdists (the build backend's among them: it builds libxtwrapper).
    wheels = sorted(p.name for p in WHEELS.rglob("*") if p.is_file())
    PACKAGES_RECORD.write_text(
        listing
        + "".join(f"download\t{name}\n" for name in downloads)
        + "".join(f"wheel\t{name}\n" for name in wheels)
    )


def ensure() -> None:
    wanted = inputs_hash()
    if STAMP.is_file() and STAMP.read_text().strip() == wanted:
        print(f"arm64-root: up to date ({ROOT})")
        return
    started = time.monotonic()
    mirror, security = host_mirrors()
    debootstrap(mirror)
    configure_apt(mirror, security)
    install_packages()
    static_libpython_shim()
    cross_compiler_as_gcc()
    fetch_wheels()
    make_venv()
    record_packages()
    STAMP.write_text(wanted + "\n")
    print(f"arm64-root: ready in {time.monotonic() - started:.0f} s ({ROOT})")


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("ensure", help="create or refresh build/out/arm64-root (idempotent)")
    run = commands.add_parser("run", help="run CMD inside it (repo bind-mounted at /src)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD…")
    args = parser.parse_args(argv)
    if args.command == "ensure":
        ensure()
        return 0
    if not args.cmd:
        parser.error("run needs a command")
    return chroot(*args.cmd, check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
