"""Build cnibox's two OCI images: `build.py --binary [ARCH=]FILE… --out DIR`.

- `cnibox-talos-extension`: a Talos system extension (`/manifest.yaml` from
  packaging/talos/manifest.yaml, `/rootfs/usr/local/lib/cnibox/cnibox`, links from
  packaging/talos/layout.json), checked against Talos' rules before it is written.
- `cnibox-installer`: the DaemonSet image, `FROM scratch` with only cnibox and a link per
  applet (packaging/image/layout.json), entrypoint `cnibox install-cni`.
Each is written as an OCI layout directory and as an oci-archive tar, tagged with the
version: a multi-arch image index with one image per `--binary ARCH=FILE` (amd64, arm64;
a FILE without ARCH= is amd64), each platform's image also tagged `<version>-<arch>`
(packaging/oci.py "multi-arch index"). Any file serves as a binary (tests use stand-ins);
`make images` uses dist/cnibox and dist/cnibox-arm64.
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
        labels={"org.opencontainers.image.version": __version__},
    )
    return entries, config


ARCHITECTURES = ("amd64", "arm64")


def build(binaries: Mapping[str, Path], out: Path, version: str = __version__) -> dict[str, Path]:
    """Write both images under `out`, each an index of one image per architecture in
    `binaries` (architecture -> binary file); returns the archive path of each."""
    images: dict[str, dict[str, oci.Image]] = {TALOS_NAME: {}, IMAGE_NAME: {}}
    for arch, binary_path in binaries.items():
        talos, installer = platform_images(binary_path.read_bytes(), arch)
        images[TALOS_NAME][arch] = talos
        images[IMAGE_NAME][arch] = installer
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, per_arch in images.items():
        index = oci.build_index(per_arch)
        oci.write_index_layout(out / name, index, version)
        oci.write_index_archive(out / f"{name}.tar", index, version)
        written[name] = out / f"{name}.tar"
    check_extension.check(written[TALOS_NAME])
    return written


def platform_images(binary: bytes, arch: str) -> tuple[oci.Image, oci.Image]:
    """(Talos extension, installer image) of one architecture's binary."""
    talos = oci.build_image(talos_entries(binary), oci.ImageConfig(architecture=arch))
    entries, config = image_entries(binary)
    installer = oci.build_image(entries, dataclasses.replace(config, architecture=arch))
    return talos, installer


def parse_binaries(values: list[str]) -> dict[str, Path]:
    """`--binary` values ("arm64=dist/cnibox-arm64", or a bare path for amd64) by arch."""
    binaries: dict[str, Path] = {}
    for value in values:
        arch, sep, path = value.partition("=")
        if not sep:
            arch, path = "amd64", value
        if arch not in ARCHITECTURES:
            raise SystemExit(f"--binary {value}: architecture must be one of {ARCHITECTURES}")
        if arch in binaries:
            raise SystemExit(f"--binary: {arch} given twice")
        binaries[arch] = Path(path)
    return binaries


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--binary", action="append", required=True, metavar="[ARCH=]FILE")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--version", default=__version__)
    args = parser.parse_args(argv)
    try:
        written = build(parse_binaries(args.binary), args.out, args.version)
    except check_extension.ExtensionError as exc:
        sys.stderr.write(f"the Talos extension breaks Talos' rules: {exc}\n")
        return 1
    for name, path in written.items():
        sys.stdout.write(f"{name}: oci-archive:{path}:{args.version} oci:{path.with_suffix('')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
