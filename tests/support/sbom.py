"""The build's attribution (build/bundled.py) and the SBOM made from it (packaging/sbom.py), for
the release tests and the checks of a real build's SBOM (tests/tools/test_release.py for
amd64, tests/arm64/test_sbom.py for arm64)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support.paths import REPO
from tests.support.scripts import load_script

SBOM = REPO / "packaging" / "sbom.py"
RECORDS = REPO / "build" / "out"
# What pyproject.toml declares as run-time dependencies: exactly what may be compiled in.
DECLARED = {
    r.split("==")[0]: r.split("==")[1]
    for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
}


def bundled_module() -> ModuleType:
    """build/bundled.py, the build's attribution."""
    return load_script("build/bundled.py")


def dpkg_version(package: str, root: Path = Path("/")) -> str:
    """The version dpkg of ROOT has installed ("libc6:arm64" or "iptables")."""
    proc = subprocess.run(
        ["dpkg-query", f"--root={root}", "-W", "-f=${Version}", package],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def owners(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """File inside the single file -> the component listing it (each file listed once)."""
    found: dict[str, dict[str, Any]] = {}
    for component in [document["metadata"]["component"], *document["components"]]:
        for prop in component.get("properties", []):
            if prop["name"] == "cnibox:file":
                path = prop["value"].split(" sha256:")[0]
                assert path not in found, f"{path} listed twice"
                found[path] = component
    return found


def modules(document: dict[str, Any]) -> dict[str, str]:
    """Python module compiled in -> the name of the component listing it."""
    found: dict[str, str] = {}
    for component in [document["metadata"]["component"], *document["components"]]:
        for prop in component.get("properties", []):
            if prop["name"] == "cnibox:python-module":
                assert prop["value"] not in found, f"{prop['value']} listed twice"
                found[prop["value"]] = component["name"]
    return found


def validate(text: str) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None


def run_sbom(record: Path, binary: Path, out: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SBOM), "--record", str(record), "--binary", str(binary)]
    return subprocess.run([*argv, "--out", str(out)], capture_output=True, text=True, check=False)


def check_real_sbom(binary: Path, arch: str, tmp: Path) -> dict[str, Any]:
    """The SBOM of a real build, from the record its `pack` wrote: schema-valid; every file
    of the record listed once; every shared library named with the Debian version its build's
    dpkg reports (a Python distribution's extension: that distribution at its pinned
    version; pyenv's CPython: its version); the Python distributions compiled in are exactly
    the declared ones; no distutils or setuptools code; NOTICE names every Debian source
    package and Python distribution. Returns the SBOM."""
    record_path = RECORDS / f"bundled-{arch}.json"
    assert record_path.is_file(), f"{record_path} missing: pack writes it (make build)"
    record = json.loads(record_path.read_text())
    proc = run_sbom(record_path, binary, tmp / "sbom.json")
    assert proc.returncode == 0, proc.stderr
    text = (tmp / "sbom.json").read_text()
    validate(text)
    document: dict[str, Any] = json.loads(text)
    files = owners(document)
    assert set(files) == {f["path"] for f in record["files"]}
    root = Path(record["dpkg_root"])
    libraries = [p for p in files if ".so" in p.rsplit("/", 1)[-1] or "/ld-linux" in p]
    assert len(libraries) > 150
    kinds: dict[str, set[str]] = {}
    for path in libraries:
        component = files[path]
        kind = component["purl"].split("/", 1)[0]
        kinds.setdefault(kind, set()).add(component["name"])
        if kind == "pkg:deb":
            qualified = f"{component['name']}:{arch_of(component)}"
            archive = property_value(component, "cnibox:debian-archive")
            if archive:  # a .deb the build unpacked (libc-bin:arm64's locale): its file name
                expected = "_".join((component["name"], component["version"].split(":")[-1]))
                assert archive.startswith(expected + "_"), path
            else:
                assert component["version"] == dpkg_version(qualified, root), path
        elif kind == "pkg:pypi":
            assert DECLARED[component["name"]] == component["version"], path
        else:
            assert component["name"] == "cpython", path
            assert component["version"] == record["components"]["cpython"]["version"]
    assert {"libc6", "libssl3", "zlib1g", "libxtables12", "iptables"} <= kinds["pkg:deb"]
    python = {c["name"] for c in document["components"] if c["purl"].startswith("pkg:pypi/")}
    assert python == {*DECLARED, "Nuitka"}
    compiled = modules(document)
    assert {"iptc.util", "yaml", "multicall.dispatch"} <= set(compiled)
    assert not [m for m in compiled if m.split(".")[0] in ("distutils", "setuptools")]
    # build/lazy_inspect.py's code run after inspect's import is cnibox's, not CPython's.
    assert compiled["inspect-postLoad"] == "cnibox"
    notice = (REPO / "NOTICE").read_text()
    for component in document["components"]:
        for prop in component.get("properties", []):
            if prop["name"] == "cnibox:debian-source-package":
                assert f"- {prop['value']}:" in notice, prop["value"]
        if component["purl"].startswith("pkg:pypi/"):
            assert component["name"] in notice, component["name"]
    return document


def arch_of(component: dict[str, Any]) -> str:
    """The Debian architecture of a pkg:deb component (its purl's `arch` qualifier)."""
    purl: str = component["purl"]
    qualifiers = dict(q.split("=") for q in purl.split("?", 1)[1].split("&"))
    return qualifiers["arch"]


def property_value(component: dict[str, Any], name: str) -> str | None:
    values = [p["value"] for p in component.get("properties", []) if p["name"] == name]
    return str(values[0]) if values else None
