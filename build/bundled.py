"""What a packed dist holds, checked and recorded (called by build/build.py's `pack` step).

- `check_machine`: every ELF file in the dist is for the target machine, and the launcher is
  a static program for it (no PT_INTERP): an arm64 file carrying one x86 library, or the
  build machine's loader, would fail only on a node.
- `write_record`: build/out/bundled-<arch>.json, the machine-readable list of what the single
  file bundles, for the SBOM (issue 14): each native file (libraries, extension modules, the
  loader, xtables extensions, the locale) with its sha256, the file it was copied from and
  the Debian package (name, version, architecture) that installed that file, as dpkg of the
  machine that built it says (the host for amd64, the toolchain root for arm64), plus the
  Python distributions compiled in. A file no package owns (pyenv's CPython modules, say) is
  recorded with `"package": null` and its source, never guessed.

Sources come from the build plugin's `bundled.json` (what build/selfcontained.py copied or
swapped) and Nuitka's `--report` XML (what Nuitka itself copied).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from build import Target

ELF_MAGIC = b"\x7fELF"
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
PT_INTERP = 3
PT_DYNAMIC = 2
# Python distributions compiled into the binary (pinned in pyproject.toml / arm64_root.py).
PYTHON_DISTRIBUTIONS = ("PyYAML", "python-iptables", "Nuitka")


def elf_header(path: Path) -> tuple[str, set[int]] | None:
    """(machine, program header types) of a little-endian ELF64 file, None if not ELF."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != ELF_MAGIC:
            return None
        if head[4] != 2 or head[5] != 1:
            return ("not-elf64-le", set())
        machine = int.from_bytes(head[18:20], "little")
        phoff = int.from_bytes(head[32:40], "little")
        phentsize = int.from_bytes(head[54:56], "little")
        phnum = int.from_bytes(head[56:58], "little")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    types = {
        int.from_bytes(table[i * phentsize : i * phentsize + 4], "little") for i in range(phnum)
    }
    return ELF_MACHINES.get(machine, f"e_machine {machine}"), types


def elf_files(dist: Path) -> list[Path]:
    return sorted(
        p for p in dist.rglob("*") if p.is_file() and not p.is_symlink() and elf_header(p)
    )


def check_machine(dist: Path, launcher: Path, machine: str) -> list[str]:
    problems = []
    for path in elf_files(dist):
        header = elf_header(path)
        if header and header[0] != machine:
            problems.append(f"{path.relative_to(dist)} is {header[0]}, not {machine}")
    header = elf_header(launcher)
    if header is None or header[0] != machine:
        problems.append(f"launcher {launcher} is not a {machine} ELF")
    elif PT_INTERP in header[1] or PT_DYNAMIC in header[1]:
        problems.append(f"launcher {launcher} is not static")
    return problems


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def nuitka_sources(report: Path) -> dict[str, str]:
    """dist-relative path -> source path, for the DLLs and extension modules Nuitka copied."""
    if not report.is_file():
        return {}
    # The report abbreviates the interpreter's prefixes (this script runs in the same
    # environment as Nuitka for a native build; a cross build's plugin record overrides).
    prefixes = {"${sys.prefix}": sys.prefix, "${sys.real_prefix}": sys.base_prefix}
    sources = {}
    for element in ET.parse(report).getroot().iter():  # noqa: S314 - Nuitka's own report
        dest, source = element.get("dest_path"), element.get("source_path")
        if dest and source:
            for variable, value in prefixes.items():
                source = source.replace(variable, value)
            sources[dest] = source
    return sources


def _dpkg_command(target: Target) -> list[str]:
    return ["chroot", str(_arm64_root().ROOT)] if target.cross else []


