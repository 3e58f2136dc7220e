"""The release: the build's attribution (build/bundled.py), the SBOM made from it
(packaging/sbom.py), provenance (packaging/provenance.py), assembly with SHA256SUMS
(packaging/release.py), reproducibility.

The stand-in build is made of real host files, so the attribution is the real one (dpkg, the
venv's RECORDs, the interpreter's standard library): a dist of Debian libraries (identical
copies, and one patched the way Nuitka patches its copies), a CPython extension module,
PyYAML's extension, the locale; the plugin's `bundled.json` and a Nuitka report naming their
sources and a few compiled modules. The release is assembled twice from it (an amd64 and an
arm64 stand-in: the arm64 record is the amd64 one relabelled, since only the assembly is
tested there), which proves byte-identical output in seconds instead of two builds of each
architecture. Under `make test-binary` (CNIBOX set) the real build's record and SBOM are
checked (tests/support/sbom.py; arm64's in tests/arm64/test_sbom.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from datetime import UTC, datetime
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest

from multicall import __version__
from tests.support import REPO, require_tool
from tests.support.artifact import artifact_path
from tests.support.helm import manifests, pinned_helm
from tests.support.sbom import (
    bundled_module,
    check_real_sbom,
    dpkg_version,
    modules,
    owners,
    run_sbom,
    validate,
)
from tests.support.scripts import load_script

PACKAGING = REPO / "packaging"
RELEASE = PACKAGING / "release.py"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
ARCHES = ("amd64", "arm64")
LIBDIR = Path("/usr/lib") / str(sysconfig.get_config_var("MULTIARCH"))
EPOCH = 1_700_000_000
REVISION = "0123456789abcdef0123456789abcdef01234567"
ENV = {**os.environ, "SOURCE_DATE_EPOCH": str(EPOCH), "CNIBOX_REVISION": REVISION}
SITE = sysconfig.get_paths()["purelib"]
STDLIB = sysconfig.get_paths()["stdlib"]


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=ENV, **kwargs)


def python_extension() -> tuple[str, Path]:
    """An extension module of the build's Python, and its name as Nuitka copies it."""
    module = min((Path(STDLIB) / "lib-dynload").glob("*.so"))
    return module.name.split(".", 1)[0] + ".so", module


def static_libpython() -> str | None:
    """The static libpython Nuitka links this interpreter with (pyenv's, or Debian's)."""
    libpl = Path(str(sysconfig.get_config_var("LIBPL")))
    found = [p for p in (libpl / "libpython3.11.a", libpl / "libpython3.11-pic.a") if p.is_file()]
    return str(found[0].resolve()) if found else None


def prefix_table() -> list[tuple[str, str]]:
    """The path abbreviations of Nuitka's report, for this interpreter."""
    return [("${sys.real_prefix}", sys.base_prefix), ("${sys.prefix}", sys.prefix),
            ("${cwd}", str(REPO)), ("~", os.path.expanduser("~"))]  # fmt: skip


def report_xml(report_modules: dict[str, str], copies: dict[str, str]) -> str:
    """A Nuitka --report with the modules (name -> source) and copied files (dest -> source)."""
    lines = ['<nuitka-compilation-report nuitka_version="4.3.3" completion="yes">']
    for name, source in report_modules.items():
        lines.append(f'<module name="{name}" kind="CompiledPythonModule" source_path="{source}"/>')
    for dest, source in copies.items():
        tag = "included_extension" if "cpython-" in source else "included_dll"
        lines.append(f'<{tag} name="{dest}" dest_path="{dest}" source_path="{source}"/>')
    lines.append(f'<python python_version="{platform.python_version()}"/>')
    lines.append("</nuitka-compilation-report>")
    return "\n".join(lines) + "\n"


