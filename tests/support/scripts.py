"""The repository's scripts (build/, packaging/, bench/: directories of scripts, not packages)
imported by the tests that exercise their functions."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

from tests.support.paths import REPO


def load_script(relative: str) -> ModuleType:
    """The script at REPO/`relative` as a module, loaded once (later calls return it)."""
    name = "cnibox_script_" + re.sub(r"\W", "_", relative.removesuffix(".py"))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / relative)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while a class is made
    spec.loader.exec_module(module)
    return module
