"""CycloneDX SBOM of everything the single file carries:

    sbom.py --dist DIR [--arch amd64|arm64] [--root /] [--launcher-libc FILE] --out FILE

The single file (docs/binary.md) is a static musl launcher followed by the packed Nuitka
standalone dist. Every file of that dist is attributed to exactly one component, or the run
fails naming the files nobody owns:

- a copy of a file a Debian package installed (glibc and its loader, OpenSSL, zlib, the
  iptables libraries and xtables extensions, the C.utf8 locale, ...): the host file with the
  same content is found by name in the architecture's library directories under ROOT, and
  `dpkg-query --root ROOT -S` names its package (package, version, architecture, source);
- a file of the Python installation that ran the build (libpython, extension modules) or of
  an installed Python distribution (python-iptables' libxtwrapper): CPython or that
  distribution, unless dpkg owns the file (a Debian Python);
- cnibox.bin and the dist's own data: cnibox itself.
The launcher adds musl's libc.a (its Debian package, by dpkg) and the zstd decoder from
Nuitka's inline copy. The Python code compiled into cnibox.bin adds CPython's standard
library, Nuitka's runtime, and each distribution cnibox requires at run time.

Inputs are explicit (dist directory, architecture, ROOT of the dpkg database the libraries
came from) so that a cross build (arm64: its own root) produces its own SBOM the same way.
The output is reproducible: the build's timestamp (provenance.py: SOURCE_DATE_EPOCH, else the
commit time of HEAD), a serial number derived from
the content, sorted components.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import struct
import subprocess
import sys
import sysconfig
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cyclonedx.model import ExternalReference, ExternalReferenceType, Property, XsUri
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.dependency import Dependency
from cyclonedx.model.license import DisjunctiveLicense, LicenseExpression
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import provenance  # noqa: E402  # packaging/, beside this file

from multicall import __version__  # noqa: E402  # the repository root, added just above

SCHEMA = SchemaVersion.V1_6
MEDIA_TYPE = "application/vnd.cyclonedx+json"
TRIPLETS = {"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}
MUSL_TRIPLETS = {"amd64": "x86_64-linux-musl", "arm64": "aarch64-linux-musl"}
ELF_MAGIC = b"\x7fELF"
PT_NOTE, NT_GNU_BUILD_ID = 4, 3
# Files of the dist that cnibox's build writes itself (the rest are copies).
OWN_FILES = ("cnibox.bin", "dataclasses.marshal")
# The locale the build copies (build/selfcontained.py) and where it lives on the host.
LOCALE_DIST, LOCALE_HOST = "locale/C.utf8", "usr/lib/locale/C.utf8"


class SbomError(Exception):
    """The dist holds something no component accounts for, or a tool failed."""


@dataclass(frozen=True, slots=True)
class DebPackage:
    name: str  # binary package, without the architecture qualifier
    version: str
    arch: str
    source: str
    source_version: str
    homepage: str
    licenses: tuple[str, ...]  # DEP-5 short names from its copyright file, if machine-readable


@dataclass(frozen=True, slots=True)
class Attribution:
    """A file of the dist (or of the launcher) and what it is a copy of."""

    path: str  # inside the single file: "dist/<relative path>" or "launcher/..."
    sha256: str
    owner: str  # component key: "deb:<package>", "pypi:<name>", "cpython", "cnibox", ...
    host_file: str = ""


@dataclass(slots=True)
class Inventory:
    """Everything found, before it becomes CycloneDX."""

    attributions: list[Attribution] = field(default_factory=list)
    packages: dict[str, DebPackage] = field(default_factory=dict)
    distributions: dict[str, str] = field(default_factory=dict)  # name -> version


# --- the dist ------------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def dist_files(dist: Path) -> list[Path]:
    """Regular files of the dist, relative, sorted (symlinks point at files listed anyway)."""
    found = [p.relative_to(dist) for p in dist.rglob("*") if p.is_file() and not p.is_symlink()]
    if not found:
        raise SbomError(f"{dist}: no files (not a Nuitka dist?)")
    return sorted(found)


def library_dirs(root: Path, arch: str) -> list[Path]:
    """Where the build copied shared libraries from, for this architecture."""
    triplet = TRIPLETS[arch]
    dirs = [f"usr/lib/{triplet}", f"lib/{triplet}", f"usr/lib/{triplet}/xtables", "usr/lib", "lib"]
    return [root / d for d in dirs if (root / d).is_dir()]


def python_dirs() -> list[Path]:
    """The build interpreter's installation and the venv's packages."""
    dirs = {
        Path(sys.base_prefix) / "lib",
        Path(sysconfig.get_paths()["platstdlib"]),
        Path(sysconfig.get_paths()["purelib"]),
        Path(sysconfig.get_paths()["platlib"]),
    }
    dynload = Path(sysconfig.get_paths()["stdlib"]) / "lib-dynload"
    dirs.add(dynload)
    return sorted(d for d in dirs if d.is_dir())


def host_candidates(rel: Path, dirs: Sequence[Path]) -> list[Path]:
    """Host files a dist file may be a copy of: same name, a versioned name
    (iptlibs/libip4tc.so <- libip4tc.so.2), or an extension module's full name
    (_ssl.so <- _ssl.cpython-311-x86_64-linux-gnu.so), beside it or in its package's directory
    (yaml/_yaml.so <- site-packages/yaml/_yaml.cpython-311-x86_64-linux-gnu.so)."""
    name = rel.name
    patterns = [name, f"{name}.*"]
    if name.endswith(".so"):
        patterns.append(f"{name.removesuffix('.so')}.*.so")
    found: list[Path] = []
    for base in dirs:
        for directory in dict.fromkeys((base, base / rel.parent)):
            names = _listing(directory)
            for pattern in patterns:
                found += [directory / n for n in sorted(fnmatch.filter(names, pattern))]
    return [p for p in found if p.is_file()]


@functools.cache
def _listing(directory: Path) -> tuple[str, ...]:
    try:
        return tuple(os.listdir(directory))
    except OSError:
        return ()


def elf_build_id(path: Path) -> str | None:
    """The GNU build-id note of an ELF file (from its PT_NOTE segments), hex; None if none.

    Nuitka adds an RPATH to the libraries it copies (patchelf), so those copies differ from
    the host file in bytes; the build-id, a hash the linker wrote, stays the same."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != ELF_MAGIC or len(head) < 64:
            return None
        wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
        if wide:
            phoff, phentsize, phnum = (
                struct.unpack_from(order + "Q", head, 32)[0],
                *struct.unpack_from(order + "HH", head, 54),
            )
        else:
            phoff, phentsize, phnum = (
                struct.unpack_from(order + "I", head, 28)[0],
                *struct.unpack_from(order + "HH", head, 42),
            )
        for index in range(phnum):
            f.seek(phoff + index * phentsize)
            entry = f.read(phentsize)
            if struct.unpack_from(order + "I", entry, 0)[0] != PT_NOTE:
                continue
            if wide:
                offset, size = (
                    struct.unpack_from(order + "Q", entry, 8)[0],
                    struct.unpack_from(order + "Q", entry, 32)[0],
                )
            else:
                offset, size = (
                    struct.unpack_from(order + "II", entry, 4)[0],
                    struct.unpack_from(order + "I", entry, 16)[0],
                )
            f.seek(offset)
            notes = f.read(min(size, 1 << 16))
            found = _gnu_build_id(notes, order)
            if found:
                return found
    return None