def reported(path: Path | str) -> str:
    """A path as Nuitka's report abbreviates it."""
    text = str(path)
    for name, prefix in prefix_table():
        if text.startswith(prefix + "/"):
            return name + text[len(prefix) :]
    return text


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build like `make build`'s, from real files (see the module docstring): base/dist,
    base/bundled.json (the plugin's), base/nuitka-report.xml, base/cnibox (a stand-in single
    file)."""
    patchelf = require_tool("patchelf")
    base = tmp_path_factory.mktemp("standin")
    dist = base / "dist"
    for sub in ("iptlibs", "xtables", "locale/C.utf8", "yaml"):
        (dist / sub).mkdir(parents=True)
    plugin_copies = {
        "libc.so.6": LIBDIR / "libc.so.6",
        "libz.so.1": LIBDIR / "libz.so.1",
        "libssl.so.3": LIBDIR / "libssl.so.3",
        "iptlibs/libip4tc.so": LIBDIR / "libip4tc.so.2",
        "xtables/libxt_comment.so": LIBDIR / "xtables" / "libxt_comment.so",
        "locale/C.utf8/LC_CTYPE": Path("/usr/lib/locale/C.utf8/LC_CTYPE"),
    }
    name, module = python_extension()
    import yaml

    nuitka_copies = {
        name: module,
        "yaml/_yaml.so": next(Path(yaml.__file__).parent.glob("_yaml.*.so")),
        # A file of the repository stands in for the dataclass cache the build writes there.
        "dataclasses.marshal": REPO / "build" / "cnibox_main.py",
    }
    for rel, source in {**plugin_copies, **nuitka_copies}.items():
        shutil.copyfile(source.resolve(), dist / rel)
    for patched in ("libssl.so.3", name):
        subprocess.run([patchelf, "--set-rpath", "$ORIGIN", str(dist / patched)], check=True)
    (dist / "cnibox.bin").write_bytes(b"\x7fELF stand-in for cnibox.bin\n")
    compiled = {
        "__main__": REPO / "build" / "cnibox_main.py",
        "multicall.dispatch": REPO / "multicall" / "dispatch.py",
        "json": Path(STDLIB) / "json" / "__init__.py",
        "yaml": Path(yaml.__file__),
        "iptc.util": Path(SITE) / "iptc" / "util.py",
    }
    (base / "nuitka-report.xml").write_text(
        report_xml(
            {n: reported(p) for n, p in compiled.items()},
            {d: reported(s.resolve()) for d, s in nuitka_copies.items()},
        )
    )
    build = {
        "cwd": str(REPO),
        "report_prefixes": prefix_table(),
        "site_dirs": [SITE],
        "stdlib": STDLIB,
        "static_libpython": static_libpython(),
    }
    sources = {rel: str(source.resolve()) for rel, source in plugin_copies.items()}
    plugin = {"machine": platform.machine(), "sources": sources, "build": build}
    (base / "bundled.json").write_text(json.dumps(plugin))
    (base / "cnibox-amd64").write_bytes(b"\x7fELF stand-in for the amd64 single file\n")
    (base / "cnibox-arm64").write_bytes(b"\x7fELF stand-in for the arm64 single file\n")
    (base / "cnibox.pyz").write_bytes(b"#!/usr/bin/env python3\nstand-in zipapp\n")
    return base


def make_record(base: Path, **changes: Any) -> dict[str, Any]:
    """build/bundled.py's record of the stand-in build (raises its AttributionError)."""
    bundled = bundled_module()
    inputs = bundled.Inputs(
        arch="amd64",
        machine="x86_64",
        dist=base / "dist",
        plugin_record=base / "bundled.json",
        report=base / "nuitka-report.xml",
        root=Path("/"),
        launcher_libc="/usr/lib/x86_64-linux-musl/libc.a",
        artifact=base / "cnibox-amd64",
        version=__version__,
    )
    record: dict[str, Any] = bundled.make_record(dataclasses.replace(inputs, **changes))
    return record


@pytest.fixture(scope="module")
def records(standin: Path) -> dict[str, Path]:
    """The stand-in build's record per architecture (arm64: the amd64 one relabelled)."""
    record = make_record(standin)
    arm64 = {**record, "arch": "arm64", "machine": "aarch64"}
    arm64["artifact_sha256"] = hashlib.sha256((standin / "cnibox-arm64").read_bytes()).hexdigest()
    paths = {}
    for arch, content in (("amd64", record), ("arm64", arm64)):
        paths[arch] = standin / f"bundled-{arch}.json"
        paths[arch].write_text(json.dumps(content, indent=1, sort_keys=True))
    return paths


