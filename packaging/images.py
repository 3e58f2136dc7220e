"""Build cnibox's two OCI images: `images.py --binary [ARCH=]FILE… --out DIR`.

- `cnibox-talos-extension`: a Talos system extension (`/manifest.yaml` from
  packaging/talos/manifest.yaml, `/rootfs/usr/local/lib/cnibox/cnibox`, links from
  packaging/talos/layout.json), checked against Talos' rules before it is written.
- `cnibox-installer`: the DaemonSet image, `FROM scratch` with only cnibox and a link per
  applet (packaging/image/layout.json), entrypoint `cnibox install-cni`.
Each is written as an OCI layout directory and as an oci-archive tar, tagged with the
version, labelled with its provenance (provenance.py: source, revision, version, licenses,
created) and, given `--sbom [ARCH=]FILE` for each binary, with that binary's SBOM attached as
an OCI artifact referring to its image. With one `--binary` each is one image; with
`--binary amd64=FILE --binary arm64=FILE` (`make images`, `make release`) each is a
multi-arch image index, each platform's image also tagged `<version>-<arch>` (packaging/oci.py
"multi-arch index"; docs/arm64.md). A FILE without ARCH= is amd64. Any file serves as a
binary (tests use stand-ins).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path

import oci

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "talos"))
sys.path.insert(1, str(HERE.parent))

import check_extension  # noqa: E402  # found through the path set just above
import provenance  # noqa: E402

from multicall import __version__  # noqa: E402
from multicall.applets import all_names  # noqa: E402

TALOS_NAME = "cnibox-talos-extension"
IMAGE_NAME = "cnibox-installer"


def talos_entries(binary: bytes) -> list[oci.Entry]:
    layout = json.loads((HERE / "talos" / "layout.json").read_text())
    entries = [
        oci.file("manifest.yaml", (HERE / "talos" / "manifest.yaml").read_bytes(), 0o644),
        oci.file(layout["binary"], binary, 0o755),
    ]
    entries += [oci.symlink(path, target) for path, target in layout["links"].items()]
    # the node agent's extension service (docs/agent.md): its config and its mount points
    entries += [
        oci.file(path, (HERE / "talos" / source).read_bytes(), 0o644)
        for path, source in layout.get("files", {}).items()
    ]
    entries += [oci.directory(path, 0o755) for path in layout.get("dirs", [])]
    return entries


def image_entries(binary: bytes) -> tuple[list[oci.Entry], oci.ImageConfig]:
    layout = json.loads((HERE / "image" / "layout.json").read_text())
    entries = [oci.file(layout["binary"], binary, 0o755)]
    link_dir = layout["applet_links_dir"]
    binary_name = layout["binary"].rsplit("/", 1)[-1]
    entries += [oci.symlink(f"{link_dir}/{name}", binary_name) for name in all_names()]
    entries += [oci.directory(path, int(mode, 8)) for path, mode in layout["dirs"].items()]
    config = oci.ImageConfig(
        entrypoint=layout["entrypoint"],
        env=layout["env"],
    )
    return entries, config


DESCRIPTIONS = {
    TALOS_NAME: "Talos system extension: cnibox (Linkerd's CNI plugin without host binaries)",
    IMAGE_NAME: "The linkerd-cni DaemonSet's image: cnibox's single executable, FROM scratch",
}


def labelled(config: oci.ImageConfig, name: str, info: provenance.BuildInfo) -> oci.ImageConfig:
    """The config with the OCI provenance labels and the build's creation time."""
    labels = {**config.labels, **provenance.image_labels(info, name, DESCRIPTIONS[name])}
    return dataclasses.replace(config, labels=labels, created=info.created)


def images(binary: bytes, info: provenance.BuildInfo, arch: str = "amd64") -> dict[str, oci.Image]:
    """Both images of one binary for `arch`, labelled; manifest annotations repeat the labels."""
    entries, config = image_entries(binary)
    built = {}
    for name, (files, base) in {
        TALOS_NAME: (talos_entries(binary), oci.ImageConfig(architecture=arch)),
        IMAGE_NAME: (entries, dataclasses.replace(config, architecture=arch)),
    }.items():
        with_labels = labelled(base, name, info)
        built[name] = oci.build_image(files, with_labels, annotations=with_labels.labels)
    return built


