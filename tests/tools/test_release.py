"""The release: SBOM (packaging/sbom.py), provenance (packaging/provenance.py), assembly with
SHA256SUMS (packaging/release.py), reproducibility.

The assembly runs twice from the same inputs (a stand-in binary and a stand-in dist made of
real host libraries, one of them patched the way Nuitka patches the copies it makes), which
proves byte-identical output in seconds instead of two builds. Under `make test-binary`
(CNIBOX set) the real dist the single file packs gets its SBOM too, and every bundled shared
library must be named with its Debian package version.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from multicall import __version__
from tests.support import REPO, require_tool, skip_or_fail
from tests.support.helm import manifests, pinned_helm

PACKAGING = REPO / "packaging"
SBOM = PACKAGING / "sbom.py"
RELEASE = PACKAGING / "release.py"
REAL_DIST = REPO / "build" / "out" / "cnibox_main.dist"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
LIBDIR = Path("/usr/lib") / str(sysconfig.get_config_var("MULTIARCH"))
EPOCH = 1_700_000_000
REVISION = "0123456789abcdef0123456789abcdef01234567"
ENV = {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH), "CNIBOX_REVISION": REVISION}


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=ENV, **kwargs)


def dpkg_version(package: str) -> str:
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=True
    )
    return proc.stdout


def python_extension() -> tuple[str, Path]:
    """An extension module of the build's Python, and its name as Nuitka copies it."""
    module = min((Path(sysconfig.get_paths()["stdlib"]) / "lib-dynload").glob("*.so"))
    return module.name.split(".", 1)[0] + ".so", module


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dist like Nuitka's, from real files: Debian libraries (identical copies, and one with
    an RPATH added as Nuitka does), a CPython extension module, PyYAML's extension, the
    locale, and stand-ins for cnibox's own files; plus a stand-in binary and zipapp."""
    patchelf = require_tool("patchelf")
    base = tmp_path_factory.mktemp("standin")
    dist = base / "dist"
    for sub in ("iptlibs", "xtables", "locale/C.utf8", "yaml"):
        (dist / sub).mkdir(parents=True)
    copies = {
        "libc.so.6": LIBDIR / "libc.so.6",
        "libz.so.1": LIBDIR / "libz.so.1",
        "libssl.so.3": LIBDIR / "libssl.so.3",
        "iptlibs/libip4tc.so": LIBDIR / "libip4tc.so.2",
        "xtables/libxt_comment.so": LIBDIR / "xtables" / "libxt_comment.so",
        "locale/C.utf8/LC_CTYPE": Path("/usr/lib/locale/C.utf8/LC_CTYPE"),
    }
    name, module = python_extension()
    copies[name] = module
    import yaml

    copies["yaml/_yaml.so"] = next(Path(yaml.__file__).parent.glob("_yaml.*.so"))
    for name, source in copies.items():
        shutil.copyfile(source.resolve(), dist / name)
    for patched in ("libssl.so.3", name):
        subprocess.run([patchelf, "--set-rpath", "$ORIGIN", str(dist / patched)], check=True)
    (dist / "cnibox.bin").write_bytes(b"\x7fELF stand-in for cnibox.bin\n")
    (dist / "dataclasses.marshal").write_bytes(b"stand-in")
    (base / "cnibox").write_bytes(b"\x7fELF stand-in for the single file\n")
    (base / "cnibox.pyz").write_bytes(b"#!/usr/bin/env python3\nstand-in zipapp\n")
    return base


