"""Where an artifact comes from, written into it: OCI labels and annotations, and the SBOM
attached to an image as an OCI artifact (docs/release.md).

- `BuildInfo`: version, source repository, git revision, creation time. The time is
  SOURCE_DATE_EPOCH when set, else the commit time of HEAD (the reproducible-builds
  convention), so the same commit builds the same bytes.
- `image_labels`: the `org.opencontainers.image.*` keys (pre-defined annotation keys of the
  OCI image spec) set both as config labels (what `skopeo inspect` shows as Labels) and as
  manifest annotations.
- `sbom_artifact`: an OCI 1.1 artifact manifest (artifactType application/vnd.cyclonedx+json,
  empty config, the SBOM as its one layer) whose `subject` is the image manifest, so registry
  tools that follow referrers find the SBOM from the image; returned as blobs plus the index
  descriptor to list beside the image in the layout.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import oci

REPO = Path(__file__).resolve().parent.parent
SOURCE = "https://github.com/cnibox/cnibox"
LICENSES = "Apache-2.0"
VENDOR = "cnibox developers"
EMPTY_CONFIG_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
SBOM_TYPE = "application/vnd.cyclonedx+json"
TITLE_ANNOTATION = "org.opencontainers.image.title"


@dataclass(frozen=True, slots=True)
class BuildInfo:
    version: str
    revision: str  # git commit (40 hex), "-dirty" appended when the tree had changes
    epoch: int  # seconds since 1970, UTC

    @property
    def created(self) -> str:
        """RFC 3339, as the OCI spec wants for `created`."""
        return datetime.fromtimestamp(self.epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def build_info(version: str, env: Mapping[str, str] = os.environ) -> BuildInfo:
    """The build's identity: `CNIBOX_REVISION` / `SOURCE_DATE_EPOCH` override git's."""
    revision = env.get("CNIBOX_REVISION") or _git("rev-parse", "HEAD") or "unknown"
    # Untracked files do not go into an artifact; changes to tracked ones may.
    own = "CNIBOX_REVISION" not in env and revision != "unknown"
    if own and _git("status", "--porcelain", "--untracked-files=no"):
        revision += "-dirty"
    epoch_text = env.get("SOURCE_DATE_EPOCH") or _git("log", "-1", "--format=%ct") or "0"
    try:
        epoch = int(epoch_text)
    except ValueError:
        raise ValueError(f"SOURCE_DATE_EPOCH={epoch_text!r} is not a number of seconds") from None
    return BuildInfo(version, revision, epoch)


def sbom_filename(version: str, arch: str) -> str:
    """The SBOM's name: beside the binary it describes (cnibox-V-linux-ARCH)."""
    return f"cnibox-{version}-linux-{arch}.cdx.json"


def image_labels(info: BuildInfo, title: str, description: str) -> dict[str, str]:
    """The OCI pre-defined annotation keys for an image of this build."""
    return {
        "org.opencontainers.image.title": title,
        "org.opencontainers.image.description": description,
        "org.opencontainers.image.version": info.version,
        "org.opencontainers.image.revision": info.revision,
        "org.opencontainers.image.created": info.created,
        "org.opencontainers.image.source": SOURCE,
        "org.opencontainers.image.url": SOURCE,
        "org.opencontainers.image.licenses": LICENSES,
        "org.opencontainers.image.vendor": VENDOR,
    }


def sbom_artifact(
    image: oci.Image, sbom: bytes, filename: str, info: BuildInfo
) -> tuple[oci.Image, dict[str, object]]:
    """`image` with the SBOM artifact's blobs added, and the artifact's index descriptor."""
    layer = {
        "mediaType": SBOM_TYPE,
        "digest": oci.sha256_digest(sbom),
        "size": len(sbom),
        "annotations": {TITLE_ANNOTATION: filename},
    }
    manifest = oci.canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": oci.MANIFEST_TYPE,
            "artifactType": SBOM_TYPE,
            "config": {
                "mediaType": EMPTY_CONFIG_TYPE,
                "digest": oci.sha256_digest(EMPTY_CONFIG),
                "size": len(EMPTY_CONFIG),
            },
            "layers": [layer],
            "subject": {
                "mediaType": oci.MANIFEST_TYPE,
                "digest": image.manifest_digest,
                "size": image.manifest_size,
            },
            "annotations": {"org.opencontainers.image.created": info.created},
        }
    )
    blobs = dict(image.blobs)
    for blob in (sbom, EMPTY_CONFIG, manifest):
        blobs[oci.sha256_digest(blob)] = blob
    descriptor: dict[str, object] = {
        "mediaType": oci.MANIFEST_TYPE,
        "artifactType": SBOM_TYPE,
        "digest": oci.sha256_digest(manifest),
        "size": len(manifest),
    }
    return oci.Image(blobs, image.manifest_digest, image.manifest_size), descriptor
