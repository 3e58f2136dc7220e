"""The import graph of multicall/ keeps its layers (docs/architecture.md, "Layers"):

    0  multicall (the version), multicall.errors, multicall.dataclass_cache
    1  multicall.core.*      pure: values in, values out
    2  multicall.effects.*   adapters over the kernel, the filesystem and the network
    3  multicall.plugin.*    linkerd-cni's commands behind their ports (the ADD seam)
    4  multicall.agent.*, multicall.repair.*, multicall.installer.*, multicall.gate.*
                             the services, one package each
    5  multicall.applet, multicall.applets.*
    6  multicall.dispatch, multicall.__main__

A module imports its own layer or lower ones, never a higher one; there are no import cycles
(imports inside functions count, `if TYPE_CHECKING:` ones do not); core imports no os-level
module; core.go (Go's standard library) imports no other core package; no applet module
imports another (only the running applet is loaded); a service package imports no other
service package (what two services share lives in plugin, effects or core).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

PACKAGE = REPO / "multicall"
BANNED_IN_CORE = {
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
LAYERS = (
    ("multicall", "multicall.errors", "multicall.dataclass_cache"),
    ("multicall.core",),
    ("multicall.effects",),
    ("multicall.plugin",),
    SERVICES := ("multicall.agent", "multicall.repair", "multicall.installer", "multicall.gate"),
    ("multicall.applet", "multicall.applets"),
    ("multicall.dispatch", "multicall.__main__"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(name: str) -> int:
    """The layer of a module: the longest matching prefix wins (multicall.core before multicall)."""
    best, found = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found >= 0, name
    return found


def _runtime_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node, minus the bodies of `if TYPE_CHECKING:` blocks."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(path: Path, *, runtime_only: bool = True) -> set[str]:
    """Modules `path` imports; `from X import Y` counts X.Y when that is a module."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = _runtime_nodes(tree) if runtime_only else ast.walk(tree)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in MODULES else node.module)
    return names


def internal(path: Path, **kw: bool) -> set[str]:
    return {name for name in imports(path, **kw) if name in MODULES}


@pytest.mark.parametrize("name", sorted(MODULES), ids=str)
def test_no_import_from_a_higher_layer(name: str) -> None:
    own = layer(name)
    higher = sorted(m for m in internal(MODULES[name], runtime_only=False) if layer(m) > own)
    assert higher == [], f"{name} (layer {own}) imports {higher}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if layer(n) == 1), ids=str)
def test_core_module_is_pure(name: str) -> None:
    """No core module imports os, subprocess, socket, ctypes or the effects package."""
    bad = {
        imported
        for imported in imports(MODULES[name], runtime_only=False)
        if any(imported == b or imported.startswith(b + ".") for b in BANNED_IN_CORE)
    }
    assert not bad, f"{name} imports {sorted(bad)}"


def test_go_is_the_bottom_of_core() -> None:
    """core.go reproduces Go's standard library: it depends on no other core package."""
    for name, path in MODULES.items():
        if name.startswith("multicall.core.go"):
            others = {
                m
                for m in internal(path, runtime_only=False)
                if m.startswith("multicall.core.") and not m.startswith("multicall.core.go")
            }
            assert others == set(), name


def test_no_applet_imports_another() -> None:
    applet_modules = {n for n in MODULES if n.startswith("multicall.applets.")}
    for name in applet_modules:
        assert internal(MODULES[name]) & applet_modules == set(), name


def _service(name: str) -> str | None:
    return next((s for s in SERVICES if name == s or name.startswith(s + ".")), None)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _service(n)), ids=str)
def test_no_service_imports_another(name: str) -> None:
    own = _service(name)
    others = sorted(
        m for m in internal(MODULES[name], runtime_only=False) if _service(m) not in (None, own)
    )
    assert others == [], f"{name} imports {others}: services share only plugin, effects, core"


def test_no_import_cycles() -> None:
    graph = {name: internal(path) - {name} for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_the_graph_is_read() -> None:
    """The checks above see real edges (a parser that found nothing would pass them all)."""
    assert "multicall.core.firewall.model" in internal(
        MODULES["multicall.core.firewall.proxy_init"]
    )
    assert "multicall.applets.netns_exec" in internal(MODULES["multicall.applets"])
    assert layer("multicall.core.firewall.nft.rule") == 1
    assert layer("multicall.applets.linkerd_cni") == 5
    assert layer("multicall.agent") == 4


def test_every_package_is_a_regular_package() -> None:
    """zipimport (the zipapp) cannot import namespace packages: every folder needs __init__.py."""
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists())
    assert missing == []