def mutated(standin: Path, tmp_path: Path) -> Path:
    """A copy of the stand-in build to break."""
    copy = tmp_path / "build"
    shutil.copytree(standin, copy, symlinks=True)
    return copy


class TestAttribution:
    def test_every_file_and_module_has_its_owner(self, records: dict[str, Path]) -> None:
        """Each dist file with its verified source and owner (Debian package and version,
        Python distribution, CPython, cnibox); modules likewise; the linked libraries."""
        record = json.loads(records["amd64"].read_text())
        components = record["components"]
        by_path = {f["path"]: f for f in record["files"]}
        expected = {
            "dist/libc.so.6": "libc6",
            "dist/libz.so.1": "zlib1g",
            "dist/libssl.so.3": "libssl3",
            "dist/iptlibs/libip4tc.so": "libip4tc2",
            "dist/xtables/libxt_comment.so": "iptables",
            "dist/locale/C.utf8/LC_CTYPE": "libc-bin",
        }
        for path, package in expected.items():
            component = components[by_path[path]["component"]]
            assert (component["type"], component["name"]) == ("deb", package)
            assert component["version"] == dpkg_version(package)
        assert by_path["dist/libssl.so.3"]["match"] == "build-id"  # patched like Nuitka's copies
        assert by_path["dist/libz.so.1"]["match"] == "identical"
        assert components[by_path["dist/yaml/_yaml.so"]["component"]]["name"] == "PyYAML"
        assert by_path["dist/cnibox.bin"]["component"] == "cnibox"
        assert by_path["dist/dataclasses.marshal"]["component"] == "cnibox"
        # The build's Python: pyenv's here (cpython), or Debian's (a libpython3.X package).
        owner = components[by_path[f"dist/{python_extension()[0]}"]["component"]]
        assert owner["name"] == "cpython" or owner["name"].startswith("libpython3")
        by_module = {m["name"]: components[m["component"]]["name"] for m in record["modules"]}
        assert by_module["__main__"] == by_module["multicall.dispatch"] == "cnibox"
        assert by_module["yaml"] == "PyYAML"
        assert by_module["iptc.util"] == "python-iptables"
        assert by_module["json"] == "cpython" or by_module["json"].startswith("libpython3")
        linked = {link["into"]: components[link["component"]]["name"] for link in record["linked"]}
        assert linked["launcher"] == "musl-dev"
        assert (
            record["artifact_sha256"]
            == hashlib.sha256((records["amd64"].parent / "cnibox-amd64").read_bytes()).hexdigest()
        )

    def test_an_undeclared_distribution_compiled_in_fails(
        self, standin: Path, tmp_path: Path
    ) -> None:
        """setuptools' distutils compiled in (what python-iptables' `import distutils` did
        before the build kept it out): the build fails, naming setuptools and its modules."""
        build = mutated(standin, tmp_path)
        setuptools = distribution("setuptools")
        sysconfig_py = next(f for f in setuptools.files or [] if str(f).endswith(
            "_distutils/sysconfig.py"))  # fmt: skip
        report = (build / "nuitka-report.xml").read_text()
        extra = '<module name="distutils.sysconfig" kind="UncompiledPythonModule" '
        extra += f'source_path="{reported(Path(str(setuptools.locate_file(sysconfig_py))))}"/>'
        (build / "nuitka-report.xml").write_text(report.replace("</nuitka", extra + "\n</nuitka"))
        bundled = bundled_module()
        with pytest.raises(bundled.AttributionError) as failure:
            make_record(build, dist=build / "dist", plugin_record=build / "bundled.json",
                        report=build / "nuitka-report.xml")  # fmt: skip
        assert f"setuptools {setuptools.version} (distutils.sysconfig)" in str(failure.value)
        assert "does not declare" in str(failure.value)

    def test_a_file_without_a_source_fails(self, standin: Path, tmp_path: Path) -> None:
        """Completeness is enforced: an unknown file is named and no record is made."""
        build = mutated(standin, tmp_path)
        (build / "dist" / "mystery.so").write_bytes(b"\x7fELF not from anywhere")
        bundled = bundled_module()
        with pytest.raises(bundled.AttributionError, match=r"dist/mystery\.so: the build recorded"):
            make_record(build, dist=build / "dist", plugin_record=build / "bundled.json")

    def test_a_copy_unlike_its_source_fails(self, standin: Path, tmp_path: Path) -> None:
        """A dist file that is not its recorded source (nor a patched copy of that ELF)."""
        build = mutated(standin, tmp_path)
        locale = build / "dist" / "locale" / "C.utf8" / "LC_CTYPE"
        locale.write_bytes(locale.read_bytes() + b"\0")
        bundled = bundled_module()
        with pytest.raises(bundled.AttributionError, match="LC_CTYPE: differs from its recorded"):
            make_record(build, dist=build / "dist", plugin_record=build / "bundled.json")

    def test_a_source_nobody_owns_fails(self, standin: Path, tmp_path: Path) -> None:
        """A file copied from somewhere no package, distribution or CPython installed."""
        build = mutated(standin, tmp_path)
        stray = tmp_path / "libstray.so"
        stray.write_bytes(b"\x7fELF stray")
        shutil.copyfile(stray, build / "dist" / "libstray.so")
        plugin = json.loads((build / "bundled.json").read_text())
        plugin["sources"]["libstray.so"] = str(stray)
        (build / "bundled.json").write_text(json.dumps(plugin))
        bundled = bundled_module()
        with pytest.raises(bundled.AttributionError, match=r"dist/libstray\.so .* no package"):
            make_record(build, dist=build / "dist", plugin_record=build / "bundled.json")


