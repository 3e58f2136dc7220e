"""What one installer run wrote: recognising its own inotify events, and what undo restores.

`State` is the in-memory record; the undo journal (core/installer/journal.py, the format)
keeps the same on disk, so a run killed before its undo leaves the next run (or
`--uninstall`) everything it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multicall.core.installer import journal


def sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@dataclass(slots=True)
class State:
    """What this run (and, through the journal, an earlier killed run) changed, for
    recognising its own events and for undo."""

    records: dict[str, journal.Record] = field(default_factory=dict)  # config path -> record
    copied: dict[str, str] = field(default_factory=dict)  # copied binary -> sha256
    kubeconfig: str = ""

    def ours(self, path: str, current: bytes | None) -> bool:
        """Whether `path` holds (None: lacks) exactly what the installer left there."""
        record = self.records.get(path)
        digest = None if current is None else sha256(current)
        return record is not None and record.holds(current, digest)

    def change(
        self, path: str, current: bytes | None, original: bytes | None, mode: int, written: str
    ) -> journal.Record:
        """The record for changing `path` from `current` to bytes hashing to `written` ("":
        removing it). The name's original stays what it held before the installer first
        changed it while the installer's own bytes are still there; once somebody else
        wrote it (`current` is theirs), theirs is the original to restore."""
        record = self.records.get(path)
        if record is None or not self.ours(path, current):
            record = journal.Record(path, original, mode, written)
        else:
            record = journal.Record(path, record.original, record.mode, written)
        self.records[path] = record
        return record

    def as_journal(self) -> journal.Journal:
        return journal.Journal(tuple(self.copied.items()), self.kubeconfig)

    def resume(self, record: journal.Journal) -> None:
        for entry in record.records:
            self.records.setdefault(entry.path, entry)
        for path, digest in record.copied:
            self.copied.setdefault(path, digest)
        self.kubeconfig = self.kubeconfig or record.kubeconfig
