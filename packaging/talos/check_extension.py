"""Talos' system-extension rules, ported: `check_extension.py TARGET [TALOS_VERSION]`, where
TARGET is an extension directory, an OCI image layout directory or an oci-archive.

A port of siderolabs/talos `pkg/machinery/extensions` (`load.go`, `validate.go`,
`extensions.go`), with Talos' own error texts, so that Talos' test cases (good/bad
extension directories) can drive it:
1. Load: the top level holds only `manifest.yaml` and `rootfs` (`unexpected file "x"`); the
   manifest's `version` must be `v1alpha1` (`unsupported manifest version: "x"`); both must
   exist (`extension manifest is missing`, `extension rootfs is missing`).
2. Constraints: `metadata.compatibility.talos.version` (a semver range, `v` before digits
   tolerated) must admit the Talos version checked against.
3. Contents: nothing world-writable, no special files, every non-directory under an allowed
   path prefix (a plain string prefix, as Talos compares). Talos tests the permission bits of
   `fs.DirEntry.Type()`, which holds type bits only, so its world-writable test never fires;
   this port tests the real permissions, except on symlinks (always 0777 on Linux).
An image (an OCI layout directory, as `make images` writes beside each archive, or an
oci-archive) is checked on its single layer's members, the way the image would unpack; a
multi-arch image (an image index) on each platform's layer.
Exit status 0 when valid; otherwise the first error on stderr and exit 1; 2 for a bad
command line.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import stat
import sys
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

# extensions.go AllowedPaths (Talos 1.10+, after the /usr merge).
ALLOWED_PATHS = (
    "/etc/cri/conf.d",
    "/usr/lib/firmware",
    "/usr/lib/modules",
    "/usr/lib/udev/rules.d",
    "/usr/local",
    "/usr/lib/ld-linux-x86-64.so.2",
    "/usr/lib/ld-linux-aarch64.so.1",
    "/usr/bin/ldconfig",
    "/etc/ld.so.conf",
    "/etc/ld.so.cache",
    "/usr/share/glvnd",
    "/usr/share/egl",
    "/etc/vulkan",
)
DEFAULT_TALOS_VERSION = "1.10.0"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


class ExtensionError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Item:
    """One filesystem entry, path relative to the extension's top level."""

    path: str
    mode: int  # st_mode bits: type and permissions


def items_from_directory(root: Path) -> list[Item]:
    items = []
    for path in sorted(root.rglob("*")):
        items.append(Item(path.relative_to(root).as_posix(), path.lstat().st_mode))
    return items


def image_layers(read: Callable[[str], bytes], where: Path) -> list[bytes]:
    """The single layer of the image an OCI layout (a directory or an archive) holds, or of
    each platform's image when its index.json names an image index (a multi-arch extension:
    each platform must pass on its own)."""

    def blob(digest: str) -> bytes:
        return read("blobs/sha256/" + digest.removeprefix("sha256:"))

    try:
        top = json.loads(read("index.json"))["manifests"][0]
        manifests = [json.loads(blob(top["digest"]))]
        if top.get("mediaType") == INDEX_TYPE:
            manifests = [json.loads(blob(entry["digest"])) for entry in manifests[0]["manifests"]]
        return [blob(manifest["layers"][0]["digest"]) for manifest in manifests]
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
        raise ExtensionError(f"{where}: not an OCI image of one layer: {exc!r}") from None


def archive_layers(archive: Path) -> list[bytes]:
    """image_layers of an oci-archive."""
    try:
        with tarfile.open(archive) as outer:
            return image_layers(lambda name: _read(outer, name), archive)
    except tarfile.TarError as exc:
        reason = str(exc).splitlines()[0].rstrip(":")
        raise ExtensionError(
            f"{archive}: not an extension, OCI layout or oci-archive: {reason}"
        ) from None


def layout_layers(layout: Path) -> list[bytes]:
    """image_layers of an OCI image layout directory (`oci-layout`, `index.json`, `blobs/`)."""
    return image_layers(lambda name: (layout / name).read_bytes(), layout)


def items_from_archive(archive: Path) -> tuple[list[Item], bytes | None]:
    """The layer's members as items, and the manifest.yaml bytes if the layer has one (the
    first platform's, for a multi-arch archive: `check` checks each)."""
    return items_from_layer(archive_layers(archive)[0])


def items_from_layer(layer: bytes) -> tuple[list[Item], bytes | None]:
    items, manifest_yaml = [], None
    try:
        with tarfile.open(fileobj=io.BytesIO(layer), mode="r:gz") as tar:
            for member in tar.getmembers():
                name = member.name.strip("/").removeprefix("./")
                items.append(Item(name, _tar_mode(member)))
                if name == "manifest.yaml" and member.isfile():
                    extracted = tar.extractfile(member)
                    manifest_yaml = extracted.read() if extracted else None
    except tarfile.TarError as exc:
        raise ExtensionError(f"the image's layer is not a gzipped tar: {exc}") from None
    return items, manifest_yaml


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    try:
        extracted = tar.extractfile(name)
    except KeyError:
        raise ExtensionError(f"{name}: not in the archive") from None
    if extracted is None:
        raise ExtensionError(f"{name}: not a file in the archive")
    return extracted.read()


