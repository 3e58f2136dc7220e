"""Nuitka user plugin: make the standalone dist independent of the host's libraries.

Loaded with `--user-plugin=build/selfcontained.py`. When Nuitka has finished the dist it

1. stages python-iptables' libraries: `iptlibs/` (libip4tc.so, libip6tc.so, libxtables.so.12,
   libxtwrapper) and `xtables/` (every libxt_*/libipt_*/libip6t_* extension), the layout
   `multicall.effects.bundle.prepare_iptc()` expects at the dist root;
2. copies glibc's `C.utf8` locale to `locale/C.utf8` (the launcher sets LOCPATH to it:
   Nuitka's runtime aborts under LANG=C.UTF-8 without a usable locale);
3. walks every ELF file with `ldd` and copies each library resolved outside the dist, the
   glibc loader included, into the dist root, so nothing is loaded from the host;
4. cross builds (CNIBOX_TARGET_MACHINE=aarch64 on an x86_64 Python, build/arm64_root.py):
   Nuitka copied the running interpreter's x86_64 extension modules and their libraries, so
   each is replaced by its aarch64 counterpart (the same module from the arm64
   libpython3.11-stdlib, or from /opt/arm64-site for PyYAML and python-iptables), and the
   library walk reads DT_NEEDED/PT_INTERP with `readelf` instead of running `ldd`, resolving
   in the target's multiarch directories only. Any ELF left for another machine fails the
   build.
5. writes `bundled.json` beside the dist: each file it bundled and the file it came from,
   and the build's environment as this process sees it (the prefixes of Nuitka's report, the
   site directories, the standard library, the static libpython linked in), for
   build/bundled.py, which attributes every file and compiled module to its package.

Why a plugin: Nuitka treats glibc, libz and friends as system libraries and never bundles
them, and it has no Linux option to do so (docs/binary.md, "Why not stock Nuitka onefile").
Host paths come from environment variables so CI machines with another multiarch layout can
override them.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import types

from nuitka.plugins.PluginBase import NuitkaPluginBase

TARGET = os.environ.get("CNIBOX_TARGET_MACHINE", platform.machine())
CROSS = platform.machine() != TARGET
MULTIARCH = os.environ.get("CNIBOX_MULTIARCH", f"{TARGET}-linux-gnu")
BUILD_MULTIARCH = f"{platform.machine()}-linux-gnu"
LIBDIR = os.environ.get("CNIBOX_HOST_LIBDIR", f"/usr/lib/{MULTIARCH}")
XTABLES_DIR = os.environ.get("CNIBOX_HOST_XTABLES", f"{LIBDIR}/xtables")
LOCALE_DIR = os.environ.get("CNIBOX_HOST_LOCALE", "/usr/lib/locale/C.utf8")
# Name python-iptables looks up -> file on the host. libip4tc is looked up as "libip4tc.so";
# libxtables keeps its ABI major in the name (PYTHON_IPTABLES_XTABLES_VERSION=12 says so).
IPTLIBS = {
    "libip4tc.so": "libip4tc.so.2",
    "libip6tc.so": "libip6tc.so.2",
    "libxtables.so.12": "libxtables.so.12",
}
# Where a cross build finds the target's modules and libraries (build/arm64_root.py installs them).
TARGET_SITE = os.environ.get("CNIBOX_TARGET_SITE", "/opt/arm64-site")
TARGET_DYNLOAD = os.environ.get("CNIBOX_TARGET_DYNLOAD", "/usr/lib/python3.11/lib-dynload")
TARGET_LIBDIRS = (f"/lib/{MULTIARCH}", f"/usr/lib/{MULTIARCH}")
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
READELF_NEEDED = re.compile(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]")
READELF_INTERP = re.compile(r"\[Requesting program interpreter: ([^\]]+)\]")
LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(\S+)\s+\(0x[0-9a-f]+\)$")
LDD_MISSING = re.compile(r"^\s*(\S+)\s+=>\s+not found$")
ELF_MAGIC = b"\x7fELF"


def _answer_nuitkas_iptc_lookup() -> None:
    """Cross builds: Nuitka's dll-files plugin finds python-iptables' libxtwrapper by importing
    `iptc.util` in the build machine's Python, and importing python-iptables dlopens the build
    machine's libxtables, which the toolchain root does not have (only the target's). Answer
    that lookup with the target's libxtwrapper; Nuitka compiles iptc from its files as usual
    (its module finder does not import what it compiles)."""
    path = os.path.join(TARGET_SITE, f"libxtwrapper.cpython-311-{MULTIARCH}.so")
    util = types.ModuleType("iptc.util")
    util.find_library = lambda *_names: (types.SimpleNamespace(_name=path), 0)  # type: ignore[attr-defined]
    package = types.ModuleType("iptc")
    package.__path__ = []
    package.util = util  # type: ignore[attr-defined]
    sys.modules.setdefault("iptc", package)
    sys.modules.setdefault("iptc.util", util)


if CROSS:
    _answer_nuitkas_iptc_lookup()


class CniboxSelfContained(NuitkaPluginBase):
    plugin_name = "cnibox-selfcontained"
    plugin_desc = "Bundle glibc, its loader, libz, python-iptables' libraries and a C.utf8 locale."

    @staticmethod
    def isAlwaysEnabled() -> bool:
        return True

    def __init__(self) -> None:
        # dist-relative path -> the file it was copied from (bundled.json).
        self.sources: dict[str, str] = {}

    def onStandaloneDistributionFinished(self, dist_dir: str) -> None:
        self._stage_iptables(dist_dir)
        self._stage_locale(dist_dir)
        if CROSS:
            self._replace_foreign_files(dist_dir)
        copied = self._bundle_host_libraries(dist_dir)
        self.info(f"bundled host libraries: {', '.join(sorted(copied)) or 'none'}")
        foreign = [f for f in _elf_files(dist_dir) if elf_machine(f) != TARGET]
        if foreign:
            self.sysexit(f"not {TARGET} ELF files in the dist: {', '.join(foreign)}")
        record = {"machine": TARGET, "sources": self.sources, "build": _build_environment()}
        with open(os.path.join(os.path.dirname(dist_dir), "bundled.json"), "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)

    def _copy(self, dist_dir: str, src: str, dst: str) -> None:
        _copy(src, dst, self)
        self.sources[os.path.relpath(dst, dist_dir)] = os.path.realpath(src)

    def _replace_foreign_files(self, dist_dir: str) -> None:
        """Swap each ELF Nuitka copied from the build machine's Python for the target's."""
        for path in _elf_files(dist_dir):
            if elf_machine(path) == TARGET:
                continue
            rel = os.path.relpath(path, dist_dir)
            counterpart = _target_counterpart(rel)
            if counterpart is None:
                self.sysexit(f"{rel}: built for {elf_machine(path)}, no {TARGET} counterpart")
            self._copy(dist_dir, counterpart, path)

    def _stage_iptables(self, dist_dir: str) -> None:
        iptlibs = os.path.join(dist_dir, "iptlibs")
        xtables = os.path.join(dist_dir, "xtables")
        os.makedirs(iptlibs, exist_ok=True)
        os.makedirs(xtables, exist_ok=True)
        for name, host in IPTLIBS.items():
            self._copy(dist_dir, os.path.join(LIBDIR, host), os.path.join(iptlibs, name))
        for wrapper in glob.glob(os.path.join(dist_dir, "libxtwrapper*.so")):
            shutil.copy2(wrapper, iptlibs)
            # Nuitka copied it to the dist root (its report names the source): point there.
            rel = os.path.relpath(wrapper, dist_dir)
            self.sources[os.path.join("iptlibs", rel)] = f"dist:{rel}"
        extensions = sorted(glob.glob(os.path.join(XTABLES_DIR, "*.so")))
        if not extensions:
            self.sysexit(f"no xtables extensions in {XTABLES_DIR} (install libxtables12/iptables)")
        for ext in extensions:
            self._copy(dist_dir, ext, os.path.join(xtables, os.path.basename(ext)))

    def _stage_locale(self, dist_dir: str) -> None:
        if not os.path.isdir(LOCALE_DIR):
            self.sysexit(f"{LOCALE_DIR} missing (Debian's libc-bin ships it)")
        target = os.path.join(dist_dir, "locale", "C.utf8")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(LOCALE_DIR, target, symlinks=False)
        for base, _dirs, files in os.walk(target):
            for name in files:
                rel = os.path.relpath(os.path.join(base, name), target)
                source = os.path.realpath(os.path.join(LOCALE_DIR, rel))
                self.sources[os.path.join("locale", "C.utf8", rel)] = source

    def _bundle_host_libraries(self, dist_dir: str) -> set[str]:
        """Copy every library an ELF file in the dist resolves outside it; repeat to a fixpoint."""
        copied: set[str] = set()
        while True:
            wanted = self._outside_libraries(dist_dir)
            new = {path for path in wanted if os.path.basename(path) not in copied}
            if not new:
                return copied
            for path in sorted(new):
                name = os.path.basename(path)
                target = os.path.join(dist_dir, name)
                if not os.path.exists(target):
                    self._copy(dist_dir, path, target)
                copied.add(name)

    def _outside_libraries(self, dist_dir: str) -> set[str]:
        real_dist = os.path.realpath(dist_dir)
        # Sonames satisfied inside the dist (iptlibs/ is loaded first by python-iptables).
        present = set(os.listdir(dist_dir)) | set(os.listdir(os.path.join(dist_dir, "iptlibs")))
        outside: set[str] = set()
        for elf in _elf_files(dist_dir):
            for soname, path in _readelf_deps(elf) if CROSS else _ldd(elf):
                if path == "not found":
                    if soname not in present:
                        self.warning(f"{elf}: {soname} not found")
                    continue
                if os.path.realpath(path).startswith(real_dist + os.sep):
                    continue
                if soname and soname in present:
                    continue
                outside.add(path)
        return outside


def _build_environment() -> dict[str, object]:
    """What build/bundled.py needs to attribute the compiled-in code, as this process sees it
    (inside the toolchain root for a cross build): the prefixes Nuitka's --report abbreviates
    paths with, the directories the build's Python distributions are installed in, and the
    static libpython Nuitka linked cnibox.bin with."""
    from nuitka.options.Options import shallUsePythonDebug, shallUseStaticLibPython
    from nuitka.PythonVersions import getLaunchingSystemPrefixPath
    from nuitka.reports.Reports import _getReportPathPrefixes  # the report's own table
    from nuitka.utils.StaticLibraries import getSystemStaticLibPythonPath

    libpython = None
    if shallUseStaticLibPython():
        libpython = getSystemStaticLibPythonPath(python_debug=shallUsePythonDebug())
    paths = sysconfig.get_paths()
    # Nuitka runs on the base interpreter; the venv that launched it holds the distributions
    # (the "venv" scheme: Debian's default one names /usr/local-style dist-packages).
    venv = getLaunchingSystemPrefixPath()
    venv_paths = (
        sysconfig.get_paths(scheme="venv", vars={"base": venv, "platbase": venv}) if venv else paths
    )
    site_dirs = [venv_paths["purelib"], venv_paths["platlib"], *([TARGET_SITE] if CROSS else [])]
    return {
        "cwd": os.getcwd(),
        "report_prefixes": [*_getReportPathPrefixes(), ("~", os.path.expanduser("~"))],
        "site_dirs": sorted(set(site_dirs)),
        "stdlib": paths["stdlib"],
        "static_libpython": os.path.realpath(libpython) if libpython else None,
    }


def _copy(src: str, dst: str, plugin: NuitkaPluginBase) -> None:
    if not os.path.exists(src):
        plugin.sysexit(f"{src} missing on the build host")
    shutil.copyfile(os.path.realpath(src), dst)
    os.chmod(dst, 0o755)  # noqa: S103 - programs and shared libraries


def _elf_files(dist_dir: str) -> list[str]:
    found = []
    for base, _dirs, files in os.walk(dist_dir):
        for name in files:
            path = os.path.join(base, name)
            if os.path.islink(path):
                continue
            with open(path, "rb") as f:
                if f.read(4) == ELF_MAGIC:
                    found.append(path)
    return sorted(found)


def elf_machine(path: str) -> str:
    """The machine an ELF file is for ("x86_64", "aarch64", or e_machine as a number)."""
    with open(path, "rb") as f:
        header = f.read(20)
    if header[:4] != ELF_MAGIC or header[5] != 1:  # little-endian only
        return "not-elf"
    machine = struct.unpack_from("<H", header, 18)[0]
    return ELF_MACHINES.get(machine, str(machine))


def _target_counterpart(rel: str) -> str | None:
    """The target's build of the dist file `rel` (an extension module or a library)."""
    name = os.path.basename(rel)
    # Extension modules keep their ABI tag or lose it (Nuitka stores `_ssl.so`).
    if BUILD_MULTIARCH in name:
        stem = name.replace(BUILD_MULTIARCH, MULTIARCH)
    elif name.endswith(".so") and not name.startswith("lib"):
        stem = name.removesuffix(".so") + f".cpython-311-{MULTIARCH}.so"
    else:
        stem = name
    candidates = [
        os.path.join(TARGET_SITE, os.path.dirname(rel), stem),
        os.path.join(TARGET_SITE, stem),
        os.path.join(TARGET_DYNLOAD, stem),
        *(os.path.join(d, name) for d in TARGET_LIBDIRS),
    ]
    return next((c for c in candidates if os.path.isfile(c)), None)


