"""Deterministic OCI images from the standard library: no Docker, no buildah, no registry.

Rules of this module:
1. Same inputs, same bytes: tar members sorted by path, mtime 0, uid/gid 0 with empty owner
   names, modes exactly as declared; gzip header without name and with mtime 0; JSON with
   sorted keys and no whitespace. Digests therefore identify the content.
2. One layer per image. The config's `rootfs.diff_ids` holds the sha256 of the uncompressed
   tar, the manifest the digest of the compressed blob (OCI image-spec v1.1).
3. Output is an OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/`),
   readable by `skopeo inspect oci:DIR:REF` and `umoci unpack`, and optionally the same
   layout as one tar (`oci-archive:FILE:REF` for skopeo, the form Talos' imager accepts).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EPOCH = "1970-01-01T00:00:00Z"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass(frozen=True, slots=True)
class Entry:
    """One path in the image's filesystem (no leading '/')."""

    path: str
    kind: str  # "dir", "file" or "symlink"
    mode: int = 0o755
    data: bytes = b""
    target: str = ""


def directory(path: str, mode: int = 0o755) -> Entry:
    return Entry(path.strip("/"), "dir", mode)


def file(path: str, data: bytes, mode: int = 0o644) -> Entry:
    return Entry(path.strip("/"), "file", mode, data)


def symlink(path: str, target: str) -> Entry:
    return Entry(path.strip("/"), "symlink", 0o777, target=target)


def with_parents(entries: Iterable[Entry]) -> list[Entry]:
    """The entries plus a 0755 directory for every parent not declared, sorted by path."""
    by_path = {e.path: e for e in entries}
    for path in list(by_path):
        parent = os.path.dirname(path)
        while parent and parent not in by_path:
            by_path[parent] = directory(parent)
            parent = os.path.dirname(parent)
    return [by_path[p] for p in sorted(by_path)]


def _tar_info(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.path + ("/" if entry.kind == "dir" else ""))
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = entry.mode
    if entry.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif entry.kind == "symlink":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.target
    else:
        info.type = tarfile.REGTYPE
        info.size = len(entry.data)
    return info


def build_tar(entries: Iterable[Entry]) -> bytes:
    """An uncompressed, reproducible tar of the entries (parents added)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in with_parents(entries):
            info = _tar_info(entry)
            tar.addfile(info, io.BytesIO(entry.data) if entry.kind == "file" else None)
    return buffer.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz:
        gz.write(data)
    return buffer.getvalue()


def canonical_json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """The runtime part of the image config (empty for a Talos extension)."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    architecture: str = "amd64"
    created: str = EPOCH  # RFC 3339; from SOURCE_DATE_EPOCH for releases (provenance.py)


@dataclass(frozen=True, slots=True)
class Image:
    """The blobs of a built image, keyed by digest, and the manifest's descriptor."""

    blobs: dict[str, bytes]
    manifest_digest: str
    manifest_size: int


def build_image(
    entries: Iterable[Entry], config: ImageConfig, annotations: Mapping[str, str] | None = None
) -> Image:
    layer_tar = build_tar(entries)
    layer = gzip_bytes(layer_tar)
    runtime: dict[str, object] = {}
    if config.entrypoint:
        runtime["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        runtime["Cmd"] = list(config.cmd)
    if config.env:
        runtime["Env"] = list(config.env)
    if config.labels:
        runtime["Labels"] = dict(config.labels)
    image_config = canonical_json(
        {
            "architecture": config.architecture,
            "os": "linux",
            "created": config.created,
            "config": runtime,
            "rootfs": {"type": "layers", "diff_ids": [sha256_digest(layer_tar)]},
            "history": [{"created": config.created, "created_by": "cnibox packaging/oci.py"}],
        }
    )
    manifest_fields: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": _descriptor(CONFIG_TYPE, image_config),
        "layers": [_descriptor(LAYER_TYPE, layer)],
    }
    if annotations:
        manifest_fields["annotations"] = dict(annotations)
    manifest = canonical_json(manifest_fields)
    blobs = {sha256_digest(b): b for b in (layer, image_config, manifest)}
    return Image(blobs, sha256_digest(manifest), len(manifest))


def _descriptor(media_type: str, blob: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": sha256_digest(blob), "size": len(blob)}


def layout_files(
    image: Image, ref: str, extra: Sequence[Mapping[str, object]] = ()
) -> dict[str, bytes]:
    """The files of an OCI image layout holding `image` under the tag `ref`, plus `extra`
    untagged manifests (e.g. the SBOM artifact that refers to the image) whose blobs are in
    `image.blobs`."""
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": MANIFEST_TYPE,
                "digest": image.manifest_digest,
                "size": image.manifest_size,
                "annotations": {REF_ANNOTATION: ref},
            },
            *extra,
        ],
    }
    return _layout(index, image.blobs)


def _layout(index: Mapping[str, object], blobs: Mapping[str, bytes]) -> dict[str, bytes]:
    """The files of an OCI image layout: oci-layout, index.json, content-addressed blobs."""
    files = {"oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"})}
    files["index.json"] = canonical_json(index)
    for digest, blob in blobs.items():
        files["blobs/sha256/" + digest.removeprefix("sha256:")] = blob
    return files


