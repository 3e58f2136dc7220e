"""The lazy applet registry: its name table matches every SPEC, and running one applet does
not import the others (start-up time of `linkerd-cni`, bench/README "Benchmark")."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multicall import applets
from tests.conftest import REPO

APPLET_MODULES = {
    "netns-exec": "netns_exec",
    "install-cni": "install_cni",
    "linkerd-cni": "linkerd_cni",
    "iptables-verify": "iptables_verify",
    "linkerd-cni-repair-controller": "linkerd_cni_repair_controller",
}


def test_loader_names_are_the_spec_names() -> None:
    """Each LOADERS entry lists exactly the names its applet's SPEC answers to."""
    for names, load in applets.LOADERS:
        assert load().names == names


def test_find_applet_by_every_name() -> None:
    """Every name (aliases too) finds the applet whose SPEC has it; others find nothing."""
    for spec in applets.REGISTRY:
        for name in spec.names:
            assert applets.find_applet(name) is spec
    assert applets.find_applet("no-such-applet") is None


def test_registry_is_a_sequence_of_specs() -> None:
    """REGISTRY indexes, slices and iterates like the tuple it used to be."""
    specs = list(applets.REGISTRY)
    assert len(applets.REGISTRY) == len(specs) == len(applets.LOADERS)
    assert applets.REGISTRY[-1] is specs[-1]
    assert list(applets.REGISTRY[1:3]) == specs[1:3]


@pytest.mark.parametrize("name", sorted(APPLET_MODULES))
def test_running_one_applet_imports_no_other(name: str) -> None:
    """Dispatching to an applet (--help) imports its module and no other applet's."""
    code = (
        "import sys, io\n"
        "from multicall import dispatch\n"
        f"dispatch.run_multiplexer([{name!r}, '--help'], {{}},"
        " (io.BytesIO(), io.BytesIO(), io.BytesIO()))\n"
        "print(' '.join(m for m in sys.modules if m.startswith('multicall.applets.')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert proc.stdout.split() == [f"multicall.applets.{APPLET_MODULES[name]}"], proc.stderr


def test_modules_table_covers_the_registry() -> None:
    """This test's module table names every registered applet (keeps the check above whole)."""
    assert sorted(APPLET_MODULES) == sorted(spec.name for spec in applets.REGISTRY)