class TestSbom:
    @pytest.mark.parametrize("arch", ARCHES)
    def test_validates_and_lists_every_file(
        self, records: dict[str, Path], releases: list[Path], arch: str
    ) -> None:
        """CycloneDX 1.6 (strict schema); each file of the record listed once, each module,
        each component with its purl (the SBOM the release wrote; twice the same bytes)."""
        text = (releases[0] / f"cnibox-{__version__}-linux-{arch}.cdx.json").read_text()
        validate(text)
        document = json.loads(text)
        record = json.loads(records[arch].read_text())
        assert document["specVersion"] == "1.6"
        assert document["metadata"]["timestamp"] == "2023-11-14T22:13:20+00:00"
        files = owners(document)
        assert set(files) == {f["path"] for f in record["files"]}
        for path, package in (("dist/libssl.so.3", "libssl3"), ("dist/libc.so.6", "libc6")):
            component = files[path]
            assert component["name"] == package
            assert component["version"] == dpkg_version(package)
            assert component["purl"].startswith(f"pkg:deb/debian/{package}@")
            assert "distro=debian-12" in component["purl"]
        assert files["dist/yaml/_yaml.so"]["purl"] == "pkg:pypi/pyyaml@6.0.4"
        assert files["dist/cnibox.bin"]["name"] == "cnibox"
        assert modules(document) == {
            m["name"]: record["components"][m["component"]]["name"] for m in record["modules"]
        }
        names = {c["name"] for c in document["components"]}
        assert {"python-iptables", "PyYAML", "Nuitka", "zstd", "musl-dev"} <= names
        properties = document["metadata"]["component"]["properties"]
        assert {"name": "cnibox:architecture", "value": arch} in properties

    def test_the_record_of_another_binary_is_refused(
        self, records: dict[str, Path], standin: Path, tmp_path: Path
    ) -> None:
        """The SBOM describes the binary given or nothing: a stale record fails, named."""
        out = tmp_path / "sbom.json"
        proc = run_sbom(records["amd64"], standin / "cnibox-arm64", out)
        assert proc.returncode == 1
        assert "describes another build" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not out.exists()

    def test_real_build(self, tmp_path: Path) -> None:
        """The record `make build` wrote for dist/cnibox, and its SBOM (tests/support/sbom.py:
        every shared library with its Debian version, PyPI extensions with their
        distribution's, exactly the declared Python distributions compiled in)."""
        check_real_sbom(artifact_path(), "amd64", tmp_path)