def _gnu_build_id(notes: bytes, order: str) -> str | None:
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from(order + "III", notes, pos)
        name_end = pos + 12 + namesz
        desc_start = name_end + (-namesz % 4)
        if kind == NT_GNU_BUILD_ID and notes[pos + 12 : name_end] == b"GNU\0":
            return notes[desc_start : desc_start + descsz].hex()
        pos = desc_start + descsz + (-descsz % 4)
    return None


def find_copy(dist_file: Path, rel: Path, dirs: Sequence[Path], digest: str) -> Path | None:
    """The host file the dist file is a copy of: same content, or same build-id."""
    build_id = elf_build_id(dist_file)
    for candidate in host_candidates(rel, dirs):
        same_size = candidate.stat().st_size == dist_file.stat().st_size
        if same_size and sha256_file(candidate) == digest:
            return candidate.resolve()
        if build_id is not None and elf_build_id(candidate) == build_id:
            return candidate.resolve()
    return None


# --- dpkg ----------------------------------------------------------------------------------------


def _dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
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
    """Host path (as seen from ROOT) -> owning binary package, for the paths dpkg knows."""
    aliases = {alias: path for path in paths for alias in usr_merge_aliases(path)}
    if not aliases:
        return {}
    proc = _dpkg(root, "-S", *sorted(aliases))
    owners: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith(("diversion ", "local diversion")) or ": " not in line:
            continue
        packages, _, path = line.partition(": ")
        if path in aliases:
            # "libc6:amd64" or "a, b" (a file shared by several packages: take the first)
            owners[aliases[path]] = packages.split(",")[0].strip().split(":")[0]
    return owners


