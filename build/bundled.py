"""What a packed single file holds: checked, attributed, recorded (build/binary.py's `pack` step).

- `check_machine`: every ELF file in the dist is for the target machine, and the launcher is
  a static program for it (no PT_INTERP): an arm64 file carrying one x86 library, or the
  build machine's loader, would fail only on a node.
- `write_record`: build/out/bundled-<arch>.json, the one attribution of everything the single
  file carries (packaging/sbom.py only turns it into CycloneDX; there is no other):
  * every file of the dist, with its sha256, the file the build copied it from and the
    component that installed that file; the copy is verified (same bytes, or the same GNU
    build-id for the libraries Nuitka patches with an RPATH);
  * what was linked in: the static libpython in cnibox.bin, musl's libc.a in the launcher;
  * every Python module compiled into cnibox.bin (Nuitka's `--report`), with its source file
    and component, so the SBOM lists the Python code that is really there, not a list kept
    by hand; a Python distribution compiled in that cnibox does not declare as a run-time
    dependency (pyproject.toml) fails the build, naming its modules.

Where a source comes from: build/selfcontained.py's `bundled.json` (what the plugin copied or
swapped, and the build's environment: the report's path prefixes, the site directories, the
static libpython) and Nuitka's report (what Nuitka copied, and the modules). Who owns a source,
first answer wins: cnibox (a file of the repository), the Debian package dpkg names (`dpkg-query
--root ROOT -S`: the host's dpkg for amd64, the toolchain root's for arm64), the Python
distribution whose RECORD lists it, CPython itself (a non-Debian interpreter: pyenv's, for
amd64). A file or module nobody owns fails the build, named.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import Distribution, distributions
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from binary import Target

REPO = Path(__file__).resolve().parent.parent
RECORD_FORMAT = 2
ELF_MAGIC = b"\x7fELF"
ELF_MACHINES = {62: "x86_64", 183: "aarch64"}
PT_INTERP = 3
PT_DYNAMIC = 2
PT_NOTE = 4
NT_GNU_BUILD_ID = 3
# The dist file Nuitka writes itself (its compiled code is described module by module).
MAIN_BINARY = "cnibox.bin"


class AttributionError(Exception):
    """A file or module of the single file has no verified source or no owner."""


# --- ELF -----------------------------------------------------------------------------------------


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


def elf_build_id(path: Path) -> str | None:
    """The GNU build-id note of a little-endian ELF64 file (its PT_NOTE segments), hex.

    Nuitka adds an RPATH to the libraries it copies (patchelf), so those copies differ from
    their source in bytes; the build-id, a hash the linker wrote, stays the same."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != ELF_MAGIC or head[4] != 2 or head[5] != 1:
            return None
        phoff = int.from_bytes(head[32:40], "little")
        phentsize = int.from_bytes(head[54:56], "little")
        phnum = int.from_bytes(head[56:58], "little")
        for index in range(phnum):
            f.seek(phoff + index * phentsize)
            entry = f.read(phentsize)
            if int.from_bytes(entry[0:4], "little") != PT_NOTE:
                continue
            offset = int.from_bytes(entry[8:16], "little")
            size = int.from_bytes(entry[32:40], "little")
            f.seek(offset)
            found = _gnu_build_id(f.read(min(size, 1 << 16)))
            if found:
                return found
    return None


def _gnu_build_id(notes: bytes) -> str | None:
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, kind = (int.from_bytes(notes[pos + i : pos + i + 4], "little")
                                for i in (0, 4, 8))  # fmt: skip
        name_end = pos + 12 + namesz
        desc_start = name_end + (-namesz % 4)
        if kind == NT_GNU_BUILD_ID and notes[pos + 12 : name_end] == b"GNU\0":
            return notes[desc_start : desc_start + descsz].hex()
        pos = desc_start + descsz + (-descsz % 4)
    return None


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


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- the build's world, as this machine sees it --------------------------------------------------