def write_layout(
    directory_path: Path, image: Image, ref: str, extra: Sequence[Mapping[str, object]] = ()
) -> None:
    """Write the layout directory (replacing index.json; blobs are content-addressed)."""
    write_layout_files(directory_path, layout_files(image, ref, extra))


def write_archive(
    path: Path, image: Image, ref: str, extra: Sequence[Mapping[str, object]] = ()
) -> None:
    """The layout as one reproducible tar (skopeo's `oci-archive:` transport)."""
    write_archive_files(path, layout_files(image, ref, extra))


def write_layout_files(directory_path: Path, files: Mapping[str, bytes]) -> None:
    """Write the files of a layout (from layout_files or index_layout_files) under a dir."""
    for name, data in files.items():
        path = directory_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def write_archive_files(path: Path, files: Mapping[str, bytes]) -> None:
    """The files of a layout as one reproducible tar."""
    entries = [directory(d) for d in ("blobs", "blobs/sha256")]
    entries += [file(name, data, 0o644) for name, data in files.items()]
    path.write_bytes(build_tar(entries))


def read_layer_entries(archive: Path, arch: str = "amd64") -> list[tarfile.TarInfo]:
    """The members of the single layer of an oci-archive built here (for checks); of the
    `arch` image when the archive holds an index."""
    with tarfile.open(archive) as outer:
        manifests = platform_manifests(lambda name: _member(outer, name))
        manifest = manifests[arch] if arch in manifests else manifests[""]
        layer_digest = manifest["layers"][0]["digest"].removeprefix("sha256:")
        layer = _member(outer, f"blobs/sha256/{layer_digest}")
    with tarfile.open(fileobj=io.BytesIO(layer), mode="r:gz") as inner:
        return inner.getmembers()


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    extracted = tar.extractfile(name)
    if extracted is None:
        raise FileNotFoundError(name)
    return extracted.read()


# ---- multi-arch index (issue 16) ------------------------------------------------------------
# One image per architecture, tied together by an image index (OCI image-spec v1.1
# image-index.md): a runtime pulling the index takes the manifest of its own platform. The
# layout's index.json tags the index as `ref` (what a registry push or `skopeo copy --all`
# takes) and each platform's manifest as `ref-<arch>` (tools without platform selection, such as
# `umoci unpack`, address one image by it).

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


@dataclass(frozen=True, slots=True)
class Index:
    """The blobs of every platform's image plus the index blob, and the platforms' images."""

    blobs: dict[str, bytes]
    index_digest: str
    index_size: int
    images: Mapping[str, Image]  # OCI architecture (amd64, arm64) -> its image


def build_index(images: Mapping[str, Image]) -> Index:
    """An index of `images` (architecture -> image), platforms in name order."""
    if not images:
        raise ValueError("an image index needs at least one image")
    manifests = [
        {
            "mediaType": MANIFEST_TYPE,
            "digest": image.manifest_digest,
            "size": image.manifest_size,
            "platform": {"architecture": arch, "os": "linux"},
        }
        for arch, image in sorted(images.items())
    ]
    index = canonical_json({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": manifests})
    blobs: dict[str, bytes] = {}
    for image in images.values():
        blobs.update(image.blobs)
    blobs[sha256_digest(index)] = index
    return Index(blobs, sha256_digest(index), len(index), dict(images))


def index_layout_files(
    index: Index, ref: str, extra: Sequence[Mapping[str, object]] = ()
) -> dict[str, bytes]:
    """The files of an OCI image layout holding `index` as `ref`, each platform as ref-<arch>,
    plus `extra` untagged manifests (each platform's SBOM artifact) whose blobs are in
    `index.blobs`."""
    entries: list[Mapping[str, object]] = [
        {
            "mediaType": INDEX_TYPE,
            "digest": index.index_digest,
            "size": index.index_size,
            "annotations": {REF_ANNOTATION: ref},
        }
    ]
    entries += [
        {
            "mediaType": MANIFEST_TYPE,
            "digest": image.manifest_digest,
            "size": image.manifest_size,
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {REF_ANNOTATION: f"{ref}-{arch}"},
        }
        for arch, image in sorted(index.images.items())
    ]
    entries += extra
    return _layout({"schemaVersion": 2, "manifests": entries}, index.blobs)


def write_index_layout(
    directory_path: Path, index: Index, ref: str, extra: Sequence[Mapping[str, object]] = ()
) -> None:
    """Write the layout directory of `index` (replacing index.json)."""
    write_layout_files(directory_path, index_layout_files(index, ref, extra))


def write_index_archive(
    path: Path, index: Index, ref: str, extra: Sequence[Mapping[str, object]] = ()
) -> None:
    """The index's layout as one reproducible tar (skopeo's `oci-archive:` transport)."""
    write_archive_files(path, index_layout_files(index, ref, extra))


def platform_manifests(read: Callable[[str], bytes]) -> dict[str, dict[str, Any]]:
    """architecture -> image manifest of the layout whose files `read(name)` returns, following
    the first entry of index.json (an image, or an index of one image per platform)."""
    top = json.loads(read("index.json"))["manifests"][0]
    blob = json.loads(read("blobs/sha256/" + top["digest"].removeprefix("sha256:")))
    if top.get("mediaType") != INDEX_TYPE:
        return {"": blob}
    return {
        entry["platform"]["architecture"]: json.loads(
            read("blobs/sha256/" + entry["digest"].removeprefix("sha256:"))
        )
        for entry in blob["manifests"]
    }
