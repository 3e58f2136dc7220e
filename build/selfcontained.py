"""Nuitka user plugin: make the standalone dist independent of the host's libraries.

Loaded with `--user-plugin=build/selfcontained.py`. When Nuitka has finished the dist it

1. stages python-iptables' libraries: `iptlibs/` (libip4tc.so, libip6tc.so, libxtables.so.12,
   libxtwrapper) and `xtables/` (every libxt_*/libipt_*/libip6t_* extension), the layout
   `multicall.effects.bundle.prepare_iptc()` expects at the dist root;
2. copies glibc's `C.utf8` locale to `locale/C.utf8` (the launcher sets LOCPATH to it:
   Nuitka's runtime aborts under LANG=C.UTF-8 without a usable locale);
3. walks every ELF file with `ldd` and copies each library resolved outside the dist, the
   glibc loader included, into the dist root, so nothing is loaded from the host.

Why a plugin: Nuitka treats glibc, libz and friends as system libraries and never bundles
them, and it has no Linux option to do so (docs/binary.md, "Why not stock Nuitka onefile").
Host paths come from environment variables so CI machines with another multiarch layout can
override them.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess

from nuitka.plugins.PluginBase import NuitkaPluginBase

MULTIARCH = os.environ.get("CNIBOX_MULTIARCH", f"{platform.machine()}-linux-gnu")
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
LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(\S+)\s+\(0x[0-9a-f]+\)$")
LDD_MISSING = re.compile(r"^\s*(\S+)\s+=>\s+not found$")
ELF_MAGIC = b"\x7fELF"


class CniboxSelfContained(NuitkaPluginBase):
    plugin_name = "cnibox-selfcontained"
    plugin_desc = "Bundle glibc, its loader, libz, python-iptables' libraries and a C.utf8 locale."

    @staticmethod
    def isAlwaysEnabled() -> bool:
        return True

    def onStandaloneDistributionFinished(self, dist_dir: str) -> None:
        self._stage_iptables(dist_dir)
        self._stage_locale(dist_dir)
        copied = self._bundle_host_libraries(dist_dir)
        self.info(f"bundled host libraries: {', '.join(sorted(copied)) or 'none'}")

    def _stage_iptables(self, dist_dir: str) -> None:
        iptlibs = os.path.join(dist_dir, "iptlibs")
        xtables = os.path.join(dist_dir, "xtables")
        os.makedirs(iptlibs, exist_ok=True)
        os.makedirs(xtables, exist_ok=True)
        for name, host in IPTLIBS.items():
            _copy(os.path.join(LIBDIR, host), os.path.join(iptlibs, name), self)
        for wrapper in glob.glob(os.path.join(dist_dir, "libxtwrapper*.so")):
            shutil.copy2(wrapper, iptlibs)
        extensions = sorted(glob.glob(os.path.join(XTABLES_DIR, "*.so")))
        if not extensions:
            self.sysexit(f"no xtables extensions in {XTABLES_DIR} (install libxtables12/iptables)")
        for ext in extensions:
            _copy(ext, os.path.join(xtables, os.path.basename(ext)), self)

    def _stage_locale(self, dist_dir: str) -> None:
        if not os.path.isdir(LOCALE_DIR):
            self.sysexit(f"{LOCALE_DIR} missing (Debian's libc-bin ships it)")
        target = os.path.join(dist_dir, "locale", "C.utf8")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(LOCALE_DIR, target, symlinks=False)

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
                    _copy(path, target, self)
                copied.add(name)

    def _outside_libraries(self, dist_dir: str) -> set[str]:
        real_dist = os.path.realpath(dist_dir)
        # Sonames satisfied inside the dist (iptlibs/ is loaded first by python-iptables).
        present = set(os.listdir(dist_dir)) | set(os.listdir(os.path.join(dist_dir, "iptlibs")))
        outside: set[str] = set()
        for elf in _elf_files(dist_dir):
            for soname, path in _ldd(elf):
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