@dataclass(frozen=True, slots=True)
class BuildWorld:
    """Where the build ran: paths it recorded are inside `root` on this machine (`/` for the
    native build, the toolchain root for a cross build), except the repository, which the
    build saw at `cwd` (the toolchain root mounts it at /src)."""

    root: Path
    cwd: str
    report_prefixes: tuple[tuple[str, str], ...]  # Nuitka's "${sys.prefix}" … -> build paths
    site_dirs: tuple[str, ...]  # build paths of the installed Python distributions
    stdlib: str  # the build interpreter's standard library directory
    static_libpython: str | None

    @classmethod
    def from_plugin(cls, build: Mapping[str, Any], root: Path) -> BuildWorld:
        return cls(
            root=root,
            cwd=build["cwd"],
            report_prefixes=tuple((name, path) for name, path in build["report_prefixes"]),
            site_dirs=tuple(build["site_dirs"]),
            stdlib=build["stdlib"],
            static_libpython=build["static_libpython"],
        )

    def in_repo(self, path: str) -> bool:
        return _below(path, self.cwd)

    def is_cnibox(self, path: str) -> bool:
        """cnibox's own: a file of the repository (its sources, what its build wrote), not of
        a Python environment that happens to live there (the worktree's .venv)."""
        return self.in_repo(path) and not any(_below(path, d) for d in self.site_dirs)

    def host_path(self, path: str) -> Path:
        """A path the build recorded, on this machine."""
        if self.in_repo(path):
            return REPO / os.path.relpath(path, self.cwd)
        return self.root / path.lstrip("/") if self.root != Path("/") else Path(path)

    def expand(self, reported: str) -> str:
        """A --report path ("${sys.prefix}/lib/…") as the build saw it."""
        for name, path in self.report_prefixes:
            if reported == name or reported.startswith(name + "/"):
                return path + reported[len(name) :]
        return reported