@pytest.fixture(scope="module")
def releases(
    standin: Path, records: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> list[Path]:
    """The release of both architectures assembled twice from the same stand-in builds."""
    out = tmp_path_factory.mktemp("releases")
    dirs = []
    for name in ("first", "second"):
        target = out / name
        argv = [sys.executable, str(RELEASE), "--zipapp", str(standin / "cnibox.pyz")]
        for arch in ARCHES:
            argv += ["--binary", f"{arch}={standin / f'cnibox-{arch}'}"]
            argv += ["--record", f"{arch}={records[arch]}"]
        proc = run([*argv, "--helm", pinned_helm(), "--out", str(target)])
        assert proc.returncode == 0, proc.stderr
        dirs.append(target)
    return dirs


def release_names() -> set[str]:
    v = __version__
    per_arch = {
        name
        for arch in ARCHES
        for name in (
            f"cnibox-{v}-linux-{arch}",
            f"cnibox-{v}-linux-{arch}.cdx.json",
            f"cnibox-talos-extension-{v}-linux-{arch}.rootfs.tar",
        )
    }
    return per_arch | {
        f"cnibox-{v}.pyz",
        f"cnibox-installer-{v}.oci.tar",
        f"cnibox-talos-extension-{v}.oci.tar",
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
    @pytest.mark.parametrize("arch", ARCHES)
    def test_skopeo_shows_the_labels(self, releases: list[Path], image: str, arch: str) -> None:
        """source, revision, version, licenses, created (from SOURCE_DATE_EPOCH), on each
        platform's image of the index."""
        skopeo = require_tool("skopeo")
        archive = releases[0] / f"{image}-{__version__}.oci.tar"
        proc = subprocess.run(
            [skopeo, "inspect", f"oci-archive:{archive}:{__version__}-{arch}"],
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
        assert inspected["Architecture"] == arch

    @pytest.mark.parametrize("image", ["cnibox-installer", "cnibox-talos-extension"])
    def test_each_platform_has_its_sbom_attached(self, releases: list[Path], image: str) -> None:
        """The archive's index.json: the multi-arch index (tagged V), each platform's image
        (V-ARCH), and per platform an OCI artifact whose subject is that image and whose
        layer is that architecture's SBOM, byte for byte the release's file."""
        release = releases[0]
        skopeo = require_tool("skopeo")
        archive = release / f"{image}-{__version__}.oci.tar"
        raw = subprocess.run(
            [skopeo, "inspect", "--raw", f"oci-archive:{archive}:{__version__}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        platforms = {
            m["platform"]["architecture"]: m["digest"] for m in json.loads(raw)["manifests"]
        }
        assert set(platforms) == set(ARCHES)
        with tarfile.open(archive) as tar:

            def blob(digest: str) -> bytes:
                member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
                assert member is not None
                return member.read()

            index_file = tar.extractfile("index.json")
            assert index_file is not None
            entries = json.load(index_file)["manifests"]
            artifacts = [
                e for e in entries if e.get("artifactType") == "application/vnd.cyclonedx+json"
            ]
            assert len(entries) == 1 + len(ARCHES) + len(artifacts)
            attached = {}
            for artifact in artifacts:
                manifest = json.loads(blob(artifact["digest"]))
                (layer,) = manifest["layers"]
                attached[manifest["subject"]["digest"]] = (layer, blob(layer["digest"]))
        for arch, digest in platforms.items():
            layer, sbom = attached[digest]
            name = f"cnibox-{__version__}-linux-{arch}.cdx.json"
            assert layer["annotations"]["org.opencontainers.image.title"] == name
            assert sbom == (release / name).read_bytes()
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

    @pytest.mark.parametrize("arch", ARCHES)
    def test_extension_rootfs_is_the_extension_layer(self, releases: list[Path], arch: str) -> None:
        """Each rootfs tar (imager's tarballPath input) holds manifest.yaml and rootfs/ only,
        with that architecture's binary."""
        release = releases[0]
        name = f"cnibox-talos-extension-{__version__}-linux-{arch}.rootfs.tar"
        with tarfile.open(release / name) as tar:
            tops = {m.name.split("/", 1)[0] for m in tar.getmembers()}
            binary = tar.extractfile("rootfs/usr/local/lib/cnibox/cnibox")
            assert binary is not None
            content = binary.read()
        assert tops == {"manifest.yaml", "rootfs"}
        assert content == (release / f"cnibox-{__version__}-linux-{arch}").read_bytes()


def test_zipapp_writer_is_reproducible(tmp_path: Path) -> None:
    """build/binary.py's zipapp: the same tree twice, with other mtimes, gives the same bytes."""
    module = load_script("build/binary.py")
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
