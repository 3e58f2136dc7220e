"""Dataclass methods compiled at build time, so that a start-up does not compile them.

Python 3.11 builds each generated dataclass method (__init__, __eq__, __repr__, __hash__,
__setattr__, __delattr__) from source text with exec(): about 1 ms per class, 36 classes on a
`linkerd-cni` ADD, the largest single start-up cost left in the binary (docs/benchmarks.md).
`record` imports every cnibox module and keeps the code object of each text; the build
stores them next to the binary (same interpreter, so the same marshal format);
`install` makes dataclasses run the stored code for an identical text and compile any other
text as before, so a missing, stale or foreign cache only costs the time it would have saved.
Each code object is stored as its own marshal string and loaded when its class is made:
loading all of them up front cost `cnibox --version` 10 ms.

`_create_fn` below is CPython 3.11's, with the compile step looked up in the cache: it
replaces dataclasses' module global, which compiled code (Nuitka) looks up at each call.
"""

from __future__ import annotations

import marshal
import sys
from collections.abc import Callable, Iterable, Mapping
from types import CodeType
from typing import Any

SUPPORTED = (3, 11)


def _make_create_fn(
    codes: Mapping[str, bytes], seen: dict[str, bytes] | None
) -> Callable[..., Any]:
    import dataclasses

    missing = dataclasses.MISSING

    def _create_fn(
        name: str,
        args: Iterable[str],
        body: Iterable[str],
        *,
        globals: dict[str, Any] | None = None,
        locals: dict[str, Any] | None = None,
        return_type: Any = missing,
    ) -> Any:
        if locals is None:
            locals = {}
        return_annotation = ""
        if return_type is not missing:
            locals["_return_type"] = return_type
            return_annotation = "->_return_type"
        joined = ",".join(args)
        lines = "\n".join(f"  {b}" for b in body)
        txt = f" def {name}({joined}){return_annotation}:\n{lines}"
        local_vars = ", ".join(locals.keys())
        txt = f"def __create_fn__({local_vars}):\n{txt}\n return {name}"
        code = _load(codes.get(txt))
        if code is None:
            # dont_inherit: this module's `from __future__ import annotations` must not leak in
            code = compile(txt, "<string>", "exec", dont_inherit=True)
            if seen is not None:
                seen[txt] = marshal.dumps(code)
        ns: dict[str, Any] = {}
        exec(code, globals, ns)  # noqa: S102 - dataclasses' generated method, as dataclasses does
        return ns["__create_fn__"](**locals)

    return _create_fn


def _load(stored: bytes | None) -> CodeType | None:
    if stored is None:
        return None
    try:
        code = marshal.loads(stored)  # noqa: S302 - written by our build, beside our code
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _patch(create_fn: Callable[..., Any]) -> bool:
    import dataclasses

    if sys.version_info[:2] != SUPPORTED or not hasattr(dataclasses, "_create_fn"):
        return False
    dataclasses._create_fn = create_fn
    return True


def install(path: str) -> bool:
    """Use the code objects stored at `path`; False (and nothing changed) if unusable."""
    try:
        with open(path, "rb") as f:
            # One read: marshal.load on the file reads it in small pieces (~0.6 ms more).
            codes = marshal.loads(f.read())  # noqa: S302 - written by our build, beside our code
    except (OSError, EOFError, ValueError, TypeError):
        return False
    if not isinstance(codes, dict) or not all(isinstance(v, bytes) for v in codes.values()):
        return False
    return _patch(_make_create_fn(codes, None))


def record(modules: Iterable[str] | None = None) -> bytes:
    """Import `modules` (every cnibox module) and return each dataclass method code object
    they compiled; call it before anything else made a dataclass."""
    import importlib

    seen: dict[str, bytes] = {}
    if not _patch(_make_create_fn({}, seen)):
        raise SystemExit(f"dataclass_cache: Python {sys.version_info[:2]} is not {SUPPORTED}")
    for name in cnibox_modules() if modules is None else modules:
        importlib.import_module(name)
    return marshal.dumps(seen)


def cnibox_modules() -> list[str]:
    """Every module of the multicall package (what the binary can import)."""
    import pkgutil

    import multicall

    found = ["multicall"]
    for info in pkgutil.walk_packages(multicall.__path__, "multicall."):
        if info.name != "multicall.__main__":  # importing it runs the dispatcher
            found.append(info.name)
    return sorted(found)


def _main() -> None:
    """python -m multicall.dataclass_cache OUT: what the build stores next to the binary."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m multicall.dataclass_cache",
        description="Record the dataclass methods of every multicall module into OUT.",
    )
    parser.add_argument("out", metavar="OUT", help="the marshal file to write")
    target = parser.parse_args().out
    data = record()
    with open(target, "wb") as out:
        out.write(data)
    print(f"dataclass_cache: {len(data)} bytes -> {target}")


if __name__ == "__main__":
    _main()
