"""The build-time dataclass method cache (multicall.dataclass_cache): the binary runs the very
code the interpreter would have compiled, every method on the path comes from the cache, and a
bad cache changes nothing."""

from __future__ import annotations

import marshal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

# Prints, for every dataclass in every cnibox module, what makes up the code of its generated
# methods; with a cache path, installs it first and reports the texts it had to compile.
DUMP = """
import dataclasses, marshal, sys
from multicall import dataclass_cache as dc
seen = {}
if len(sys.argv) > 1:
    with open(sys.argv[1], "rb") as f:
        assert dc._patch(dc._make_create_fn(marshal.load(f), seen))
import importlib
out = {}
for name in dc.cnibox_modules():
    module = importlib.import_module(name)
    for value in vars(module).values():
        if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == name:
            for method in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__"):
                fn = value.__dict__.get(method)
                code = getattr(fn, "__code__", None)
                if code is not None:
                    out[f"{name}.{value.__qualname__}.{method}"] = (
                        code.co_code.hex(), repr(code.co_consts), code.co_names,
                        code.co_varnames, code.co_freevars, code.co_argcount,
                        code.co_kwonlyargcount, code.co_flags, code.co_qualname,
                        code.co_linetable.hex())
print(len(seen))
print(repr(sorted(out.items())))
"""


def python(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=120
    )
    return proc.stdout


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dcc") / "dataclasses.marshal"
    python("-m", "multicall.dataclass_cache", str(path))
    return path


def test_cached_code_is_what_the_interpreter_compiles(cache: Path) -> None:
    """Every generated method's code is byte-identical with and without the cache, and no
    method on any cnibox module had to be compiled once the cache is installed."""
    plain = python("-c", DUMP).splitlines()
    cached = python("-c", DUMP, str(cache)).splitlines()
    assert cached[0] == "0"
    assert cached[1] == plain[1]
    assert plain[1].count("__init__") >= 30  # the dump did see the project's dataclasses


def test_install_uses_the_cache_and_compiles_new_texts(cache: Path) -> None:
    """After install, a class whose methods are not cached still works like a dataclass."""
    script = f"""
from multicall import dataclass_cache
assert dataclass_cache.install({str(cache)!r})
import dataclasses
@dataclasses.dataclass(frozen=True, slots=True)
class Fresh:
    never_seen_before_xyz: int
    other: str = "d"
a, b = Fresh(1), Fresh(1, "d")
assert a == b and hash(a) == hash(b) and repr(a) == "Fresh(never_seen_before_xyz=1, other='d')"
try:
    a.other = "x"
except dataclasses.FrozenInstanceError:
    print("frozen")
"""
    assert python("-c", script).strip() == "frozen"


@pytest.mark.parametrize(
    "content",
    [
        None,
        b"",
        b"not marshal",
        b"\xe9\x00\x00\x00\x00",
        marshal.dumps(["a list"]),
        marshal.dumps({"text": compile("1", "<string>", "exec")}),  # not the per-entry format
    ],
)
def test_unusable_cache_changes_nothing(tmp_path: Path, content: bytes | None) -> None:
    """A missing, empty, corrupt or non-dict file: install says False, dataclasses untouched."""
    path = tmp_path / "dataclasses.marshal"
    if content is not None:
        path.write_bytes(content)
    script = f"""
import dataclasses
before = dataclasses._create_fn
from multicall import dataclass_cache
print(dataclass_cache.install({str(path)!r}), dataclasses._create_fn is before)
"""
    assert python("-c", script).split() == ["False", "True"]


def test_the_binary_main_installs_the_cache_first() -> None:
    """The Nuitka main file installs the cache before importing the dispatcher."""
    text = (REPO / "build" / "cnibox_main.py").read_text()
    assert text.index("dataclass_cache.install(") < text.index("from multicall.dispatch")


def test_a_corrupt_entry_is_compiled_instead(tmp_path: Path) -> None:
    """An entry whose bytes are not a code object is compiled from the text as usual."""
    path = tmp_path / "dataclasses.marshal"
    code = """
import dataclasses, marshal, sys
from multicall import dataclass_cache as dc
seen = {}
assert dc._patch(dc._make_create_fn({}, seen))
@dataclasses.dataclass(frozen=True)
class P:
    x: int
bad = {text: b"garbage" for text in seen}
open(sys.argv[1], "wb").write(marshal.dumps(bad))
"""
    python("-c", code, str(path))
    check = f"""
from multicall import dataclass_cache
assert dataclass_cache.install({str(path)!r})
import dataclasses
@dataclasses.dataclass(frozen=True)
class P:
    x: int
print(P(1) == P(1), repr(P(2)))
"""
    assert python("-c", check).split() == ["True", "P(x=2)"]
