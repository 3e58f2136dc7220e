"""The applet table: one row per applet module, its names, and lazy loading (running one
applet imports no other: start-up time of `linkerd-cni`, docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multicall import applets
from multicall.applet import Applet
from tests.support import REPO

APPLET_DIR = REPO / "multicall" / "applets"
EVERY_ROW = (*applets.APPLETS, *applets.HIDDEN)


def test_every_applet_module_has_one_row() -> None:
    """Each module in multicall/applets/ is loaded by exactly one row, named after it."""
    modules = {p.stem for p in APPLET_DIR.glob("*.py") if p.stem != "__init__"}
    loaded = [applet.load().__name__ for applet in EVERY_ROW]
    assert sorted(loaded) == sorted(f"multicall.applets.{m}" for m in modules)
    for applet in EVERY_ROW:
        assert applet.load().__name__.endswith(applet.name.replace("-", "_")), applet.name


def test_find_applet_by_every_name() -> None:
    """Every name (aliases too) finds its row, a hidden one's too; others find nothing."""
    for applet in EVERY_ROW:
        for name in applet.names:
            assert applets.find_applet(name) is applet
    assert applets.find_applet("no-such-applet") is None


def test_names_are_unique_and_listed() -> None:
    names = [n for applet in applets.APPLETS for n in applet.names]
    assert len(names) == len(set(names))
    assert applets.all_names() == sorted(names)


def test_hidden_rows_are_not_listed() -> None:
    """A hidden row (the built binary's test probes) is in no list: --help, --list,
    --install's links and the images' links all read APPLETS and all_names() alone."""
    hidden = {n for applet in applets.HIDDEN for n in applet.names}
    assert hidden == {"selftest"}
    assert not hidden & set(applets.all_names())
    assert not hidden & {n for applet in applets.APPLETS for n in applet.names}


@pytest.mark.parametrize("applet", EVERY_ROW, ids=lambda a: a.name)
def test_usage_line_names_the_applet(applet: Applet) -> None:
    """Each applet's help starts with `usage: NAME` (what help_text renames)."""
    doc = applet.load().__doc__ or ""
    assert doc.startswith(f"usage: {applet.name} "), applet.name


@pytest.mark.parametrize("name", [a.name for a in applets.APPLETS])
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
    assert proc.stdout.split() == [f"multicall.applets.{name.replace('-', '_')}"], proc.stderr


def test_cnibox_help_and_list_import_no_applet() -> None:
    """`cnibox --help` and `--list` read the table alone."""
    code = (
        "import sys, io\n"
        "from multicall import dispatch\n"
        "for option in ('--help', '--list'):\n"
        "    dispatch.run_multiplexer([option], {}, (io.BytesIO(), io.BytesIO(), io.BytesIO()))\n"
        "print(' '.join(m for m in sys.modules if m.startswith('multicall.applets.')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert proc.stdout.split() == [], proc.stderr
