"""The binary imports `inspect` only when something uses it (build/lazy_inspect.py,
docs/binary.md "Lazy inspect"): the build's text edits still apply to the pinned Nuitka and
this CPython's `dataclasses`, and no cnibox dataclass makes `dataclasses` import it."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO

# The resident agent's own classes: it starts once per node, so its start-up is not the
# one-shot ADD's (and the module belongs to the agent's branch: docstrings come with it).
EXEMPT = {"multicall/agent/server.py"}


def test_every_dataclass_has_its_own_docstring() -> None:
    """`dataclasses` writes a docstring from `inspect.signature()` for a class without one,
    which imports `inspect` (~5-10 ms in the binary) and computes a signature per class."""
    missing = []
    for path in sorted((REPO / "multicall").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            decorated = isinstance(node, ast.ClassDef) and any(
                "dataclass" in ast.unparse(d) for d in node.decorator_list
            )
            if decorated and ast.get_docstring(node) is None:  # type: ignore[arg-type]
                missing.append(f"{rel}:{node.lineno} {node.name}")  # type: ignore[attr-defined]
    assert not missing, "dataclasses without a docstring:\n" + "\n".join(missing)


@pytest.fixture(scope="module")
def plugin() -> Any:
    sys.path.insert(0, str(REPO / "build"))
    try:
        with warnings.catch_warnings():  # Nuitka 4.3.3 still imports the deprecated `imp`
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module("lazy_inspect")
    finally:
        sys.path.remove(str(REPO / "build"))


def test_the_c_edit_applies_to_the_pinned_nuitka(plugin: Any) -> None:
    from nuitka.build.SconsInterface import getSconsDataPath

    source = Path(getSconsDataPath(), "static_src", "MainProgram.c").read_text(encoding="utf-8")
    patched = plugin.replace_exactly(source, plugin.MAIN_PROGRAM_EDITS, "MainProgram.c")
    assert "patchInspectModule(tstate);" not in patched
    assert patched.count(plugin.HOOK) == 2  # the callable's name, and where main() stores it


# The cross build (build/arm64_root.py) compiles Debian's python3.11 (3.11.2) dataclasses.
DEBIAN_DATACLASSES = Path("/usr/lib/python3.11/dataclasses.py")


def test_the_dataclasses_edit_applies_to_debians_python_too(plugin: Any) -> None:
    if not DEBIAN_DATACLASSES.exists():
        pytest.skip("no Debian python3.11 here")  # CI installs it (the build machine's Python)
    text = DEBIAN_DATACLASSES.read_text(encoding="utf-8")
    assert "\nimport inspect\n" not in plugin.edit_dataclasses(text, str(DEBIAN_DATACLASSES))


def test_the_dataclasses_edit_keeps_its_behaviour(
    plugin: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Path(dataclasses.__file__).read_text(encoding="utf-8")
    patched = plugin.edit_dataclasses(source, "dataclasses.py")
    assert "\nimport inspect\n" not in patched
    # The edited module makes the same classes, docstring included (inspect imported late).
    edited_file = tmp_path / "dataclasses_edited.py"
    edited_file.write_text(patched, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("dataclasses_edited", edited_file)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    spec.loader.exec_module(module)

    def point(make: Callable[..., Any]) -> Any:
        @make(frozen=True)
        class Point:
            x: int
            y: int = 0

        return Point

    edited, stock = point(module.dataclass), point(dataclasses.dataclass)
    assert edited.__doc__ == stock.__doc__
    assert edited.__doc__.startswith("Point(x: ")
    assert edited(1) == edited(1, 0)
    assert str(inspect.signature(edited)) == str(inspect.signature(stock))


def test_a_text_that_moved_fails_the_build(plugin: Any) -> None:
    with pytest.raises(plugin.PatchFailed, match="exactly once, found it 0 times"):
        plugin.replace_exactly("int main() {}\n", plugin.MAIN_PROGRAM_EDITS, "MainProgram.c")
