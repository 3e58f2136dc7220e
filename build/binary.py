"""Build driver for the cnibox artifacts (called by the Makefile; see docs/binary.md).

    python build/binary.py dist       Nuitka standalone dist   -> build/out/cnibox_main.dist/
    python build/binary.py launcher   static musl launcher     -> build/out/launcher
    python build/binary.py pack       launcher + dist          -> dist/cnibox
    python build/binary.py all        the three above
    python build/binary.py zipapp     stdlib zipapp            -> dist/cnibox.pyz
    python build/binary.py --arch arm64 dist|launcher|pack|all
                                     the same for aarch64     -> build/out/arm64/, dist/cnibox-arm64

Rules of this module:
1. Nuitka always builds into build/out/ and keeps its cache (~/.cache/Nuitka, ccache inside):
   a rebuild after a Python edit recompiles only the changed modules.
2. Nothing the runtime needs is decided here that the runtime does not also know: the dist
   layout (iptlibs/, xtables/, locale/C.utf8, the loader at the dist root) is documented in
   multicall/effects/bundle.py and build/launcher.c.
3. One `Target` per architecture decides every path and name that differs (docs/arm64.md):
   amd64 builds natively; arm64 cross-builds inside the toolchain root of
   build/arm64_root.py (this same script runs in there for the `dist` and `launcher` steps).
   Whatever the target, the launcher is compiled with that target's loader name and the
   packed dist must hold ELF files for that machine only.
"""

from __future__ import annotations

import argparse
import compileall
import fcntl
import os
import platform
import py_compile
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "out"
MAIN_BINARY = "cnibox.bin"
ZIPAPP = REPO / "dist" / "cnibox.pyz"
# Where the repository is mounted inside the arm64 toolchain root (build/arm64_root.py).
ROOT_REPO = Path("/src")


@dataclass(frozen=True, slots=True)
class Target:
    """Everything that differs between the two architectures' builds."""

    arch: str  # Debian/OCI name: amd64, arm64
    machine: str  # kernel/ELF name: x86_64, aarch64
    loader: str  # glibc's loader, bundled at the dist root and run explicitly by the launcher
    out: Path  # build directory (Nuitka's output dir)
    artifact: Path

    @property
    def multiarch(self) -> str:
        return f"{self.machine}-linux-gnu"

    @property
    def dist(self) -> Path:
        return self.out / "cnibox_main.dist"

    @property
    def launcher(self) -> Path:
        return self.out / "launcher"

    @property
    def dataclass_cache(self) -> Path:
        # Dataclass methods compiled at build time (multicall/dataclass_cache.py).
        return self.out / "dataclasses.marshal"

    @property
    def cross(self) -> bool:
        return self.machine != platform.machine()

    @property
    def build_root(self) -> Path:
        """Where the paths the build saw are on this machine: the toolchain root of a cross
        build (build/arm64_root.py), `/` for the native one."""
        if not self.cross or in_root():
            return Path("/")
        sys.path.insert(0, str(REPO / "build"))
        import arm64_root

        return arm64_root.ROOT

    @property
    def unpacked_debs(self) -> dict[str, str]:
        """Trees the build unpacked from a .deb it did not install -> that .deb (build
        paths): the toolchain root's libc-bin:arm64, whose C.utf8 locale a cross build
        bundles (libc-bin is not co-installable across architectures)."""
        if not self.cross:
            return {}
        sys.path.insert(0, str(REPO / "build"))
        import arm64_root

        debs = sorted(self.build_root.joinpath(arm64_root.DOWNLOADS.lstrip("/")).glob(
            f"libc-bin_*_{self.arch}.deb"))  # fmt: skip
        return {arm64_root.LIBC_BIN: f"{arm64_root.DOWNLOADS}/{debs[-1].name}"} if debs else {}

    @property
    def launcher_libc(self) -> str:
        """musl's static libc the launcher links (musl-gcc's, or musl-dev's spec file for the
        cross gcc), as the build sees it."""
        return f"/usr/lib/{self.machine}-linux-musl/libc.a"


