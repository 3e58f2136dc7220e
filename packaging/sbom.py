"""CycloneDX SBOM of one single file, from its build's record:

    sbom.py --record build/out/bundled-ARCH.json --binary FILE --out FILE

The build attributes everything the single file carries (build/bundled.py, at `pack`): each
file of the packed dist with the file it was copied from and the Debian package, Python
distribution or CPython that installed that file; what was linked in (the static libpython,
musl's libc.a in the launcher); every Python module compiled into cnibox.bin (Nuitka's
report). That record is the only attribution: this script checks that it describes the
binary given (its sha256), and writes it as CycloneDX 1.6, validated against the schema:

- one component per Debian package (`pkg:deb/debian/NAME@VERSION?arch=ARCH&distro=debian-12`,
  its DEP-5 licenses or its copyright file, its source package), per Python distribution
  (`pkg:pypi/…`), for a non-Debian CPython, Nuitka (its runtime library) and zstd (the
  launcher's decoder, Nuitka's inline copy); cnibox itself is `metadata.component`;
- each component lists what of it is in the file: `cnibox:file` (path in the single file and
  sha256), `cnibox:copied-from`, `cnibox:linked` (a static library linked in) and
  `cnibox:python-module` (a module compiled into cnibox.bin).

Reproducible: the timestamp is the build's (provenance.py: SOURCE_DATE_EPOCH, else the commit
time of HEAD), the serial number a UUID derived from the record, components sorted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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

import provenance  # noqa: E402  # packaging/, beside this file

SCHEMA = SchemaVersion.V1_6
MEDIA_TYPE = "application/vnd.cyclonedx+json"
RECORD_FORMAT = 2  # build/bundled.py's


class SbomError(Exception):
    """The record is missing, of another format, or not the binary's; or the SBOM is invalid."""


def load_record(path: Path, binary: Path) -> dict[str, Any]:
    """The build's record of `binary`, checked to be that binary's."""
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SbomError(f"{path}: cannot read the build's record: {exc}") from None
    if record.get("format") != RECORD_FORMAT:
        raise SbomError(f"{path}: record format {record.get('format')}, not {RECORD_FORMAT}")
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()
    if record["artifact_sha256"] != digest:
        raise SbomError(
            f"{path} describes another build than {binary} (sha256 {digest[:16]}…, the record "
            f"says {record['artifact_sha256'][:16]}…): pack again (make build)"
        )
    return record


def _contents(record: Mapping[str, Any]) -> dict[str, list[Property]]:
    """Component key -> the properties naming what of it the single file holds."""
    props: dict[str, list[Property]] = {}
    for f in record["files"]:
        found = props.setdefault(f["component"], [])
        found.append(Property(name="cnibox:file", value=f"{f['path']} sha256:{f['sha256']}"))
        if f["source"]:
            found.append(Property(name="cnibox:copied-from", value=f["source"]))
    for link in record["linked"]:
        value = f"{link['into']} <- {link['source']} sha256:{link['sha256']}"
        props.setdefault(link["component"], []).append(Property(name="cnibox:linked", value=value))
    for module in record["modules"]:
        prop = Property(name="cnibox:python-module", value=module["name"])
        props.setdefault(module["component"], []).append(prop)
    return props


def component(
    purl: PackageURL,
    name: str,
    licenses: Sequence[DisjunctiveLicense | LicenseExpression],
    properties: Sequence[Property] = (),
    *,
    description: str | None = None,
    homepage: str = "",
    kind: ComponentType = ComponentType.LIBRARY,
) -> Component:
    """One component, identified (bom-ref) by its purl."""
    refs = [ExternalReference(type=ExternalReferenceType.WEBSITE, url=XsUri(homepage))]
    return Component(
        name=name,
        version=purl.version,
        type=kind,
        bom_ref=purl.to_string(),
        purl=purl,
        licenses=licenses,
        properties=properties,
        description=description,
        external_references=refs if homepage else [],
    )


