"""What one installer run wrote: recognising its own inotify events, and what undo restores.

`State` is the in-memory record; `as_journal`/`resume` convert it to and from the undo
journal (core/installer/journal.py, the format), so a run killed before its undo leaves the
next run (or `--uninstall`) everything it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multicall.core.installer import journal


def sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Original:
    """What a patched file held before: restored on undo if nobody touched our version."""

    path: str
    data: bytes
    mode: int


@dataclass(slots=True)
class State:
    """What this run (and, through the journal, an earlier killed run) wrote, for recognising
    its own events and for undo."""

    written: dict[str, str] = field(default_factory=dict)  # path -> sha256 of our bytes
    originals: dict[str, Original] = field(default_factory=dict)  # patched path -> before
    copied: dict[str, str] = field(default_factory=dict)  # copied binary -> sha256
    kubeconfig: str = ""

    def as_journal(self) -> journal.Journal:
        patched = tuple(
            journal.Patched(target, o.path, o.data, o.mode, self.written.get(target, ""))
            for target, o in self.originals.items()
        )
        return journal.Journal(patched, tuple(self.copied.items()), self.kubeconfig)

    def resume(self, record: journal.Journal) -> None:
        for p in record.patched:
            self.originals.setdefault(p.target, Original(p.original_path, p.original, p.mode))
            self.written.setdefault(p.target, p.written)
        for path, digest in record.copied:
            self.copied.setdefault(path, digest)
        self.kubeconfig = self.kubeconfig or record.kubeconfig
