"""Assemble a release directory from one build of each architecture (`make release`,
docs/release.md):

    release.py --binary [ARCH=]FILE… [--record ARCH=FILE…] --zipapp FILE [--helm PATH] --out DIR

Writes, for version V and each architecture A given (amd64, arm64):

    cnibox-V-linux-A                    the single executable
    cnibox-V-linux-A.cdx.json           its CycloneDX SBOM (sbom.py, from the build's record
                                        build/out/bundled-A.json unless --record says)
    cnibox-talos-extension-V-linux-A.rootfs.tar   the extension's filesystem (imager's
                                        profile `tarballPath`)
and once:
    cnibox-V.pyz                        the zipapp (hosts with Python 3.11)
    cnibox-installer-V.oci.tar          the DaemonSet image (oci-archive), SBOM attached
    cnibox-talos-extension-V.oci.tar    the Talos system extension (oci-archive), SBOM attached
                                        (both: a multi-arch index when more than one A, each
                                        platform's image with its own SBOM)
    linkerd2-cni-V.tgz                  the Helm chart (`helm package`, made reproducible)
    linkerd-cni.yaml, linkerd-cni-talos.yaml   the chart rendered (packaging/kubernetes/)
    LICENSE, NOTICE
    SHA256SUMS                          sha256sum format, every file above

Reproducible: every timestamp comes from SOURCE_DATE_EPOCH (default: the commit time of
HEAD), archives have sorted members, fixed owners and modes; the same inputs give a
byte-identical directory (a test assembles twice and compares). The directory is written
beside the target and renamed into place, so a failed run leaves the previous one intact.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE / "helm"))

import images  # noqa: E402  # packaging/ and packaging/helm/ are on the path set just above
import manifests  # noqa: E402
import oci  # noqa: E402
import provenance  # noqa: E402
import sbom  # noqa: E402

from multicall import __version__  # noqa: E402

CHART_NAME = "linkerd2-cni"
RECORDS = REPO / "build" / "out"  # the build's records, bundled-<arch>.json (build/bundled.py)


class ReleaseError(Exception):
    """A step failed; the message says which and why."""


def arch_names(version: str, arch: str) -> dict[str, str]:
    """Role -> file name in the release directory, for one architecture's build."""
    return {
        "binary": f"cnibox-{version}-linux-{arch}",
        "sbom": provenance.sbom_filename(version, arch),
        "extension-rootfs": f"cnibox-talos-extension-{version}-linux-{arch}.rootfs.tar",
    }


def names(version: str) -> dict[str, str]:
    """Role -> file name in the release directory, for what all architectures share."""
    return {
        "zipapp": f"cnibox-{version}.pyz",
        images.IMAGE_NAME: f"cnibox-installer-{version}.oci.tar",
        images.TALOS_NAME: f"cnibox-talos-extension-{version}.oci.tar",
        "chart": f"{CHART_NAME}-{version}.tgz",
    }


def reproducible_tgz(data: bytes, mtime: int) -> bytes:
    """A gzipped tar with the same members in the same order, but every timestamp `mtime`,
    owner root with no names, modes 0644/0755, and a gzip header without name or time
    (`helm package` stamps the current time on every member)."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as source,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in source.getmembers():
            info = tarfile.TarInfo(member.name)
            info.type = member.type
            info.size = member.size
            info.mtime = mtime
            info.mode = 0o755 if member.isdir() else 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.linkname = member.linkname
            content = source.extractfile(member) if member.isfile() else None
            target.addfile(info, content)
    return oci.gzip_bytes(out.getvalue())


def package_chart(helm: str, dest: Path, epoch: int) -> Path:
    with tempfile.TemporaryDirectory(prefix="cnibox-chart-") as tmp:
        proc = subprocess.run(
            [helm, "package", str(manifests.CHART), "--destination", tmp],
            capture_output=True,
            text=True,
            check=False,
            env=manifests.helm_environment(tmp),
        )
        packaged = sorted(Path(tmp).glob(f"{CHART_NAME}-*.tgz"))
        if proc.returncode != 0 or len(packaged) != 1:
            raise ReleaseError(f"helm package failed: {proc.stderr.strip() or proc.stdout}")
        data = packaged[0].read_bytes()
    dest.write_bytes(reproducible_tgz(data, epoch))
    return dest


def sha256sums(directory: Path) -> str:
    lines = []
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{digest}  {path.name}\n")
    return "".join(lines)


def assemble(
    binaries: Mapping[str, Path],
    zipapp: Path,
    out: Path,
    *,
    helm: str,
    records: Mapping[str, Path] | None = None,
    env: Mapping[str, str] = os.environ,
) -> list[Path]:
    """Write the release of the `binaries` (architecture -> single file) into `out` (replaced
    as a whole); returns the files written."""
    info = provenance.build_info(__version__, env)
    # Every tool below reads the one clock the whole release uses.
    os.environ["SOURCE_DATE_EPOCH"] = str(info.epoch)
    records = records or {}
    shared = names(__version__)
    executables = {shared["zipapp"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        sboms: dict[str, bytes] = {}
        for arch, binary in sorted(binaries.items()):
            files = arch_names(__version__, arch)
            record = records.get(arch, RECORDS / f"bundled-{arch}.json")
            sbom_text = sbom.generate(record, binary, arch)
            sboms[arch] = sbom_text.encode()
            (staging / files["sbom"]).write_text(sbom_text)
            shutil.copyfile(binary, staging / files["binary"])
            executables.add(files["binary"])
            rootfs = oci.build_tar(images.talos_entries(binary.read_bytes()))
            (staging / files["extension-rootfs"]).write_bytes(rootfs)
        shutil.copyfile(zipapp, staging / shared["zipapp"])
        with tempfile.TemporaryDirectory(prefix="cnibox-images-") as tmp:
            if len(binaries) == 1:
                ((arch, binary),) = binaries.items()
                archives = images.build(binary, Path(tmp), __version__, sboms[arch], arch)
            else:
                archives = images.build_multiarch(binaries, Path(tmp), __version__, sboms)
            for role, archive in archives.items():
                shutil.copyfile(archive, staging / shared[role])
        package_chart(helm, staging / shared["chart"], info.epoch)
        for manifest in manifests.MANIFESTS:
            shutil.copyfile(manifests.OUT_DIR / manifest, staging / manifest)
        for notice in ("LICENSE", "NOTICE"):
            shutil.copyfile(REPO / notice, staging / notice)
        for path in staging.iterdir():
            path.chmod(0o755 if path.name in executables else 0o644)
        (staging / "SHA256SUMS").write_text(sha256sums(staging))
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(out.iterdir())


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--binary", action="append", required=True, metavar="[ARCH=]FILE")
    parser.add_argument(
        "--record",
        action="append",
        metavar="ARCH=FILE",
        help="the build's record of that binary (default: build/out/bundled-ARCH.json)",
    )
    parser.add_argument("--zipapp", type=Path, required=True)
    parser.add_argument("--helm", default=manifests.default_helm())
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        binaries = images.parse_binaries(args.binary)
        records = images.parse_binaries(args.record or [], "--record")
        assemble(binaries, args.zipapp, args.out, helm=args.helm, records=records)
    except (ReleaseError, sbom.SbomError, OSError, ValueError) as exc:
        sys.stderr.write(f"release.py: {exc}\n")
        return 1
    sys.stdout.write((args.out / "SHA256SUMS").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