DESCRIPTIONS = {
    "nuitka": "its runtime library, compiled into cnibox.bin",
    "zstd": "the decoder in the launcher (Nuitka's inline copy)",
    "cpython": "the interpreter's runtime and standard library, compiled in by Nuitka",
}
LICENSES = {"nuitka": "Apache-2.0", "zstd": "BSD-3-Clause OR GPL-2.0-only", "cpython": "PSF-2.0"}


def _component(c: Mapping[str, Any], props: list[Property], distro: str) -> Component:
    kind = c["type"]
    if kind == "deb":
        qualifiers = {"arch": c["architecture"], "distro": distro}
        purl = PackageURL("deb", "debian", c["name"], c["version"], qualifiers)
        props = [
            *props,
            Property(name="cnibox:debian-source", value=c["source_version"]),
            Property(name="cnibox:debian-source-package", value=c["source"]),
        ]
        if not c["licenses"]:
            props.append(Property(name="cnibox:copyright-file", value=c["copyright_file"]))
        if c.get("archive"):  # unpacked from this .deb by the build, not installed
            props.append(Property(name="cnibox:debian-archive", value=c["archive"]))
        licenses = [DisjunctiveLicense(name=n) for n in c["licenses"]]
        return component(purl, c["name"], licenses, props, homepage=c["homepage"])
    if kind == "pypi":
        purl = PackageURL("pypi", None, c["name"].lower(), c["version"])
        licenses = [DisjunctiveLicense(name=c["license"])] if c["license"] else []
        return component(purl, c["name"], licenses, props, homepage=c["homepage"])
    purl = (
        PackageURL("pypi", None, "nuitka", c["version"])
        if kind == "nuitka"
        else PackageURL("generic", None, kind, c["version"])
    )
    if kind == "cpython":
        props = [*props, Property(name="cnibox:origin", value=c["origin"])]
    return component(
        purl, c["name"], [LicenseExpression(LICENSES[kind])], props, description=DESCRIPTIONS[kind]
    )


def build_bom(record: Mapping[str, Any]) -> Bom:
    props = _contents(record)
    components = []
    main: Component | None = None
    for key, c in sorted(record["components"].items()):
        if c["type"] == "cnibox":
            main = component(
                PackageURL("generic", None, "cnibox", c["version"]),
                "cnibox",
                [LicenseExpression(provenance.LICENSES)],
                [Property(name="cnibox:architecture", value=record["arch"]), *props.get(key, [])],
                kind=ComponentType.APPLICATION,
            )
            main.external_references.add(
                ExternalReference(type=ExternalReferenceType.VCS, url=XsUri(provenance.SOURCE))
            )
        else:
            components.append(_component(c, props.get(key, []), record["distro"]))
    if main is None:
        raise SbomError("the record has no cnibox component")
    bom = Bom(
        components=components,
        metadata=BomMetaData(component=main, timestamp=source_date(record["version"])),
        serial_number=serial_number(record),
    )
    bom.dependencies.add(
        Dependency(ref=main.bom_ref, dependencies=[Dependency(ref=c.bom_ref) for c in components])
    )
    return bom


def source_date(version: str) -> datetime:
    return datetime.fromtimestamp(provenance.build_info(version).epoch, UTC)


def serial_number(record: Mapping[str, Any]) -> uuid.UUID:
    """A UUID from the content: the same record gives the same SBOM, byte for byte."""
    facts = json.dumps(record, sort_keys=True)
    return uuid.uuid5(uuid.NAMESPACE_URL, provenance.SOURCE + "#" + facts)


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


def generate(record_path: Path, binary: Path, arch: str | None = None) -> str:
    """The SBOM of `binary` from its build's record, validated."""
    record = load_record(record_path, binary)
    if arch is not None and record["arch"] != arch:
        raise SbomError(f"{record_path} is the record of an {record['arch']} build, not {arch}")
    text = render(build_bom(record))
    validate(text)
    return text


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--record", type=Path, required=True, help="build/out/bundled-ARCH.json")
    parser.add_argument("--binary", type=Path, required=True, help="the single file it describes")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        text = generate(args.record, args.binary)
    except (SbomError, OSError) as exc:
        sys.stderr.write(f"sbom.py: {exc}\n")
        return 1
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