def dpkg_package(root: Path, name: str, arch: str) -> DebPackage:
    fields = "${Package}\t${Version}\t${Architecture}\t${source:Package}\t${source:Version}\t"
    fields += "${Homepage}\n"
    proc = _dpkg(root, "-W", f"-f={fields}", name)
    rows = [line.split("\t") for line in proc.stdout.splitlines() if line]
    # A multiarch package is listed once per installed architecture.
    rows = [r for r in rows if r[2] in (arch, "all")] or rows
    if proc.returncode != 0 or not rows:
        raise SbomError(f"dpkg-query -W {name}: {proc.stderr.strip() or 'not installed'}")
    package, version, architecture, source, source_version, homepage = rows[0]
    return DebPackage(
        package,
        version,
        architecture,
        source or package,
        source_version or version,
        homepage,
        dep5_licenses(root / "usr" / "share" / "doc" / package / "copyright"),
    )


def dep5_licenses(copyright_file: Path) -> tuple[str, ...]:
    """Short license names of a machine-readable (DEP-5) Debian copyright file; () if it is not
    one (glibc's, for instance, is free text)."""
    try:
        text = copyright_file.read_text(errors="replace")
    except OSError:
        return ()
    if not text.startswith("Format:"):
        return ()
    names = re.findall(r"^License:[ \t]*(\S[^\n]*)$", text, re.MULTILINE)
    return tuple(sorted({n.strip() for n in names}))


def os_release(root: Path) -> tuple[str, str]:
    """(ID, VERSION_ID) of ROOT's distribution, for the purl's `distro` qualifier."""
    values: dict[str, str] = {}
    for path in (root / "etc" / "os-release", root / "usr" / "lib" / "os-release"):
        if path.is_file():
            for line in path.read_text().splitlines():
                key, _, value = line.partition("=")
                values[key] = value.strip().strip('"')
            break
    return values.get("ID", "debian"), values.get("VERSION_ID", "")


# --- Python --------------------------------------------------------------------------------------


def runtime_distributions(project: str = "cnibox") -> dict[str, str]:
    """Name -> version of every distribution `project` needs at run time (transitively)."""
    found: dict[str, str] = {}
    todo = [project]
    while todo:
        name = todo.pop()
        dist = importlib.metadata.distribution(name)
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            dep = re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0]
            if dep and dep.lower() not in {n.lower() for n in found}:
                found[importlib.metadata.distribution(dep).metadata["Name"]] = (
                    importlib.metadata.version(dep)
                )
                todo.append(dep)
    return found


def distribution_of(path: Path, names: Iterable[str]) -> str | None:
    """Which of the given installed distributions a file belongs to (by their RECORDs)."""
    for name in sorted(names):
        dist = importlib.metadata.distribution(name)
        for entry in dist.files or []:
            if Path(str(dist.locate_file(entry))).resolve() == path:
                return str(dist.metadata["Name"])
    return None


def python_license(name: str) -> str:
    meta = importlib.metadata.metadata(name)
    expressions = meta.get_all("License-Expression") or []
    if expressions:
        return str(expressions[0])
    classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    known = {
        "License :: OSI Approved :: Apache Software License": "Apache-2.0",
        "License :: OSI Approved :: MIT License": "MIT",
        "License :: OSI Approved :: BSD License": "BSD-3-Clause",
    }
    for classifier in classifiers:
        if classifier in known:
            return known[classifier]
    return str((meta.get_all("License") or [""])[0])


# --- inventory -----------------------------------------------------------------------------------