TARGETS = {
    "amd64": Target("amd64", "x86_64", "ld-linux-x86-64.so.2", OUT, REPO / "dist" / "cnibox"),
    "arm64": Target(
        "arm64", "aarch64", "ld-linux-aarch64.so.1", OUT / "arm64", REPO / "dist" / "cnibox-arm64"
    ),
}
# Only the native build runs on the build machine itself; arm64 needs the toolchain root.
NATIVE = "amd64"

# Imported lazily by applets (so Nuitka may not see them yet) or needed at run time anyway.
INCLUDED_PACKAGES = ("multicall", "yaml", "iptc")
INCLUDED_MODULES = ("ssl", "json", "_json")
# Imported by a dependency but kept out of the binary (docs/binary.md, "What is compiled in"):
# python-iptables' iptc/util.py imports distutils.sysconfig for get_python_lib(), a fallback
# path it never reaches here (the bundle sets IPTABLES_LIBDIR); Nuitka would take the
# submodules from the build venv's setuptools (its _distutils copy), whatever version that is.
# Not followed, the import raises ModuleNotFoundError and iptc uses its own fallback,
# sysconfig.get_path("purelib") (the one it has for Python 3.12, which has no distutils).
NOT_FOLLOWED = ("distutils",)
# Pure-Python dependencies shipped inside the zipapp (C extensions cannot load from a zip).
ZIPAPP_PACKAGES = ("multicall", "yaml", "iptc")


def nuitka_command(target: Target) -> list[str]:
    # The cross build's libpython is the arm64 one: sysconfig looks up its data module by the
    # multiarch name compiled into it, which the build machine's Python never imports.
    cross_modules = [f"_sysconfigdata__{target.multiarch}"] if target.cross else []
    return [
        sys.executable,
        "-m",
        "nuitka",
        "--mode=standalone",
        f"--user-plugin={REPO / 'build' / 'selfcontained.py'}",
        # inspect imported when first used, not by Nuitka's start-up (docs/binary.md).
        f"--user-plugin={REPO / 'build' / 'lazy_inspect.py'}",
        "--python-flag=no_site",
        # Without it the runtime exits 2 whenever any argument is "-c" or "-m" followed by
        # another (a guard against self-spawning): `nsenter -m …` and `… sh -c …` are ours.
        "--deployment",
        "--assume-yes-for-downloads",
        f"--jobs={os.cpu_count() or 2}",
        *(f"--include-package={name}" for name in INCLUDED_PACKAGES),
        *(f"--include-module={name}" for name in (*INCLUDED_MODULES, *cross_modules)),
        *(f"--nofollow-import-to={name}" for name in NOT_FOLLOWED),
        f"--include-data-files={target.dataclass_cache}=dataclasses.marshal",
        f"--report={target.out / 'nuitka-report.xml'}",
        f"--output-dir={target.out}",
        f"--output-filename={MAIN_BINARY}",
        str(REPO / "build" / "cnibox_main.py"),
    ]


