"""No module-level mutable state in multicall/effects/ (docs/architecture.md, "Layers").

An adapter's state belongs to an object its user makes and passes (the caller's `Files`, a
`SingleUse`, the agent's warm connections): a global would be shared by every request a
process serves, and by every test. Read from the source:
1. no `global` statement anywhere in effects/;
2. a module-level name is bound to a constant (a literal, a tuple or frozenset of them, a
   type alias, another name) or to a call listed in `ALLOWED` with the reason it is not
   state; a dict, list or set bound at module level is listed there too;
3. no function assigns to, deletes from or calls a mutating method on a module-level name
   or assigns to an attribute of a module-level class (state on a class is state);
4. every `functools.cache` of effects/ is listed in `CACHES` with why it is a cache of
   something that cannot change while the process runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import REPO

EFFECTS = REPO / "multicall" / "effects"
MODULES = sorted(p for p in EFFECTS.rglob("*.py") if "__pycache__" not in p.parts)

# (module path relative to multicall/effects, name): why it is not mutable state.
ALLOWED = {
    ("ns.py", "_NS_NAMES"): "a constant table (namespace type -> name), never written",
    ("inotify.py", "_HEADER"): "struct.Struct: an immutable layout",
    ("caller.py", "OWN_FILES"): "a frozen dataclass without fields: this process's own view",
    ("firewall/legacy/__init__.py", "TABLE_NAMES"): "a constant table (family -> /proc file)",
    ("firewall/legacy/apply.py", "_ADDRESS_SETTERS"): "a constant table of setter names",
    ("firewall/engine.py", "PLAIN"): "a frozen dataclass: no caller socket, not single-use",
    ("firewall/nft.py", "PAGE"): "the page size: fixed for the process's life",
    ("admin_server.py", "REASONS"): "a constant table (HTTP status -> reason phrase)",
    ("admin_server.py", "_LIVE"): (
        "the fork hooks' registry of running admin servers: os.register_at_fork is "
        "process-wide, so what it must reach at a fork is too (weak: a stopped server leaves)"
    ),
    ("admin_server.py", "_HELD"): "the fork hooks' hand-over from before to after a fork",
    ("process_metrics.py", "START_WALL"): "when this process started: set once at import",
    ("process_metrics.py", "START_MONOTONIC"): "the same, on the monotonic clock",
}
# Names whose module-level binding ALLOWED excuses, but that the fork hooks do change.
MUTATED_ON_PURPOSE = {("admin_server.py", "_HELD"), ("admin_server.py", "_LIVE")}

# (module, function): why caching its result for the process's life is not state.
CACHES = {
    ("ns.py", "libc"): "the already-loaded libc: one per process",
    ("inotify.py", "_libc"): "the same libc with inotify's prototypes",
    ("caller.py", "_open_how"): "a ctypes structure type, made once",
    ("bundle.py", "prepare_iptc"): "python-iptables' environment, set up once (legacy rule 1)",
    ("firewall/legacy/loading.py", "iptc"): "the python-iptables module, imported once",
    ("firewall/legacy/loading.py", "_listing"): "a library directory's listing, read once",
    ("firewall/legacy/dump.py", "module_target_class"): "a class made once",
    ("firewall/legacy/dump.py", "protocol_name"): "/etc/protocols of the node image: fixed",
}
MUTATING = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "add",
            "discard", "setdefault", "appendleft", "popleft", "sort", "reverse"}  # fmt: skip


def rel(path: Path) -> str:
    return str(path.relative_to(EFFECTS))


def _constant(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant | ast.Name | ast.Attribute | ast.Subscript):
        return True  # literals, aliases of other names, type aliases (Callable[...])
    if isinstance(node, ast.Tuple):
        return all(_constant(e) for e in node.elts)
    if isinstance(node, ast.UnaryOp | ast.BinOp):
        return all(_constant(e) for e in ast.iter_child_nodes(node) if isinstance(e, ast.expr))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        # frozenset({...}): the set literal is only its argument
        args = [e for a in node.args for e in (a.elts if isinstance(a, ast.Set) else [a])]
        return node.func.id in ("frozenset", "TypeVar") and all(_constant(a) for a in args)
    return False


def _module_bindings(tree: ast.Module) -> dict[str, ast.expr | None]:
    names: dict[str, ast.expr | None] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node.value
    return names


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_no_global_statement(path: Path) -> None:
    tree = ast.parse(path.read_text())
    found = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Global)]
    assert found == [], f"{rel(path)}: `global` at lines {found}"


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_module_level_names_are_constants(path: Path) -> None:
    tree = ast.parse(path.read_text())
    bad = sorted(
        name
        for name, value in _module_bindings(tree).items()
        if value is not None and not _constant(value) and (rel(path), name) not in ALLOWED
    )
    assert bad == [], f"{rel(path)}: module-level state {bad} (pass an object instead)"


@pytest.mark.parametrize("path", MODULES, ids=rel)
def test_no_function_changes_module_state(path: Path) -> None:
    tree = ast.parse(path.read_text())
    module_names = set(_module_bindings(tree))
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    shared = (module_names | classes) - {n for m, n in MUTATED_ON_PURPOSE if m == rel(path)}
    bad: list[str] = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign | ast.Delete):
                targets = list(node.targets)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript | ast.Attribute):
                    base = target.value
                    if isinstance(base, ast.Name) and base.id in shared:
                        bad.append(f"{func.name}:{getattr(node, 'lineno', 0)} writes {base.id}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATING
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in module_names - {n for m, n in MUTATED_ON_PURPOSE}
            ):
                bad.append(f"{func.name}:{node.lineno} calls {node.func.value.id}.{node.func.attr}")
    assert bad == [], f"{rel(path)}: {bad}"


def test_every_cache_is_listed() -> None:
    found = set()
    for path in MODULES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for deco in node.decorator_list:
                    name = ast.unparse(deco)
                    if name.split("(")[0] in ("cache", "lru_cache", "functools.cache"):
                        found.add((rel(path), node.name))
    assert found == set(CACHES), "list every cache of effects/ in CACHES, with its reason"


def test_the_checks_see_state() -> None:
    """The checks fail on what they are for (a parser that found nothing would pass)."""
    tree = ast.parse("_pool = []\ndef f():\n    _pool.append(1)\n")
    assert not _constant(_module_bindings(tree)["_pool"] or ast.Constant(0))
    sample = "X = 1\nclass C:\n    n = 0\ndef f():\n    C.n = 2\n    global X\n"
    assert any(isinstance(n, ast.Global) for n in ast.walk(ast.parse(sample)))