def _below(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


# --- sources -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Report:
    """What Nuitka's --report says: the files it copied and the modules it compiled."""

    nuitka_version: str
    python_version: str
    copies: dict[str, str]  # dist-relative path -> reported source path
    modules: dict[str, tuple[str, str]]  # module name -> (kind, reported source path)


def read_report(path: Path) -> Report:
    root = ET.parse(path).getroot()  # noqa: S314 - Nuitka's own report of this build
    copies = {}
    for tag in ("included_dll", "included_extension"):
        for element in root.iter(tag):
            copies[element.get("dest_path", "")] = element.get("source_path", "")
    for element in root.iter("data_file"):
        copies[element.get("name", "")] = element.get("source", "")
    modules = {}
    for element in root.iter("module"):
        name, source = element.get("name"), element.get("source_path")
        if name is None or source is None:
            raise AttributionError(f"{path}: a <module> without name or source_path")
        modules[name] = (element.get("kind", ""), source)
    python = root.find("python")
    return Report(
        nuitka_version=root.get("nuitka_version", ""),
        python_version=python.get("python_version", "") if python is not None else "",
        copies=copies,
        modules=modules,
    )


# --- owners --------------------------------------------------------------------------------------


def dpkg_query(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["dpkg-query", f"--root={root}", *args], capture_output=True, text=True, check=False
    )


def usr_merge_aliases(path: str) -> list[str]:
    """The names dpkg may have recorded for a file on a merged-/usr system."""
    names = [path]
    for short in ("/lib/", "/lib64/", "/bin/", "/sbin/"):
        if path.startswith("/usr" + short):
            names.append(path.removeprefix("/usr"))
        elif path.startswith(short):
            names.append("/usr" + path)
    return names


def dpkg_owners(root: Path, paths: Iterable[str]) -> dict[str, str]:
    """Build path -> owning package ("libc6:arm64"), for the paths dpkg knows."""
    aliases = {alias: path for path in paths for alias in usr_merge_aliases(path)}
    if not aliases:
        return {}
    listing = dpkg_query(root, "-S", *sorted(aliases)).stdout
    owners: dict[str, str] = {}
    for line in listing.splitlines():
        if line.startswith(("diversion ", "local diversion")) or ": " not in line:
            continue
        packages, _, path = line.partition(": ")
        # "a, b": a file several packages ship (a multiarch package of both architectures
        # lists both): the first is as good as the others, they are the same file.
        if path in aliases and aliases[path] not in owners:
            owners[aliases[path]] = packages.split(",")[0].strip()
    return owners


def dpkg_package(root: Path, qualified: str) -> dict[str, Any]:
    """A Debian component from dpkg's database: version, architecture, source, licenses."""
    fields = "${Package}\t${Version}\t${Architecture}\t${source:Package}\t${source:Version}\t"
    fields += "${Homepage}\n"
    proc = dpkg_query(root, "-W", f"-f={fields}", qualified)
    rows = [line.split("\t") for line in proc.stdout.splitlines() if line]
    if proc.returncode != 0 or len(rows) != 1:
        raise AttributionError(f"dpkg-query -W {qualified}: {proc.stderr.strip() or rows}")
    name, version, arch, source, source_version, homepage = rows[0]
    return {
        "type": "deb",
        "name": name,
        "version": version,
        "architecture": arch,
        "source": source or name,
        "source_version": source_version or version,
        "homepage": homepage,
        "licenses": dep5_licenses(root / "usr/share/doc" / name / "copyright"),
        "copyright_file": f"/usr/share/doc/{name}/copyright",
    }


def _unpacked_tree(source: str, trees: Iterable[str]) -> str | None:
    return next((tree for tree in trees if _below(source, tree)), None)


def unpacked_package(world: BuildWorld, tree: str, deb: str, source: str) -> dict[str, Any]:
    """The Debian component of a file of `tree`, which the build unpacked from `deb` (its
    fields by `dpkg-deb -f`, the file checked against `dpkg-deb -c`)."""
    archive = world.host_path(deb)
    member = "./" + os.path.relpath(source, tree)
    listing = _dpkg_deb("-c", archive)
    if not any(line.split()[-1] == member for line in listing.splitlines() if line.strip()):
        raise AttributionError(f"{source}: not a file of {deb}, the tree's .deb")
    fields = ("Package", "Version", "Architecture", "Source", "Homepage")
    lines = _dpkg_deb("-f", archive, *fields).splitlines()  # "Field: value", those it has
    values = {key: value for key, _, value in (line.partition(": ") for line in lines)}
    name, version = values["Package"], values["Version"]
    source_name, _, source_version = values.get("Source", "").partition(" (")
    return {
        "type": "deb",
        "name": name,
        "version": version,
        "architecture": values["Architecture"],
        "source": source_name or name,
        "source_version": source_version.rstrip(")") or version,
        "homepage": values.get("Homepage", ""),
        "licenses": dep5_licenses(world.host_path(tree) / "usr/share/doc" / name / "copyright"),
        "copyright_file": f"/usr/share/doc/{name}/copyright",
        "archive": os.path.basename(deb),
    }


def _dpkg_deb(*args: str | Path) -> str:
    proc = subprocess.run(
        ["dpkg-deb", *map(str, args)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise AttributionError(f"dpkg-deb {' '.join(map(str, args))}: {proc.stderr.strip()}")
    return proc.stdout


def dep5_licenses(copyright_file: Path) -> list[str]:
    """Short license names of a machine-readable (DEP-5) Debian copyright file; [] if it is not
    one (glibc's, for instance, is free text)."""
    try:
        text = copyright_file.read_text(errors="replace")
    except OSError:
        return []
    if not text.startswith("Format:"):
        return []
    return sorted({n.strip() for n in re.findall(r"^License:[ \t]*(\S[^\n]*)$", text, re.M)})


def os_release(root: Path) -> str:
    """ROOT's distribution as the purl `distro` qualifier wants it ("debian-12")."""
    values: dict[str, str] = {}
    for path in (root / "etc/os-release", root / "usr/lib/os-release"):
        if path.is_file():
            for line in path.read_text().splitlines():
                key, _, value = line.partition("=")
                values[key] = value.strip().strip('"')
            break
    return f"{values.get('ID', 'debian')}-{values.get('VERSION_ID', '')}"


def canonical_name(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


class Distributions:
    """The Python distributions installed where the build looked (its site directories), and
    which one's RECORD lists a file."""

    def __init__(self, world: BuildWorld) -> None:
        dirs = [str(world.host_path(d)) for d in world.site_dirs]
        self.by_name: dict[str, Distribution] = {}
        self.by_file: dict[str, str] = {}
        for dist in distributions(path=[d for d in dirs if os.path.isdir(d)]):
            name = canonical_name(dist.metadata["Name"])
            # A cross build has a distribution twice: in the venv (the code Nuitka compiles)
            # and in the target's site (its aarch64 extension); one release of it, or which?
            known = self.by_name.setdefault(name, dist)
            if known.version != dist.version:
                raise AttributionError(
                    f"{dist.metadata['Name']} is installed as {known.version} and as "
                    f"{dist.version} in the build's site directories ({', '.join(dirs)})"
                )
            base = os.path.normpath(dist.locate_file(""))
            for entry in dist.files or []:
                path = os.path.normpath(dist.locate_file(entry))
                self.by_file.setdefault(path, name)
                # Its directories too, below the site directory: Nuitka reports a namespace
                # package (no __init__.py) by its directory.
                parent = os.path.dirname(path)
                while parent.startswith(base + "/"):
                    self.by_file.setdefault(parent, name)
                    parent = os.path.dirname(parent)

    def owner(self, host_path: Path) -> str | None:
        return self.by_file.get(os.path.normpath(host_path))

    def component(self, name: str) -> dict[str, Any]:
        meta = self.by_name[name].metadata
        return {
            "type": "pypi",
            "name": meta["Name"],
            "version": meta["Version"],
            "license": python_license(meta),
            "homepage": meta.get("Home-page") or "",
        }

    def runtime_closure(self, declared: Iterable[str]) -> set[str]:
        """The declared run-time distributions and what they require (installed ones)."""
        found: set[str] = set()
        todo = [canonical_name(n) for n in declared]
        while todo:
            name = todo.pop()
            if name in found:
                continue
            found.add(name)
            dist = self.by_name.get(name)
            for requirement in (dist.requires or []) if dist else []:
                if "extra ==" not in requirement:
                    todo.append(canonical_name(requirement_name(requirement)))
        return found


def python_license(meta: Any) -> str:
    expressions = meta.get_all("License-Expression") or []
    if expressions:
        return str(expressions[0])
    known = {
        "License :: OSI Approved :: Apache Software License": "Apache-2.0",
        "License :: OSI Approved :: MIT License": "MIT",
        "License :: OSI Approved :: BSD License": "BSD-3-Clause",
    }
    for classifier in meta.get_all("Classifier") or []:
        if classifier in known:
            return known[classifier]
    return str((meta.get_all("License") or [""])[0])


def requirement_name(requirement: str) -> str:
    """The distribution a requirement names ("PyYAML==6.0.4; …" -> "PyYAML")."""
    return re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0]


def declared_dependencies() -> list[str]:
    """cnibox's run-time dependencies as pyproject.toml pins them (names only)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [requirement_name(r) for r in project["dependencies"]]


# --- the record ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inputs:
    """Everything one record is made from (write_record fills it from a Target)."""

    arch: str
    machine: str
    dist: Path
    plugin_record: Path  # build/selfcontained.py's bundled.json
    report: Path  # Nuitka's --report
    root: Path  # where the build's paths are on this machine
    launcher_libc: str  # musl's libc.a the launcher is linked with (a build path)
    artifact: Path
    version: str
    # Trees the build unpacked from a .deb without installing it (build paths: tree -> .deb):
    # the toolchain root's libc-bin:arm64, whose C.utf8 locale the arm64 dist bundles.
    unpacked_debs: Mapping[str, str] = field(default_factory=dict)


def make_record(inputs: Inputs) -> dict[str, Any]:
    """The attribution of one build; AttributionError names whatever has no owner."""
    plugin = json.loads(inputs.plugin_record.read_text())
    world = BuildWorld.from_plugin(plugin["build"], inputs.root)
    report = read_report(inputs.report)
    files, linked = _files(inputs, world, report, plugin["sources"])
    # Extension modules are files of the dist (above, with the source a cross build swapped in).
    modules = [
        {"name": name, "kind": kind, "source": world.expand(source)}
        for name, (kind, source) in sorted(report.modules.items())
        if kind != "PythonExtensionModule"
    ]
    entries: list[dict[str, Any]] = [*files, *linked, *modules]
    python = Distributions(world)
    components = _attribute(entries, world, report, python, inputs)
    _check_python_distributions(components, entries, python)
    return {
        "format": RECORD_FORMAT,
        "arch": inputs.arch,
        "machine": inputs.machine,
        "version": inputs.version,
        "distro": os_release(inputs.root),
        "dpkg_root": str(inputs.root),
        "artifact": os.path.relpath(inputs.artifact, REPO),
        "artifact_sha256": sha256_file(inputs.artifact),
        "components": components,
        "files": files,
        "linked": linked,
        "modules": modules,
    }


def _files(
    inputs: Inputs, world: BuildWorld, report: Report, plugin_sources: Mapping[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each dist file with its verified source; what was linked in."""
    sources = {rel: world.expand(src) for rel, src in report.copies.items()}
    sources.update(plugin_sources)  # the plugin's swaps and copies win over Nuitka's report
    for rel, source in list(sources.items()):  # "dist:REL": a copy of another dist file
        if source.startswith("dist:"):
            sources[rel] = sources.get(source.removeprefix("dist:"), source)
    files: list[dict[str, Any]] = []
    problems: list[str] = []
    dist_files = sorted(p for p in inputs.dist.rglob("*") if p.is_file() and not p.is_symlink())
    for path in dist_files:
        rel = path.relative_to(inputs.dist).as_posix()
        digest = sha256_file(path)
        entry: dict[str, Any] = {"path": f"dist/{rel}", "sha256": digest}
        if rel == MAIN_BINARY:
            files.append({**entry, "source": None, "component": "cnibox"})
            continue
        source = sources.get(rel)
        if source is None:
            problems.append(f"dist/{rel}: the build recorded no source for it")
            continue
        match = _same_file(path, digest, world.host_path(source))
        if match is None:
            problems.append(f"dist/{rel}: differs from its recorded source {source}")
            continue
        files.append({**entry, "source": source, "match": match})
    if problems:
        raise AttributionError("; ".join(problems))
    linked = []
    for into, source in (
        ("launcher", inputs.launcher_libc),
        (f"dist/{MAIN_BINARY}", world.static_libpython),
    ):
        if source is not None:
            host = world.host_path(source)
            if not host.is_file():
                raise AttributionError(f"{into}: linked with {source}, which is missing")
            linked.append({"into": into, "source": source, "sha256": sha256_file(host)})
    return files, linked


def _same_file(copy: Path, digest: str, source: Path) -> str | None:
    """How `copy` is `source`: "identical", or "build-id" (an ELF Nuitka patched); None if not."""
    if not source.is_file():
        return None
    if source.stat().st_size == copy.stat().st_size and sha256_file(source) == digest:
        return "identical"
    build_id = elf_build_id(copy)
    if build_id is not None and elf_build_id(source) == build_id:
        return "build-id"
    return None


def _attribute(
    entries: list[dict[str, Any]],
    world: BuildWorld,
    report: Report,
    python: Distributions,
    inputs: Inputs,
) -> dict[str, dict[str, Any]]:
    """Set each entry's "component" (first owner wins: cnibox, dpkg, an unpacked .deb, a
    RECORD, CPython); returns the components by key."""
    components: dict[str, dict[str, Any]] = {
        "cnibox": {"type": "cnibox", "name": "cnibox", "version": inputs.version},
        "nuitka": {"type": "nuitka", "name": "Nuitka", "version": report.nuitka_version},
        "zstd": {"type": "zstd", "name": "zstd", "version": nuitka_zstd_version(world)},
    }
    pending = [e for e in entries if "component" not in e]
    for entry in pending:
        if world.is_cnibox(entry["source"]) or _plugin_code(entry, world):
            entry["component"] = "cnibox"
    pending = [e for e in pending if "component" not in e]
    packages = dpkg_owners(world.root, {e["source"] for e in pending})
    deb_keys: dict[str, str] = {}  # dpkg's name ("libc6:amd64", "iptables") -> component key
    problems = []
    for entry in pending:
        source = entry["source"]
        if source in packages:
            qualified = packages[source]
            if qualified not in deb_keys:
                package = dpkg_package(world.root, qualified)
                deb_keys[qualified] = f"deb:{package['name']}:{package['architecture']}"
                components[deb_keys[qualified]] = package
            key = deb_keys[qualified]
        elif (tree := _unpacked_tree(source, inputs.unpacked_debs)) is not None:
            package = unpacked_package(world, tree, inputs.unpacked_debs[tree], source)
            key = f"deb:{package['name']}:{package['architecture']}"
            components.setdefault(key, package)
        elif (name := python.owner(world.host_path(source))) is not None:
            key = f"pypi:{name}"
            components.setdefault(key, python.component(name))
        elif _below(source, world.stdlib):
            # A CPython no Debian package installed (pyenv's): its stdlib, extension modules
            # and static libpython live under its standard library directory.
            key = "cpython"
            version = report.python_version
            cpython = {"type": "cpython", "name": "cpython", "version": version}
            components.setdefault(key, {**cpython, "origin": world.stdlib})
        else:
            what = entry.get("path") or entry.get("name") or entry.get("into")
            problems.append(f"{what} (from {source}): no package, distribution or CPython owns it")
            continue
        entry["component"] = key
    if problems:
        raise AttributionError("; ".join(problems))
    return dict(sorted(components.items()))


def _plugin_code(entry: Mapping[str, Any], world: BuildWorld) -> bool:
    """Code a Nuitka plugin runs around a module's import ("inspect-postLoad"): Nuitka
    reports it under a made-up path beside that module (no such file exists), so it would
    pass for the module's owner. The only such code in the single file is cnibox's own
    build plugin's (build/lazy_inspect.py); tests/arm64/test_sbom.py fails if another
    appears there as CPython's."""
    name = str(entry.get("name") or "")
    generated = name.endswith(("-preLoad", "-postLoad"))
    return generated and not world.host_path(entry["source"]).exists()


def _check_python_distributions(
    components: Mapping[str, Mapping[str, Any]],
    entries: list[dict[str, Any]],
    python: Distributions,
) -> None:
    """Every Python distribution in the single file (a module compiled in, a file bundled) is
    one cnibox declares as a run-time dependency, or one they require."""
    declared = python.runtime_closure(declared_dependencies())
    by_component: dict[str, list[str]] = {}
    for entry in entries:
        what = entry.get("name") or entry.get("path") or entry.get("into")
        by_component.setdefault(entry["component"], []).append(str(what))
    problems = []
    for key, names in sorted(by_component.items()):
        component = components[key]
        if component["type"] == "pypi" and canonical_name(component["name"]) not in declared:
            shown = ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
            problems.append(f"{component['name']} {component['version']} ({shown})")
    if problems:
        raise AttributionError(
            "Python distributions compiled into cnibox.bin that pyproject.toml does not declare "
            "as run-time dependencies (declare them, or keep them out of the build): "
            + "; ".join(problems)
        )


def nuitka_zstd_version(world: BuildWorld) -> str:
    """The zstd decoder compiled into the launcher: the inline copy of the build's Nuitka."""
    for site in world.site_dirs:
        header = world.host_path(site) / "nuitka/build/inline_copy/zstd/zstd.h"
        if header.is_file():
            text = header.read_text()
            parts = re.findall(r"#define ZSTD_VERSION_(?:MAJOR|MINOR|RELEASE)\s+(\d+)", text)
            return ".".join(parts)
    raise AttributionError("no Nuitka inline copy of zstd in the build's site directories")


def write_record(target: Target) -> Path:
    """Attribute the packed dist of `target` into build/out/bundled-<arch>.json."""
    inputs = Inputs(
        arch=target.arch,
        machine=target.machine,
        dist=target.dist,
        plugin_record=target.out / "bundled.json",
        report=target.out / "nuitka-report.xml",
        root=target.build_root,
        launcher_libc=target.launcher_libc,
        artifact=target.artifact,
        version=_version(),
        unpacked_debs=target.unpacked_debs,
    )
    record = make_record(inputs)
    out = REPO / "build" / "out" / f"bundled-{target.arch}.json"
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return out


def _version() -> str:
    sys.path.insert(0, str(REPO))
    from multicall import __version__

    return __version__