def build_dist(target: Target) -> None:
    if target.cross and not in_root():
        _in_arm64_root(target, "dist")
        return
    target.out.mkdir(parents=True, exist_ok=True)
    # Nuitka compiles every C file left in its build dir, including modules no longer
    # followed; ccache makes the clean rebuild cheap.
    shutil.rmtree(target.out / "cnibox_main.build", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    started = time.monotonic()
    print(expected_time(target), flush=True)
    recorder = [sys.executable, "-m", "multicall.dataclass_cache", str(target.dataclass_cache)]
    subprocess.run(recorder, check=True, cwd=REPO, env=env)
    run_with_heartbeat(["nice", "-n", "5", *nuitka_command(target)], env, target)
    print(f"build: dist in {_minutes(time.monotonic() - started)} -> {target.dist}")


# Measured on the 2-core development VM (docs/binary.md "Building"): a cold build compiles
# all ~69 C files; after a Python edit ccache serves most of them.
COLD_MINUTES, WARM_MINUTES = "6 to 11 minutes (3 on an idle machine)", "1 to 3 minutes"
HEARTBEAT_SECONDS = 30.0


def expected_time(target: Target) -> str:
    """The line that says how long to wait, before the wait."""
    cache = Path(os.environ.get("NUITKA_CACHE_DIR", Path.home() / ".cache" / "Nuitka"))
    ccache = cache / "ccache"
    # ccache keys include this checkout's paths: a cache filled by another checkout misses.
    warm = target.dist.is_dir() and ccache.is_dir() and any(ccache.iterdir())
    if warm:
        return f"build: compiling with Nuitka; with its cache warm this takes {WARM_MINUTES}"
    return (
        f"build: compiling with Nuitka; the first build of a checkout takes {COLD_MINUTES} "
        f"on 2 cores, later ones {WARM_MINUTES} (Nuitka's cache: {cache})"
    )


def run_with_heartbeat(argv: list[str], env: dict[str, str], target: Target) -> None:
    """Run Nuitka with its own output passing through, and every HEARTBEAT_SECONDS a line
    saying how long it has run and how many of its C files are compiled: Nuitka's progress
    bar shows only on a terminal, and its C compilation prints nothing for minutes."""
    import threading

    started = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_SECONDS):
            print(f"build: Nuitka still running, {_minutes(time.monotonic() - started)}"
                  f"{_c_progress(target)}", flush=True)  # fmt: skip

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        subprocess.run(argv, check=True, cwd=REPO, env=env)
    finally:
        done.set()
        thread.join()


def _c_progress(target: Target) -> str:
    """`; C files compiled: N of M` once Nuitka has written its C files, else ""."""
    sources = list((target.out / "cnibox_main.build").glob("*.c"))
    if not sources:
        return ""
    objects = sum(1 for c in sources if c.with_suffix(".o").exists())
    return f"; C files compiled: {objects} of {len(sources)}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60} min {int(seconds) % 60:02d} s"


def in_root() -> bool:
    """True when running inside the arm64 toolchain root (build/arm64_root.py)."""
    return REPO == ROOT_REPO and os.path.isdir("/opt/arm64-site")


def _in_arm64_root(target: Target, step: str) -> None:
    """Run this script's `step` for `target` inside the toolchain root (created if needed)."""
    sys.path.insert(0, str(REPO / "build"))
    import arm64_root

    arm64_root.ensure()
    env = {
        # Nuitka runs the cross gcc as "gcc" (and objcopy) through build/cross/: see there.
        "PATH": f"{ROOT_REPO}/build/cross:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "CC": f"{ROOT_REPO}/build/cross/gcc",
        "CNIBOX_TARGET_MACHINE": target.machine,
        "CNIBOX_HOST_LOCALE": f"{arm64_root.LIBC_BIN}/usr/lib/locale/C.utf8",
        "CNIBOX_TARGET_SITE": arm64_root.ARM64_SITE,
    }
    command = ["/opt/venv/bin/python", f"{ROOT_REPO}/build/binary.py", "--arch", target.arch, step]
    if arm64_root.chroot("env", *(f"{k}={v}" for k, v in env.items()), *command, check=False):
        raise SystemExit(f"build: {target.arch} {step} failed in the toolchain root")


def zstd_inline_dir() -> Path:
    import nuitka

    return Path(nuitka.__file__).parent / "build" / "inline_copy" / "zstd"


def build_launcher(target: Target) -> None:
    if target.cross and not in_root():
        _in_arm64_root(target, "launcher")
        return
    target.out.mkdir(parents=True, exist_ok=True)
    zstd = zstd_inline_dir()
    # A static musl program: musl-gcc natively; the cross gcc with musl-dev's spec file
    # (the arm64 musl-dev of the toolchain root) otherwise.
    musl_dir = os.path.dirname(target.launcher_libc)
    compiler = (
        ["aarch64-linux-gnu-gcc", "-specs", f"{musl_dir}/musl-gcc.specs"]
        if target.cross
        else ["musl-gcc"]
    )
    command = [
        *compiler,
        "-static",
        "-Os",
        "-s",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        f'-DMAIN_BINARY="{MAIN_BINARY}"',
        f'-DLOADER="{target.loader}"',
        f"-I{zstd}",
        "-o",
        str(target.launcher),
        str(REPO / "build" / "launcher.c"),
    ]
    subprocess.run(["nice", "-n", "5", *command], check=True)
    print(f"build: launcher {target.launcher.stat().st_size} bytes")


