"""Build cnibox's two OCI images from one binary: `build.py --binary FILE --out DIR`.

- `cnibox-talos-extension`: a Talos system extension (`/manifest.yaml` from
  packaging/talos/manifest.yaml, `/rootfs/usr/local/lib/cnibox/cnibox`, links from
  packaging/talos/layout.json), checked against Talos' rules before it is written.
- `cnibox-installer`: the DaemonSet image, `FROM scratch` with only cnibox and a link per
  applet (packaging/image/layout.json), entrypoint `cnibox install-cni`.
Each is written as an OCI layout directory and as an oci-archive tar, tagged with the
version, labelled with its provenance (provenance.py: source, revision, version, licenses,
created) and, given `--sbom FILE`, with the SBOM attached as an OCI artifact referring to the
image. Any file serves as the binary (tests use a stand-in); `make images` uses dist/cnibox.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
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


def images(binary: bytes, info: provenance.BuildInfo) -> dict[str, oci.Image]:
    """Both images of one binary, labelled; manifest annotations repeat the labels."""
    entries, config = image_entries(binary)
    built = {}
    for name, (files, base) in {
        TALOS_NAME: (talos_entries(binary), oci.ImageConfig()),
        IMAGE_NAME: (entries, config),
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
    for name, built in images(binary_path.read_bytes(), info).items():
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--binary", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--version", default=__version__)
    parser.add_argument("--sbom", type=Path, help="CycloneDX SBOM to attach (packaging/sbom.py)")
    args = parser.parse_args(argv)
    try:
        sbom = args.sbom.read_bytes() if args.sbom else None
        written = build(args.binary, args.out, args.version, sbom)
    except check_extension.ExtensionError as exc:
        sys.stderr.write(f"the Talos extension breaks Talos' rules: {exc}\n")
        return 1
    for name, path in written.items():
        sys.stdout.write(f"{name}: oci-archive:{path}:{args.version} oci:{path.with_suffix('')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