def _tar_mode(member: tarfile.TarInfo) -> int:
    if member.isdir():
        kind = stat.S_IFDIR
    elif member.issym():
        kind = stat.S_IFLNK
    elif member.isfile():
        kind = stat.S_IFREG
    else:
        kind = stat.S_IFCHR if member.ischr() else stat.S_IFIFO
    return kind | member.mode


def load(items: Iterable[Item], manifest_yaml: bytes | None) -> dict[str, object]:
    """load.go: the top level, then the manifest. Returns the manifest."""
    manifest: dict[str, object] = {}
    top = sorted({i.path.split("/", 1)[0] for i in items})
    for name in top:  # in os.ReadDir's order, as Go meets them
        if name == "manifest.yaml":
            manifest = parse_manifest(manifest_yaml)
        elif name != "rootfs":
            raise ExtensionError(f'unexpected file "{name}"')
    if not manifest:
        raise ExtensionError("extension manifest is missing")
    if "rootfs" not in top:
        raise ExtensionError("extension rootfs is missing")
    return manifest


def parse_manifest(data: bytes | None) -> dict[str, object]:
    loaded = yaml.safe_load(data or b"")
    manifest = loaded if isinstance(loaded, dict) else {}
    version = manifest.get("version") or ""
    if version != "v1alpha1":
        raise ExtensionError(f'unsupported manifest version: "{version}"')
    return manifest


def validate_constraints(manifest: dict[str, object], talos_version: str) -> None:
    metadata = manifest.get("metadata")
    constraint = _dig(metadata, "compatibility", "talos", "version")
    if constraint and not satisfies(_parse_version(talos_version), constraint):
        raise ExtensionError(
            f"version constraint {constraint} can't be satisfied with Talos version {talos_version}"
        )


def _dig(value: object, *keys: str) -> str:
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, str) else ""


_COMPARISON = re.compile(r"^(>=|<=|!=|==|=|>|<)?\s*v?(\d+\.\d+\.\d+)")


def _parse_version(text: str) -> tuple[int, int, int]:
    match = re.match(r"v?(\d+)\.(\d+)\.(\d+)", text.strip())
    if not match:
        raise ExtensionError(f"error parsing Talos version constraint: {text!r}")
    major, minor, patch = (int(g) for g in match.groups())
    return (major, minor, patch)


def satisfies(version: tuple[int, int, int], constraint: str) -> bool:
    """blang/semver ranges: `||` of space-separated comparisons that must all hold."""
    return any(
        all(_compare(version, part) for part in alternative.split())
        for alternative in constraint.replace(">= ", ">=").replace("<= ", "<=").split("||")
    )


def _compare(version: tuple[int, int, int], part: str) -> bool:
    part = part.replace("> ", ">").replace("< ", "<")
    match = _COMPARISON.match(part)
    if not match:
        raise ExtensionError(f"error parsing Talos version constraint: {part!r}")
    operator, bound = match.group(1) or "=", _parse_version(match.group(2))
    return {
        ">=": version >= bound,
        "<=": version <= bound,
        ">": version > bound,
        "<": version < bound,
        "!=": version != bound,
    }.get(operator, version == bound)


def validate_contents(items: Iterable[Item]) -> None:
    """validate.go validateContents, over the rootfs entries in path order."""
    for item in sorted(items, key=lambda i: i.path):
        if not item.path.startswith("rootfs/"):
            continue
        path = "/" + item.path.removeprefix("rootfs/")
        kind = stat.S_IFMT(item.mode)
        if item.mode & 0o002 and kind != stat.S_IFLNK:
            raise ExtensionError(f'world-writeable files are not allowed: "{path}"')
        if kind not in (stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK):
            raise ExtensionError(f'special files are not allowed: "{path}"')
        if kind != stat.S_IFDIR and not any(path.startswith(p) for p in ALLOWED_PATHS):
            raise ExtensionError(f'path "{path}" is not allowed in extensions')


def check(target: Path, talos_version: str = DEFAULT_TALOS_VERSION) -> dict[str, object]:
    """Load and validate an extension directory, OCI layout or oci-archive; returns its
    manifest."""
    if (target / "oci-layout").is_file():
        trees = [items_from_layer(layer) for layer in layout_layers(target)]
    elif target.is_dir():
        manifest_path = target / "manifest.yaml"
        manifest_yaml = manifest_path.read_bytes() if manifest_path.is_file() else None
        trees = [(items_from_directory(target), manifest_yaml)]
    else:
        trees = [items_from_layer(layer) for layer in archive_layers(target)]
    manifest: dict[str, object] = {}
    for items, manifest_yaml in trees:
        manifest = load(items, manifest_yaml)
        validate_constraints(manifest, talos_version)
        validate_contents(items)
    return manifest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description="Check a Talos system extension against Talos' own rules (a port of "
        "siderolabs/talos pkg/machinery/extensions).",
    )
    parser.add_argument(
        "target", type=Path, help="extension directory, OCI image layout directory or oci-archive"
    )
    parser.add_argument(
        "talos_version",
        nargs="?",
        default=DEFAULT_TALOS_VERSION,
        help="the Talos version to check compatibility against (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        check(args.target, args.talos_version)
    except ExtensionError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"{exc.filename or args.target}: {exc.strerror or exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