def _readelf_deps(path: str) -> list[tuple[str, str]]:
    """`_ldd` for another machine's ELF: DT_NEEDED and PT_INTERP, each resolved in the
    target's multiarch directories (never the build machine's)."""
    proc = subprocess.run(
        ["readelf", "-d", "-l", "-W", path], capture_output=True, text=True, check=True
    )
    deps = []
    interp = READELF_INTERP.search(proc.stdout)
    if interp:
        loader = os.path.join(TARGET_LIBDIRS[0], os.path.basename(interp.group(1)))
        deps.append((os.path.basename(loader), loader if os.path.exists(loader) else "not found"))
    for soname in READELF_NEEDED.findall(proc.stdout):
        found = [os.path.join(d, soname) for d in TARGET_LIBDIRS]
        deps.append((soname, next((f for f in found if os.path.exists(f)), "not found")))
    return deps


def _ldd(path: str) -> list[tuple[str, str]]:
    """(soname, resolved path or 'not found') for each dependency; the loader has no soname."""
    proc = subprocess.run(["ldd", path], capture_output=True, text=True, check=False)
    deps = []
    for line in proc.stdout.splitlines():
        missing = LDD_MISSING.match(line)
        if missing:
            deps.append((missing.group(1), "not found"))
            continue
        match = LDD_LINE.match(line)
        if not match:
            continue
        soname, where = match.group(1), match.group(2)
        if soname is None:
            if where.startswith("/"):  # the loader: "/lib64/ld-linux-x86-64.so.2 (0x...)"
                deps.append((os.path.basename(where), where))
            continue  # linux-vdso.so.1
        deps.append((soname, where))
    return deps