def inventory(dist: Path, arch: str, root: Path, launcher_libc: Path | None) -> Inventory:
    """Attribute every file of the dist (and the launcher's libc) to a component."""
    if arch not in TRIPLETS:
        raise SbomError(f"unknown architecture {arch!r} (known: {', '.join(TRIPLETS)})")
    result = Inventory(distributions=runtime_distributions())
    copies, unowned = host_copies(dist, arch, root, result)
    if launcher_libc is not None:
        copies["launcher/libc.a"] = (launcher_libc.resolve(), "")
    python_prefix = Path(sys.base_prefix).resolve()
    owners = dpkg_owners(root, (_in_root(host, root) for host, _ in copies.values()))
    for name, (host, digest) in sorted(copies.items()):
        host_path = _in_root(host, root)
        package = owners.get(host_path)
        if package is not None:
            if package not in result.packages:
                result.packages[package] = dpkg_package(root, package, arch)
            owner = f"deb:{package}"
        elif host.is_relative_to(python_prefix):
            owner = "cpython"
        elif (dist_name := distribution_of(host, result.distributions)) is not None:
            owner = f"pypi:{dist_name}"
        else:
            unowned.append(f"{name} (copy of {host}, which no package owns)")
            continue
        result.attributions.append(Attribution(name, digest, owner, host_path))
    if unowned:
        raise SbomError("files of the single file no component accounts for: " + "; ".join(unowned))
    return result


def host_copies(
    dist: Path, arch: str, root: Path, result: Inventory
) -> tuple[dict[str, tuple[Path, str]], list[str]]:
    """Each dist file -> (the host file it is a copy of, its sha256); cnibox's own files go
    straight into `result`; the second list names files with no host original."""
    dirs = [*library_dirs(root, arch), *python_dirs()]
    copies: dict[str, tuple[Path, str]] = {}
    unowned: list[str] = []
    for rel in dist_files(dist):
        path = dist / rel
        digest = sha256_file(path)
        name = f"dist/{rel.as_posix()}"
        if rel.as_posix() in OWN_FILES:
            result.attributions.append(Attribution(name, digest, "cnibox"))
            continue
        copy = None
        if rel.as_posix().startswith(LOCALE_DIST + "/"):
            host = root / LOCALE_HOST / rel.relative_to(LOCALE_DIST)
            copy = host.resolve() if host.is_file() and sha256_file(host) == digest else None
        copy = copy or find_copy(path, rel, dirs, digest)
        if copy is None:
            unowned.append(f"{name} (no identical file on the host)")
        else:
            copies[name] = (copy, digest)
    return copies, unowned


def _in_root(path: Path, root: Path) -> str:
    return "/" + str(path.relative_to(root.resolve())) if root != Path("/") else str(path)


# --- CycloneDX -----------------------------------------------------------------------------------


def source_date() -> datetime:
    return datetime.fromtimestamp(provenance.build_info(__version__).epoch, UTC)


def nuitka_zstd_version() -> str:
    """The zstd decoder compiled into the launcher: Nuitka's inline copy."""
    import nuitka

    header = Path(nuitka.__file__).parent / "build" / "inline_copy" / "zstd" / "zstd.h"
    parts = re.findall(r"#define ZSTD_VERSION_(?:MAJOR|MINOR|RELEASE)\s+(\d+)", header.read_text())
    return ".".join(parts)


def _files_property(attributions: Iterable[Attribution]) -> list[Property]:
    props = []
    for a in attributions:
        value = f"{a.path} sha256:{a.sha256}" if a.sha256 else a.path
        props.append(Property(name="cnibox:file", value=value))
        if a.host_file:
            props.append(Property(name="cnibox:copied-from", value=a.host_file))
    return props


def component(
    purl: PackageURL,
    name: str,
    licenses: Sequence[DisjunctiveLicense | LicenseExpression],
    properties: Sequence[Property] = (),
    *,
    description: str | None = None,
    references: Sequence[ExternalReference] = (),
    kind: ComponentType = ComponentType.LIBRARY,
) -> Component:
    """One component, identified (bom-ref) by its purl."""
    return Component(
        name=name,
        version=purl.version,
        type=kind,
        bom_ref=purl.to_string(),
        purl=purl,
        licenses=licenses,
        properties=properties,
        description=description,
        external_references=references,
    )


