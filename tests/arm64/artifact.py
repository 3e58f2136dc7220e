"""The arm64 single file under test (`CNIBOX_ARM64=dist/cnibox-arm64`) and its ELF facts.

Like the x86_64 artifact suites, these run only for a built file: without CNIBOX_ARM64 they
skip, even under CI, because `make test` runs them in its `test-arm64` step, which sets it.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.artifact import artifact_path

EM_AARCH64 = 183
PT_INTERP = 3
PT_DYNAMIC = 2


def arm64_artifact() -> Path:
    return artifact_path("CNIBOX_ARM64", "test-arm64")


def elf_facts(path: Path) -> tuple[int, int, set[int]]:
    """(ELF class, e_machine, program header types) of a little-endian ELF file."""
    with open(path, "rb") as f:
        head = f.read(64)
        assert head[:4] == b"\x7fELF", f"{path} is not an ELF file"
        assert head[5] == 1, f"{path} is not little-endian"
        machine = int.from_bytes(head[18:20], "little")
        phoff = int.from_bytes(head[32:40], "little")
        size, count = int.from_bytes(head[54:56], "little"), int.from_bytes(head[56:58], "little")
        f.seek(phoff)
        table = f.read(size * count)
    types = {int.from_bytes(table[i * size : i * size + 4], "little") for i in range(count)}
    return head[4], machine, types