def build(
    binary_path: Path,
    out: Path,
    version: str = __version__,
    sbom: bytes | None = None,
    arch: str = "amd64",
) -> dict[str, Path]:
    """Write both images under `out`; returns the archive path of each."""
    info = provenance.build_info(version)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, built in images(binary_path.read_bytes(), info, arch).items():
        image, extra = built, []
        if sbom is not None:
            image, descriptor = provenance.sbom_artifact(
                built, sbom, provenance.sbom_filename(version, arch), info
            )
            extra.append(descriptor)
        oci.write_layout(out / name, image, version, extra)
        oci.write_archive(out / f"{name}.tar", image, version, extra)
        written[name] = out / f"{name}.tar"
    check_extension.check(written[TALOS_NAME])
    return written


ARCHITECTURES = ("amd64", "arm64")


def build_multiarch(
    binaries: Mapping[str, Path],
    out: Path,
    version: str = __version__,
    sboms: Mapping[str, bytes] | None = None,
) -> dict[str, Path]:
    """Write both images under `out`, each a multi-arch index of the labelled images of the
    `binaries` (architecture -> binary file), each platform's image with its SBOM attached
    when `sboms` (architecture -> SBOM) is given; returns the archive path of each."""
    info = provenance.build_info(version)
    per_arch: dict[str, dict[str, oci.Image]] = {TALOS_NAME: {}, IMAGE_NAME: {}}
    referrers: dict[str, list[dict[str, object]]] = {TALOS_NAME: [], IMAGE_NAME: []}
    for arch, binary_path in sorted(binaries.items()):
        for name, built in images(binary_path.read_bytes(), info, arch).items():
            image = built
            if sboms is not None:
                filename = provenance.sbom_filename(version, arch)
                image, descriptor = provenance.sbom_artifact(built, sboms[arch], filename, info)
                referrers[name].append(descriptor)
            per_arch[name][arch] = image
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, platforms in per_arch.items():
        index = oci.build_index(platforms)
        oci.write_index_layout(out / name, index, version, referrers[name])
        oci.write_index_archive(out / f"{name}.tar", index, version, referrers[name])
        written[name] = out / f"{name}.tar"
    check_extension.check(written[TALOS_NAME])
    return written


def parse_binaries(values: list[str], option: str = "--binary") -> dict[str, Path]:
    """`--binary` (or `option`) values ("arm64=dist/cnibox-arm64", or a bare path for amd64)
    by arch."""
    binaries: dict[str, Path] = {}
    for value in values:
        arch, sep, path = value.partition("=")
        if not sep:
            arch, path = "amd64", value
        if arch not in ARCHITECTURES:
            raise SystemExit(f"{option} {value}: architecture must be one of {ARCHITECTURES}")
        if arch in binaries:
            raise SystemExit(f"{option}: {arch} given twice")
        binaries[arch] = Path(path)
    return binaries


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--binary", action="append", required=True, metavar="[ARCH=]FILE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--version", default=__version__)
    parser.add_argument(
        "--sbom",
        action="append",
        metavar="[ARCH=]FILE",
        help="CycloneDX SBOM of that architecture's binary to attach (packaging/sbom.py)",
    )
    args = parser.parse_args(argv)
    try:
        binaries = parse_binaries(args.binary)
        sbom_files = parse_binaries(args.sbom or [], "--sbom")
        if args.sbom and sbom_files.keys() != binaries.keys():
            raise SystemExit("--sbom: one per --binary architecture, or none")
        sboms = {arch: path.read_bytes() for arch, path in sbom_files.items()} or None
        if len(binaries) == 1:
            ((arch, binary),) = binaries.items()
            written = build(binary, args.out, args.version, sboms[arch] if sboms else None, arch)
        else:
            written = build_multiarch(binaries, args.out, args.version, sboms)
    except check_extension.ExtensionError as exc:
        sys.stderr.write(f"the Talos extension breaks Talos' rules: {exc}\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"images.py: {exc.filename or ''}: {exc.strerror or exc}\n")
        return 1
    for name, path in written.items():
        sys.stdout.write(f"{name}: oci-archive:{path}:{args.version} oci:{path.with_suffix('')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