def build_bom(inv: Inventory, arch: str, root: Path) -> Bom:
    by_owner: dict[str, list[Attribution]] = {}
    for a in inv.attributions:
        by_owner.setdefault(a.owner, []).append(a)
    distro, distro_version = os_release(root)
    qualifiers = {"distro": f"{distro}-{distro_version}"}
    components = []
    for name, package in sorted(inv.packages.items()):
        purl = PackageURL(
            "deb", distro, package.name, package.version, {"arch": package.arch, **qualifiers}
        )
        props = _files_property(by_owner[f"deb:{name}"])
        props.append(Property(name="cnibox:debian-source", value=package.source_version))
        props.append(Property(name="cnibox:debian-source-package", value=package.source))
        if not package.licenses:
            path = f"/usr/share/doc/{name}/copyright"
            props.append(Property(name="cnibox:copyright-file", value=path))
        refs = (
            [ExternalReference(type=ExternalReferenceType.WEBSITE, url=XsUri(package.homepage))]
            if package.homepage
            else []
        )
        licenses = [DisjunctiveLicense(name=n) for n in package.licenses]
        components.append(component(purl, package.name, licenses, props, references=refs))
    python = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    components.append(
        component(
            PackageURL("generic", None, "cpython", python),
            "cpython",
            [LicenseExpression("PSF-2.0")],
            _files_property(by_owner.get("cpython", [])),
            description="the interpreter's runtime and standard library, compiled in by Nuitka",
        )
    )
    for name, version in sorted(inv.distributions.items()):
        license_text = python_license(name)
        components.append(
            component(
                PackageURL("pypi", None, name.lower(), version),
                name,
                [DisjunctiveLicense(name=license_text)] if license_text else [],
                _files_property(by_owner.get(f"pypi:{name}", [])),
            )
        )
    components.append(
        component(
            PackageURL("pypi", None, "nuitka", importlib.metadata.version("nuitka")),
            "Nuitka",
            [LicenseExpression("Apache-2.0")],
            description="its runtime library, compiled into cnibox.bin",
        )
    )
    components.append(
        component(
            PackageURL("generic", None, "zstd", nuitka_zstd_version()),
            "zstd",
            [LicenseExpression("BSD-3-Clause OR GPL-2.0-only")],
            description="the decoder in the launcher (Nuitka's inline copy)",
        )
    )
    main = component(
        PackageURL("generic", None, "cnibox", __version__),
        "cnibox",
        [LicenseExpression("Apache-2.0")],
        [
            Property(name="cnibox:architecture", value=arch),
            *_files_property(by_owner.get("cnibox", [])),
        ],
        references=[
            ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(provenance.SOURCE))
        ],
        kind=ComponentType.APPLICATION,
    )
    bom = Bom(
        components=components,
        metadata=BomMetaData(component=main, timestamp=source_date()),
        serial_number=serial_number(inv, arch),
    )
    bom.dependencies.add(
        Dependency(ref=main.bom_ref, dependencies=[Dependency(ref=c.bom_ref) for c in components])
    )
    return bom


def serial_number(inv: Inventory, arch: str) -> uuid.UUID:
    """A UUID from the content: the same inputs give the same SBOM, byte for byte."""
    facts = {
        "arch": arch,
        "version": __version__,
        "files": [
            (a.path, a.sha256, a.owner) for a in sorted(inv.attributions, key=lambda a: a.path)
        ],
        "packages": sorted((p.name, p.version) for p in inv.packages.values()),
        "distributions": sorted(inv.distributions.items()),
    }
    return uuid.uuid5(
        uuid.NAMESPACE_URL, provenance.SOURCE + "#" + json.dumps(facts, sort_keys=True)
    )


def render(bom: Bom) -> str:
    """The SBOM as CycloneDX 1.6 JSON."""
    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


def validate(text: str) -> None:
    """Check the SBOM against the CycloneDX schema the library ships (strict: no unknown
    property), with its format checks (dates, IRIs, purls...)."""
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SCHEMA).validate_str(text)
    if error is not None:
        raise SbomError(
            f"the SBOM does not validate against CycloneDX {SCHEMA.to_version()}: {error}"
        )


def generate(
    dist: Path, arch: str, root: Path = Path("/"), launcher_libc: Path | None = None
) -> str:
    """The SBOM of a dist, validated."""
    text = render(build_bom(inventory(dist, arch, root, launcher_libc), arch, root))
    validate(text)
    return text


def default_launcher_libc(root: Path, arch: str) -> Path | None:
    path = root / "usr" / "lib" / MUSL_TRIPLETS[arch] / "libc.a"
    return path if path.is_file() else None


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dist", type=Path, required=True, help="the Nuitka standalone dist")
    parser.add_argument("--arch", default="amd64", choices=sorted(TRIPLETS))
    parser.add_argument("--root", type=Path, default=Path("/"), help="dpkg root of the libraries")
    parser.add_argument("--launcher-libc", type=Path, help="musl libc.a the launcher linked")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    libc = args.launcher_libc or default_launcher_libc(args.root, args.arch)
    try:
        text = generate(args.dist, args.arch, args.root, libc)
    except (SbomError, OSError) as exc:
        sys.stderr.write(f"sbom.py: {exc}\n")
        return 1
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
