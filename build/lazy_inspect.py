"""Nuitka user plugin: the compiled program imports `inspect` when it first needs it, not at start.

Loaded with `--user-plugin=build/lazy_inspect.py` (always enabled). Why (docs/binary.md,
"Lazy inspect"): Nuitka's runtime calls `patchInspectModule()` in `main()` before any of our
code runs; that imports `inspect` (with `ast`, `dis`, `tokenize`, `linecache`, `token`,
`opcode`) only to replace a few of its functions with versions that understand compiled
generators and coroutines. That is ~5-10 ms of every `linkerd-cni` start, for functions cnibox
never calls (it has no generator-state or coroutine introspection). Nuitka's own source says
"TODO: Change this into an import hook that is executed after it is imported"; this plugin is
that hook, for Nuitka 4.3.3 only:

1. C side: the copy of `MainProgram.c` Nuitka puts into its build directory (the one it
   compiles; never the installed file, which the copy symlinks to) stores the patch as a
   callable `sys._cnibox_patch_inspect` instead of calling it. `patchInspectModule` itself is
   unchanged, so once it runs, `inspect` and `types` are exactly as stock Nuitka leaves them.
2. Python side: `inspect`'s post-load code (Nuitka runs it right after the module body, before
   the importer gets the module) pops and calls that function. The patch therefore runs exactly
   once, before any code can use `inspect`. Left behind: only `types.coroutine` and
   `types._GeneratorWrapper`, which the same patch also replaces, keep their stock versions
   until `inspect` is imported (cnibox has no coroutines; asyncio imports `inspect` itself).
3. `dataclasses` imports `inspect` at its top only for `inspect.signature(cls)`, which it calls
   when a dataclass has no docstring (to write one): the compiled `dataclasses` imports it
   there instead. Same result, same exceptions handled.

Each edit is an exact text replacement on a pinned Nuitka version and the build's CPython 3.11
`dataclasses`: any other version or text fails the build with a message saying what to redo,
never a silently unpatched (slower) or half-patched binary.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from nuitka.build import SconsInterface
from nuitka.plugins.PluginBase import NuitkaPluginBase
from nuitka.Version import getNuitkaVersion

PINNED_NUITKA = "4.3.3"
HOOK = "_cnibox_patch_inspect"

# (what must occur exactly once, what replaces it) in MainProgram.c.
MAIN_PROGRAM_EDITS = (
    (
        '#include "nuitka/prelude.h"\n',
        '#include "nuitka/prelude.h"\n'
        "\n"
        "/* cnibox (build/lazy_inspect.py): inspect is patched when first imported. */\n"
        "static PyObject *cniboxPatchInspect(PyObject *self, PyObject *unused) {\n"
        "    patchInspectModule(PyThreadState_Get());\n"
        "    Py_RETURN_NONE;\n"
        "}\n"
        "static PyMethodDef cniboxPatchInspectDef = {\n"
        f'    "{HOOK}", cniboxPatchInspect, METH_NOARGS, NULL}};\n',
    ),
    (
        '    NUITKA_PRINT_TRACE("main(): Calling patchInspectModule().");\n'
        "    patchInspectModule(tstate);\n",
        '    NUITKA_PRINT_TRACE("main(): Deferring patchInspectModule() to inspect\'s import.");\n'
        f'    if (PySys_SetObject("{HOOK}",\n'
        "                        PyCFunction_New(&cniboxPatchInspectDef, NULL)) != 0) {\n"
        "        PyErr_PrintEx(0);\n"
        "        Py_Exit(1);\n"
        "    }\n",
    ),
)

# The same for the build's CPython 3.11 Lib/dataclasses.py; `inspect` is used only in the
# branch this comment opens (both 3.11.2's form, Debian's and the arm64 root's, and 3.11.7's
# try/except around the same call), so the import goes there.
DATACLASSES_EDITS = (
    ("import types\nimport inspect\nimport keyword\n", "import types\nimport keyword\n"),
    (
        "        # Create a class doc-string.\n",
        "        # Create a class doc-string.\n"
        "        import inspect  # cnibox: imported when needed (build/lazy_inspect.py)\n",
    ),
)

INSPECT_POST_LOAD = f"""\
import sys
# cnibox (build/lazy_inspect.py): Nuitka's patch of inspect, deferred from start-up to now.
sys.__dict__.pop("{HOOK}")()
"""


class PatchFailed(Exception):
    """The pinned text was not found: the build must stop."""


def replace_exactly(text: str, edits: tuple[tuple[str, str], ...], what: str) -> str:
    for old, new in edits:
        count = text.count(old)
        if count != 1:
            raise PatchFailed(
                f"build/lazy_inspect.py: {what}: expected the text {old!r} exactly once, found it "
                f"{count} times; this plugin is written for Nuitka {PINNED_NUITKA} and CPython "
                "3.11's dataclasses: review the edits against the new sources (or drop the "
                "plugin and its --user-plugin line in build/binary.py)"
            )
        text = text.replace(old, new)
    return text


def edit_dataclasses(text: str, what: str) -> str:
    """dataclasses.py with `inspect` imported in the one branch that uses it."""
    if text.count("inspect.") != 1:
        raise PatchFailed(
            f"build/lazy_inspect.py: {what}: dataclasses uses inspect in more than the one "
            "place this plugin moves its import to: review DATACLASSES_EDITS"
        )
    return replace_exactly(text, DATACLASSES_EDITS, what)


def _patched_provider(
    original: Callable[[str, list[str]], None],
) -> Callable[[str, list[str]], None]:
    def provide(source_dir: str, filenames: list[str]) -> None:
        original(source_dir, filenames)
        if "MainProgram.c" not in filenames:
            return
        path = os.path.join(source_dir, "static_src", "MainProgram.c")
        with open(path, encoding="utf-8") as f:  # through Nuitka's symlink: read only
            text = f.read()
        text = replace_exactly(text, MAIN_PROGRAM_EDITS, "MainProgram.c")
        os.unlink(path)  # the symlink to the installed file, which stays untouched
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    return provide


class CniboxLazyInspect(NuitkaPluginBase):
    plugin_name = "cnibox-lazy-inspect"
    plugin_desc = "Import inspect (and patch it for compiled code) when first imported."

    @staticmethod
    def isAlwaysEnabled() -> bool:
        return True

    def __init__(self) -> None:
        if getNuitkaVersion() != PINNED_NUITKA:
            raise PatchFailed(
                f"build/lazy_inspect.py is written for Nuitka {PINNED_NUITKA}, not "
                f"{getNuitkaVersion()}: review its C edit against the new MainProgram.c"
            )
        # Nuitka has no hook between copying its static C sources into the build directory
        # and compiling them; this module function is where the copy happens (pinned version).
        provider = SconsInterface._provideStaticSourceFiles
        if not getattr(provider, "cnibox_patched", False):
            patched = _patched_provider(provider)
            patched.cnibox_patched = True  # type: ignore[attr-defined]
            SconsInterface._provideStaticSourceFiles = patched

    def onModuleSourceCode(self, module_name: Any, source_filename: str, source_code: str) -> str:
        if str(module_name) != "dataclasses":
            return source_code
        return edit_dataclasses(source_code, source_filename)

    def createPostModuleLoadCode(self, module: Any) -> tuple[str, str] | None:
        if module.getFullName() != "inspect":
            return None
        return INSPECT_POST_LOAD, "Apply Nuitka's inspect patch now that inspect is imported."