def dpkg_owners(target: Target, paths: list[str]) -> dict[str, tuple[str, str, str]]:
    """source path -> (package, version, architecture), for the paths dpkg knows."""
    # usrmerge: dpkg may have registered /lib/… or /usr/lib/… for the same file; ask for both.
    aliases: dict[str, str] = {}
    for path in paths:
        aliases[path] = path
        if path.startswith("/usr/lib/"):
            aliases[path.removeprefix("/usr")] = path
        elif path.startswith("/lib/"):
            aliases["/usr" + path] = path
    prefix = _dpkg_command(target)
    listing = subprocess.run(
        [*prefix, "dpkg", "-S", *sorted(aliases)], capture_output=True, text=True, check=False
    ).stdout
    owners: dict[str, str] = {}
    for line in listing.splitlines():
        package, _, path = line.partition(": ")
        if path in aliases and "," not in package:
            owners[aliases[path]] = package
    names = sorted(set(owners.values()))
    versions: dict[str, tuple[str, str]] = {}
    if names:
        query = subprocess.run(
            [*prefix, "dpkg-query", "-W", "-f", "${Package}:${Architecture}\t${Version}\n", *names],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for line in query.splitlines():
            qualified, _, version = line.partition("\t")
            name, _, arch = qualified.partition(":")
            versions[qualified] = versions[name] = (version, arch)
    result = {}
    for path, package in owners.items():
        version, arch = versions.get(package, ("", ""))
        result[path] = (package.partition(":")[0], version, arch)
    return result


def _site_packages(target: Target) -> list[str]:
    """The site-packages dirs of the environment that ran Nuitka (as seen from the host)."""
    if target.cross:
        return [str(_arm64_root().ROOT / "opt/venv/lib/python3.11/site-packages")]
    import site

    return [p for p in sys.path if p.endswith("site-packages")] or site.getsitepackages()


def _arm64_root() -> Any:
    sys.path.insert(0, str(Path(__file__).parent))
    import arm64_root

    return arm64_root


def python_distributions(target: Target) -> dict[str, str]:
    """Name -> version of the compiled-in distributions, from the environment that ran
    Nuitka (python-iptables has no metadata in the toolchain root: it is built from its
    sdist without pip, so its pinned version stands in)."""
    from importlib.metadata import distributions

    found = {
        d.metadata["Name"].lower(): d.version for d in distributions(path=_site_packages(target))
    }
    if target.cross:
        found.setdefault("python-iptables", _arm64_root().pinned("python-iptables").split("==")[1])
    return {name: found.get(name.lower(), "") for name in PYTHON_DISTRIBUTIONS}


def non_debian_owner(target: Target, source: str) -> dict[str, str] | None:
    """The package of a bundled file dpkg does not own: a Python distribution's extension
    (PyYAML's _yaml, python-iptables' libxtwrapper; the toolchain root keeps the aarch64 ones
    in /opt/arm64-site), a .deb the toolchain root unpacked without installing (libc-bin's
    locale), or the build interpreter's own CPython (pyenv's, for amd64)."""
    versions = python_distributions(target)
    name = os.path.basename(source)
    if name.startswith("libxtwrapper"):
        return {"type": "pypi", "name": "python-iptables", "version": versions["python-iptables"]}
    if name.startswith("_yaml."):
        return {"type": "pypi", "name": "PyYAML", "version": versions["PyYAML"]}
    if target.cross:
        root = _arm64_root()
        if source.startswith(root.LIBC_BIN + "/"):
            debs = (root.ROOT / root.DOWNLOADS.lstrip("/")).glob("libc-bin_*_arm64.deb")
            version = next(debs).name.split("_")[1]
            return {"type": "deb", "name": "libc-bin", "version": version, "architecture": "arm64"}
        return None
    if source.startswith(sys.base_prefix + "/"):
        return {"type": "cpython", "name": "CPython", "version": platform.python_version(),
                "origin": sys.base_prefix}  # fmt: skip
    return None


def write_record(target: Target) -> Path:
    dist = target.dist
    plugin = json.loads((target.out / "bundled.json").read_text())["sources"]
    sources = {**nuitka_sources(target.out / "nuitka-report.xml"), **plugin}
    for rel, source in list(sources.items()):  # "dist:REL": a copy of another dist file
        if source.startswith("dist:"):
            sources[rel] = sources.get(source.removeprefix("dist:"), source)
    files = [p for p in elf_files(dist) if p.name != "cnibox.bin"]
    files += sorted((dist / "locale").rglob("*"))
    files = [p for p in files if p.is_file()]
    rels = [str(p.relative_to(dist)) for p in files]
    owners = dpkg_owners(target, sorted({sources[r] for r in rels if r in sources}))
    entries: list[dict[str, Any]] = []
    for path, rel in zip(files, rels, strict=True):
        source = sources.get(rel)
        package: dict[str, str] | None = None
        if source in owners:
            name, version, arch = owners[source]
            package = {"type": "deb", "name": name, "version": version, "architecture": arch}
        elif source:
            package = non_debian_owner(target, source)
        entries.append({"path": rel, "sha256": _sha256(path), "source": source, "package": package})
    debs = sorted({(e["package"]["name"], e["package"]["version"], e["package"]["architecture"])
                   for e in entries if e["package"] and e["package"]["type"] == "deb"})  # fmt: skip
    record = {
        "arch": target.arch,
        "machine": target.machine,
        "artifact": os.path.relpath(target.artifact, Path(__file__).resolve().parent.parent),
        "artifact_sha256": _sha256(target.artifact) if target.artifact.is_file() else None,
        "dpkg": "build/out/arm64-root" if target.cross else "build host",
        "debian_packages": [{"name": n, "version": v, "architecture": a} for n, v, a in debs],
        "python_distributions": [
            {"name": n, "version": v} for n, v in python_distributions(target).items()
        ],
        "files": entries,
    }
    out = Path(__file__).resolve().parent / "out" / f"bundled-{target.arch}.json"
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return out