def sbom_of(dist: Path, out: Path) -> dict[str, Any]:
    proc = run([sys.executable, str(SBOM), "--dist", str(dist), "--arch", ARCH, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def owners(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """File inside the single file -> the component listing it."""
    found: dict[str, dict[str, Any]] = {}
    for component in [document["metadata"]["component"], *document["components"]]:
        for prop in component.get("properties", []):
            if prop["name"] == "cnibox:file":
                path = prop["value"].split(" sha256:")[0]
                assert path not in found, f"{path} listed twice"
                found[path] = component
    return found


def validate(text: str) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None


class TestSbom:
    def test_validates_and_names_every_file(self, standin: Path, releases: list[Path]) -> None:
        """CycloneDX 1.6 (strict schema); each file owned once; Debian files by package+version
        (the SBOM the release wrote for the stand-in dist; twice the same bytes, see below)."""
        text = (releases[0] / f"cnibox-{__version__}-linux-{ARCH}.cdx.json").read_text()
        validate(text)
        document = json.loads(text)
        assert document["specVersion"] == "1.6"
        assert document["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"
        files = owners(document)
        dist_files = {
            f"dist/{p.relative_to(standin / 'dist').as_posix()}"
            for p in (standin / "dist").rglob("*")
            if p.is_file()
        }
        assert dist_files <= set(files)
        expected_packages = {
            "dist/libc.so.6": "libc6",
            "dist/libz.so.1": "zlib1g",
            "dist/libssl.so.3": "libssl3",  # patched like Nuitka's copies: found by build-id
            "dist/iptlibs/libip4tc.so": "libip4tc2",
            "dist/xtables/libxt_comment.so": "iptables",
            "dist/locale/C.utf8/LC_CTYPE": "libc-bin",
        }
        for path, package in expected_packages.items():
            component = files[path]
            assert component["name"] == package
            assert component["version"] == dpkg_version(package)
            assert component["purl"].startswith(f"pkg:deb/debian/{package}@")
            assert f"arch={ARCH}" in component["purl"]
        assert files["dist/yaml/_yaml.so"]["name"] == "PyYAML"
        assert files["dist/cnibox.bin"]["name"] == "cnibox"
        # The build's Python: pyenv's here (cpython), or Debian's (a libpython3.X package).
        owner = files[f"dist/{python_extension()[0]}"]["name"]
        assert owner == "cpython" or owner.startswith("libpython3")
        names = {c["name"] for c in document["components"]}
        assert {"python-iptables", "PyYAML", "Nuitka", "zstd", "musl-dev"} <= names

    def test_a_file_nobody_owns_fails_the_sbom(self, standin: Path, tmp_path: Path) -> None:
        """Completeness is enforced: an unknown file is named and nothing is written."""
        dist = tmp_path / "dist"
        shutil.copytree(standin / "dist", dist)
        (dist / "mystery.so").write_bytes(b"\x7fELF not from anywhere")
        out = tmp_path / "sbom.json"
        proc = run(
            [sys.executable, str(SBOM), "--dist", str(dist), "--arch", ARCH, "--out", str(out)]
        )
        assert proc.returncode == 1
        assert "dist/mystery.so" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not out.exists()

    def test_real_dist_names_every_bundled_library(self, tmp_path: Path) -> None:
        """The dist dist/cnibox packs: every shared library with its Debian package version,
        and NOTICE lists every bundled Debian source package and Python distribution."""
        if not os.environ.get("CNIBOX"):
            pytest.skip("runs against the built dist (make test-binary)")
        if not REAL_DIST.is_dir():
            skip_or_fail(f"{REAL_DIST} missing: build the binary first")
        document = sbom_of(REAL_DIST, tmp_path / "sbom.json")
        validate((tmp_path / "sbom.json").read_text())
        files = owners(document)
        libraries = [
            p
            for p in REAL_DIST.rglob("*")
            if p.is_file() and (".so" in p.name or p.name.startswith("ld-linux"))
        ]
        assert len(libraries) > 150
        debian = {}
        for library in libraries:
            component = files[f"dist/{library.relative_to(REAL_DIST).as_posix()}"]
            if component["purl"].startswith("pkg:deb/"):
                debian[component["name"]] = component
        assert {"libc6", "libssl3", "zlib1g", "libxtables12", "iptables"} <= set(debian)
        for name, component in debian.items():
            assert component["version"] == dpkg_version(name), name
        notice = (REPO / "NOTICE").read_text()
        for component in document["components"]:
            for prop in component.get("properties", []):
                if prop["name"] == "cnibox:debian-source-package":
                    assert f"- {prop['value']}:" in notice, prop["value"]
            if component["purl"].startswith("pkg:pypi/"):
                assert component["name"] in notice, component["name"]


@pytest.fixture(scope="module")
def releases(standin: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The release assembled twice from the same stand-in build."""
    out = tmp_path_factory.mktemp("releases")
    dirs = []
    for name in ("first", "second"):
        target = out / name
        proc = run(
            [
                sys.executable,
                str(RELEASE),
                "--binary",
                str(standin / "cnibox"),
                "--zipapp",
                str(standin / "cnibox.pyz"),
                "--dist",
                str(standin / "dist"),
                "--arch",
                ARCH,
                "--helm",
                pinned_helm(),
                "--out",
                str(target),
            ]
        )
        assert proc.returncode == 0, proc.stderr
        dirs.append(target)
    return dirs


def release_names() -> set[str]:
    v = __version__
    return {
        f"cnibox-{v}-linux-{ARCH}",
        f"cnibox-{v}.pyz",
        f"cnibox-{v}-linux-{ARCH}.cdx.json",
        f"cnibox-installer-{v}.oci.tar",
        f"cnibox-talos-extension-{v}.oci.tar",
        f"cnibox-talos-extension-{v}.rootfs.tar",
        f"linkerd2-cni-{v}.tgz",
        "linkerd-cni.yaml",
        "linkerd-cni-talos.yaml",
        "LICENSE",
        "NOTICE",
        "SHA256SUMS",
    }


class TestRelease:
    def test_two_assemblies_are_byte_identical(self, releases: list[Path]) -> None:
        first, second = releases
        assert {p.name for p in first.iterdir()} == release_names()
        assert (first / "SHA256SUMS").read_text() == (second / "SHA256SUMS").read_text()
        for path in first.iterdir():
            assert path.read_bytes() == (second / path.name).read_bytes(), path.name

    def test_sha256sums_verify(self, releases: list[Path]) -> None:
        proc = subprocess.run(
            ["sha256sum", "--check", "--strict", "SHA256SUMS"],
            cwd=releases[0],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        listed = set(proc.stdout.splitlines())
        assert listed == {f"{name}: OK" for name in release_names() - {"SHA256SUMS"}}

    @pytest.mark.parametrize("image", ["cnibox-installer", "cnibox-talos-extension"])
    def test_skopeo_shows_the_labels(self, releases: list[Path], image: str) -> None:
        """source, revision, version, licenses, created (from SOURCE_DATE_EPOCH)."""
        skopeo = require_tool("skopeo")
        archive = releases[0] / f"{image}-{__version__}.oci.tar"
        proc = subprocess.run(
            [skopeo, "inspect", f"oci-archive:{archive}:{__version__}"],
            capture_output=True,
            text=True,
            check=True,
        )
        inspected = json.loads(proc.stdout)
        created = datetime.fromtimestamp(EPOCH, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        labels = inspected["Labels"]
        assert labels["org.opencontainers.image.source"] == "https://github.com/cnibox/cnibox"
        assert labels["org.opencontainers.image.revision"] == REVISION
        assert labels["org.opencontainers.image.version"] == __version__
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        assert labels["org.opencontainers.image.created"] == created
        assert labels["org.opencontainers.image.title"] == image
        assert inspected["Created"] == created

    @pytest.mark.parametrize("image", ["cnibox-installer", "cnibox-talos-extension"])
    def test_sbom_is_attached_to_the_image(self, releases: list[Path], image: str) -> None:
        """An OCI artifact in the layout whose subject is the image and whose layer is the SBOM."""
        release = releases[0]
        with tarfile.open(release / f"{image}-{__version__}.oci.tar") as tar:

            def blob(digest: str) -> bytes:
                member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
                assert member is not None
                return member.read()

            index_file = tar.extractfile("index.json")
            assert index_file is not None
            index = json.load(index_file)
            tagged, artifact = index["manifests"]
            assert artifact["artifactType"] == "application/vnd.cyclonedx+json"
            manifest = json.loads(blob(artifact["digest"]))
            assert manifest["subject"]["digest"] == tagged["digest"]
            (layer,) = manifest["layers"]
            sbom = blob(layer["digest"])
        assert sbom == (release / f"cnibox-{__version__}-linux-{ARCH}.cdx.json").read_bytes()
        assert hashlib.sha256(sbom).hexdigest() == layer["digest"].removeprefix("sha256:")

    def test_chart_package_is_helm_readable_and_dated(self, releases: list[Path]) -> None:
        package = releases[0] / f"linkerd2-cni-{__version__}.tgz"
        with tarfile.open(package) as tar:
            members = tar.getmembers()
        assert {m.mtime for m in members} == {EPOCH}
        assert "linkerd2-cni/templates/cni-plugin.yaml" in {m.name for m in members}
        env = manifests.helm_environment(str(releases[0].parent / "helm"))
        shown, rendered = (
            subprocess.run(
                [pinned_helm(), *args, str(package)],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            for args in (["show", "chart"], ["template", "linkerd2-cni"])
        )
        assert f"version: {__version__}" in shown.stdout
        assert "name: linkerd-cni-config" in rendered.stdout

    def test_extension_rootfs_is_the_extension_layer(self, releases: list[Path]) -> None:
        """The rootfs tar (imager's tarballPath input) holds manifest.yaml and rootfs/ only."""
        with tarfile.open(releases[0] / f"cnibox-talos-extension-{__version__}.rootfs.tar") as t:
            tops = {m.name.split("/", 1)[0] for m in t.getmembers()}
        assert tops == {"manifest.yaml", "rootfs"}


def test_zipapp_writer_is_reproducible(tmp_path: Path) -> None:
    """build/build.py's zipapp: the same tree twice, with other mtimes, gives the same bytes."""
    spec = importlib.util.spec_from_file_location(
        "cnibox_build_script", REPO / "build" / "build.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as importlib's recipe: dataclasses look their module up
    spec.loader.exec_module(module)
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "__main__.py").write_text("print('hi')\n")
    (tree / "pkg" / "__init__.py").write_text("")
    module.write_zipapp(tree, tmp_path / "a.pyz", interpreter="/usr/bin/env python3")
    for path in tree.rglob("*"):
        os.utime(path, (EPOCH, EPOCH))
    module.write_zipapp(tree, tmp_path / "b.pyz", interpreter="/usr/bin/env python3")
    assert (tmp_path / "a.pyz").read_bytes() == (tmp_path / "b.pyz").read_bytes()
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "a.pyz")], capture_output=True, text=True, check=True
    )
    assert proc.stdout == "hi\n"
