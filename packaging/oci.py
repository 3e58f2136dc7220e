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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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
    files = {"oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"})}
    files["index.json"] = canonical_json(index)
    for digest, blob in image.blobs.items():
        files["blobs/sha256/" + digest.removeprefix("sha256:")] = blob
    return files


def write_layout(
    directory_path: Path, image: Image, ref: str, extra: Sequence[Mapping[str, object]] = ()
) -> None:
    """Write the layout directory (replacing index.json; blobs are content-addressed)."""
    for name, data in layout_files(image, ref, extra).items():
        path = directory_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def write_archive(
    path: Path, image: Image, ref: str, extra: Sequence[Mapping[str, object]] = ()
) -> None:
    """The layout as one reproducible tar (skopeo's `oci-archive:` transport)."""
    files = layout_files(image, ref, extra)
    dirs = {"blobs", "blobs/sha256"}
    entries = [directory(d) for d in dirs]
    entries += [file(name, data, 0o644) for name, data in files.items()]
    path.write_bytes(build_tar(entries))


def read_layer_entries(archive: Path) -> list[tarfile.TarInfo]:
    """The members of the single layer of an oci-archive built here (for checks)."""
    with tarfile.open(archive) as outer:
        index = json.loads(_member(outer, "index.json"))
        manifest_digest = index["manifests"][0]["digest"].removeprefix("sha256:")
        manifest = json.loads(_member(outer, f"blobs/sha256/{manifest_digest}"))
        layer_digest = manifest["layers"][0]["digest"].removeprefix("sha256:")
        layer = _member(outer, f"blobs/sha256/{layer_digest}")
    with tarfile.open(fileobj=io.BytesIO(layer), mode="r:gz") as inner:
        return inner.getmembers()


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    extracted = tar.extractfile(name)
    if extracted is None:
        raise FileNotFoundError(name)
    return extracted.read()
