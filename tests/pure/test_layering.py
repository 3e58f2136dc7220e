"""multicall.core stays pure: it imports no effects (the forbidigo idea of the CNI plugins)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "multicall" / "core"
BANNED = {
    "os",
    "subprocess",
    "socket",
    "ctypes",
    "ssl",
    "http",
    "multicall.effects",
    "pyroute2",
    "iptc",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    """No core module imports os, subprocess, socket, ctypes or the effects package."""
    bad = {
        name
        for name in imported_modules(path)
        if any(name == b or name.startswith(b + ".") for b in BANNED)
    }
    assert not bad, f"{path.name} imports {sorted(bad)}"
