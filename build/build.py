"""Build driver for the cnibox artifacts (called by the Makefile; see docs/binary.md).

    python build/build.py dist       Nuitka standalone dist   -> build/out/cnibox_main.dist/
    python build/build.py launcher   static musl launcher     -> build/out/launcher
    python build/build.py pack       launcher + dist          -> dist/cnibox
    python build/build.py all        the three above
    python build/build.py zipapp     stdlib zipapp            -> dist/cnibox.pyz

Rules of this module:
1. Nuitka always builds into build/out/ and keeps its cache (~/.cache/Nuitka, ccache inside):
   a rebuild after a Python edit recompiles only the changed modules.
2. Nothing the runtime needs is decided here that the runtime does not also know: the dist
   layout (iptlibs/, xtables/, locale/C.utf8, the loader at the dist root) is documented in
   multicall/effects/bundle.py and build/launcher.c.
"""

from __future__ import annotations

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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "out"
DIST = OUT / "cnibox_main.dist"
# Dataclass methods compiled at build time (multicall/dataclass_cache.py), beside the code.
DATACLASS_CACHE = OUT / "dataclasses.marshal"
MAIN_BINARY = "cnibox.bin"
LAUNCHER = OUT / "launcher"
ARTIFACT = REPO / "dist" / "cnibox"
# glibc's loader, bundled at the dist root and run explicitly by the launcher.
LOADERS = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}
ZIPAPP = REPO / "dist" / "cnibox.pyz"

# Imported lazily by applets (so Nuitka may not see them yet) or needed at run time anyway.
INCLUDED_PACKAGES = ("multicall", "yaml", "iptc")
INCLUDED_MODULES = ("ssl", "json", "_json")
# Pure-Python dependencies shipped inside the zipapp (C extensions cannot load from a zip).
ZIPAPP_PACKAGES = ("multicall", "yaml", "iptc")


def nuitka_command() -> list[str]:
    return [
        sys.executable,
        "-m",
        "nuitka",
        "--mode=standalone",
        f"--user-plugin={REPO / 'build' / 'selfcontained.py'}",
        "--python-flag=no_site",
        # Without it the runtime exits 2 whenever any argument is "-c" or "-m" followed by
        # another (a guard against self-spawning): `nsenter -m …` and `… sh -c …` are ours.
        "--deployment",
        "--assume-yes-for-downloads",
        f"--jobs={os.cpu_count() or 2}",
        *(f"--include-package={name}" for name in INCLUDED_PACKAGES),
        *(f"--include-module={name}" for name in INCLUDED_MODULES),
        f"--include-data-files={DATACLASS_CACHE}=dataclasses.marshal",
        f"--output-dir={OUT}",
        f"--output-filename={MAIN_BINARY}",
        str(REPO / "build" / "cnibox_main.py"),
    ]


def build_dist() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    # Nuitka compiles every C file left in its build dir, including modules no longer
    # followed; ccache makes the clean rebuild cheap.
    shutil.rmtree(OUT / "cnibox_main.build", ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    started = time.monotonic()
    recorder = [sys.executable, "-m", "multicall.dataclass_cache", str(DATACLASS_CACHE)]
    subprocess.run(recorder, check=True, cwd=REPO, env=env)
    subprocess.run(["nice", "-n", "5", *nuitka_command()], check=True, cwd=REPO, env=env)
    print(f"build: dist in {time.monotonic() - started:.0f} s -> {DIST}")


def loader_name() -> str:
    machine = platform.machine()
    if machine not in LOADERS:
        raise SystemExit(f"build: no glibc loader name known for {machine}")
    return LOADERS[machine]


def zstd_inline_dir() -> Path:
    import nuitka

    return Path(nuitka.__file__).parent / "build" / "inline_copy" / "zstd"


def build_launcher() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    zstd = zstd_inline_dir()
    command = [
        "musl-gcc",
        "-static",
        "-Os",
        "-s",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        f'-DMAIN_BINARY="{MAIN_BINARY}"',
        f"-I{zstd}",
        "-o",
        str(LAUNCHER),
        str(REPO / "build" / "launcher.c"),
    ]
    subprocess.run(["nice", "-n", "5", *command], check=True)
    print(f"build: launcher {LAUNCHER.stat().st_size} bytes")


def pack() -> None:
    sys.path.insert(0, str(REPO / "build"))
    from pack import pack_artifact

    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    report = pack_artifact(LAUNCHER, DIST, (MAIN_BINARY, loader_name()), ARTIFACT)
    print(f"build: {report}")


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
    "zipapp": (build_zipapp,),
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in STEPS:
        print(f"usage: build.py {{{'|'.join(STEPS)}}}", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / ".build.lock", "w") as lock:
        # Two builds at once (make test and make bench, say) would share Nuitka's output dir.
        fcntl.flock(lock, fcntl.LOCK_EX)
        for step in STEPS[argv[0]]:
            step()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