def pack(target: Target) -> None:
    sys.path.insert(0, str(REPO / "build"))
    import bundled
    from pack import pack_artifact

    problems = bundled.check_machine(target.dist, target.launcher, target.machine)
    if problems:
        raise SystemExit("build: " + "; ".join(problems))
    target.artifact.parent.mkdir(parents=True, exist_ok=True)
    report = pack_artifact(
        target.launcher, target.dist, (MAIN_BINARY, target.loader), target.artifact
    )
    print(f"build: {report}")
    try:
        record = bundled.write_record(target)
    except bundled.AttributionError as exc:
        target.artifact.unlink()  # a single file whose content nobody can account for
        raise SystemExit(f"build: {target.artifact.name}: {exc}") from None
    print(f"build: what it bundles, attributed (packaging/sbom.py's input) -> {record}")


def build_zipapp() -> None:
    staging = OUT / "zipapp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in ZIPAPP_PACKAGES:
        source = _package_dir(name)
        shutil.copytree(
            source, staging / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
        )
    # Our own __main__: zipapp's generated one drops main()'s return value (the exit code).
    shutil.copyfile(REPO / "build" / "cnibox_main.py", staging / "__main__.py")
    # zipimport cannot cache bytecode: without .pyc beside each .py every start compiles
    # every module it imports (~4x slower). Another Python version falls back to the .py.
    compileall.compile_dir(
        staging,
        quiet=1,
        legacy=True,
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    ZIPAPP.parent.mkdir(parents=True, exist_ok=True)
    write_zipapp(staging, ZIPAPP, interpreter="/usr/bin/env python3")
    print(f"build: zipapp {ZIPAPP.stat().st_size} bytes -> {ZIPAPP}")


def write_zipapp(source: Path, target: Path, interpreter: str) -> None:
    """What zipapp.create_archive writes, reproducibly: the same files give the same bytes.

    zipapp stores each file's mtime and walks the tree in directory order; here members are
    sorted, dated 1980-01-01 (the zip epoch) and 0644, so two builds of one tree are
    byte-identical (the .pyc are hash-based, so their bytes do not depend on time either).
    """
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(b"#!" + interpreter.encode() + b"\n")
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(p for p in source.rglob("*") if p.is_file()):
                info = zipfile.ZipInfo(path.relative_to(source).as_posix(), (1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o100644 << 16
                archive.writestr(info, path.read_bytes())
    tmp.chmod(0o755)
    os.replace(tmp, target)


def _package_dir(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"build: package {name} not installed in {sys.executable}")
    return Path(next(iter(spec.submodule_search_locations)))


STEPS = {
    "dist": (build_dist,),
    "launcher": (build_launcher,),
    "pack": (pack,),
    "all": (build_dist, build_launcher, pack),
    "zipapp": (lambda _target: build_zipapp(),),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\nRules")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--arch", choices=TARGETS, default=NATIVE, help="default: %(default)s")
    parser.add_argument("step", choices=STEPS, help="what to build")
    args = parser.parse_args(argv)
    target = TARGETS[args.arch]
    target.out.mkdir(parents=True, exist_ok=True)
    # Two builds of one target at once (make test and make bench, say) would share Nuitka's
    # output dir; inside the toolchain root the host side already holds the lock.
    with open(target.out / f".build-{args.arch}.lock", "w") as lock:
        if not in_root():
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for step in STEPS[args.step]:
                step(target)
        except subprocess.CalledProcessError as exc:
            print(f"build: {exc.cmd[0] if exc.cmd else 'a step'} failed (exit "
                  f"{exc.returncode}); its output is above", file=sys.stderr)  # fmt: skip
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
