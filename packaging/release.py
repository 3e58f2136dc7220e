"""Assemble a release directory from one build (`make release`, docs/release.md):

    release.py --binary FILE --zipapp FILE --dist DIR [--arch amd64] [--helm PATH] --out DIR

Writes, for version V and architecture A:

    cnibox-V-linux-A                    the single executable
    cnibox-V.pyz                        the zipapp (hosts with Python 3.11)
    cnibox-V-linux-A.cdx.json           CycloneDX SBOM of the executable (sbom.py)
    cnibox-installer-V.oci.tar          the DaemonSet image (oci-archive), SBOM attached
    cnibox-talos-extension-V.oci.tar    the Talos system extension (oci-archive), SBOM attached
    cnibox-talos-extension-V.rootfs.tar its filesystem (imager's profile `tarballPath`)
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
import platform
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

import manifests  # noqa: E402
import oci  # noqa: E402
import provenance  # noqa: E402
import sbom  # noqa: E402

import build  # noqa: E402  # packaging/ and packaging/helm/ are on the path set just above
from multicall import __version__  # noqa: E402

ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
CHART_NAME = "linkerd2-cni"


class ReleaseError(Exception):
    """A step failed; the message says which and why."""


def names(version: str, arch: str) -> dict[str, str]:
    """Role -> file name in the release directory."""
    return {
        "binary": f"cnibox-{version}-linux-{arch}",
        "zipapp": f"cnibox-{version}.pyz",
        "sbom": provenance.sbom_filename(version, arch),
        build.IMAGE_NAME: f"cnibox-installer-{version}.oci.tar",
        build.TALOS_NAME: f"cnibox-talos-extension-{version}.oci.tar",
        "extension-rootfs": f"cnibox-talos-extension-{version}.rootfs.tar",
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
    binary: Path,
    zipapp: Path,
    dist: Path,
    out: Path,
    *,
    arch: str,
    helm: str,
    root: Path = Path("/"),
    env: Mapping[str, str] = os.environ,
) -> dict[str, Path]:
    """Write the release into `out` (replaced as a whole); returns role -> path."""
    info = provenance.build_info(__version__, env)
    # Every tool below reads the one clock the whole release uses.
    os.environ["SOURCE_DATE_EPOCH"] = str(info.epoch)
    files = names(__version__, arch)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        shutil.copyfile(binary, staging / files["binary"])
        shutil.copyfile(zipapp, staging / files["zipapp"])
        for name in (files["binary"], files["zipapp"]):
            (staging / name).chmod(0o755)
        launcher_libc = sbom.default_launcher_libc(root, arch)
        sbom_text = sbom.generate(dist, arch, root, launcher_libc)
        (staging / files["sbom"]).write_text(sbom_text)
        with tempfile.TemporaryDirectory(prefix="cnibox-images-") as tmp:
            archives = build.build(binary, Path(tmp), __version__, sbom_text.encode(), arch)
            for role, archive in archives.items():
                shutil.copyfile(archive, staging / files[role])
        rootfs = oci.build_tar(build.talos_entries(binary.read_bytes()))
        (staging / files["extension-rootfs"]).write_bytes(rootfs)
        package_chart(helm, staging / files["chart"], info.epoch)
        for manifest in manifests.MANIFESTS:
            shutil.copyfile(manifests.OUT_DIR / manifest, staging / manifest)
        for notice in ("LICENSE", "NOTICE"):
            shutil.copyfile(REPO / notice, staging / notice)
        for path in staging.iterdir():
            path.chmod(0o755 if path.name in (files["binary"], files["zipapp"]) else 0o644)
        (staging / "SHA256SUMS").write_text(sha256sums(staging))
        staging.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {role: out / name for role, name in files.items()}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--binary", type=Path, required=True)
    parser.add_argument("--zipapp", type=Path, required=True)
    parser.add_argument("--dist", type=Path, required=True, help="the Nuitka dist it packs")
    parser.add_argument("--arch", default=ARCHES.get(platform.machine(), platform.machine()))
    parser.add_argument("--root", type=Path, default=Path("/"), help="dpkg root (sbom.py)")
    parser.add_argument("--helm", default=manifests.default_helm())
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        assemble(
            args.binary,
            args.zipapp,
            args.dist,
            args.out,
            arch=args.arch,
            helm=args.helm,
            root=args.root,
        )
    except (ReleaseError, sbom.SbomError, OSError, ValueError) as exc:
        sys.stderr.write(f"release.py: {exc}\n")
        return 1
    sys.stdout.write((args.out / "SHA256SUMS").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
