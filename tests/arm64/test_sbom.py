"""The SBOM of dist/cnibox-arm64, from the record its `pack` wrote (build/out/bundled-arm64.json):
the x86_64 suite's real-build checks (tests/support/sbom.py), plus what only the cross build
has: every library and extension module from the toolchain root's arm64 Debian packages, the
standard library's extension modules named by libpython3.11-*:arm64, PyPI's aarch64
extensions by their distribution, and Debian's CPython (no `cpython` component: the
interpreter is libpython3.11-dev:arm64's static library)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.arm64.artifact import arm64_artifact
from tests.support.sbom import arch_of, check_real_sbom, owners

pytestmark = pytest.mark.binary


def test_sbom_of_the_arm64_build(tmp_path: Path) -> None:
    document = check_real_sbom(arm64_artifact(), "arm64", tmp_path)
    files = owners(document)
    for path, component in files.items():
        if component["purl"].startswith("pkg:deb/") and ".so" in path:
            assert arch_of(component) == "arm64", path
    # Debian splits the standard library's extension modules between -minimal and -stdlib.
    assert files["dist/_ssl.so"]["name"] in ("libpython3.11-minimal", "libpython3.11-stdlib")
    assert files["dist/yaml/_yaml.so"]["purl"] == "pkg:pypi/pyyaml@6.0.4"
    wrappers = [p for p in files if "libxtwrapper" in p]
    assert len(wrappers) == 2
    assert {files[p]["purl"] for p in wrappers} == {"pkg:pypi/python-iptables@1.2.0"}
    names = {c["name"] for c in document["components"]}
    assert "cpython" not in names
    linked = {
        prop["value"].split(" <- ")[0]: component["name"]
        for component in document["components"]
        for prop in component.get("properties", [])
        if prop["name"] == "cnibox:linked"
    }
    assert linked == {"dist/cnibox.bin": "libpython3.11-dev", "launcher": "musl-dev"}
