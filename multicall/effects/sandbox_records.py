"""The node's record of what each programmed sandbox must hold (core/keeper.py defines a
record): one small JSON file per sandbox in a directory of the node's /run (a tmpfs: the
records live exactly as long as the sandboxes they describe, across agent restarts, and
go with a reboot, as the sandboxes do).

Rules of this module:
1. The directory is private (mode 0700, owned by this user, writable by nobody else:
   `fs.private_dir`); a record is written atomically (`fs.write_atomic`), so a reader sees
   the old record or the new one, never half of one.
2. Bounded: at most `MAX_RECORDS` files are read, each at most `MAX_RECORD_BYTES`, read
   non-blocking as a regular file (`fs.read_file`); anything else in the directory is skipped.
3. No state: a `RecordStore` is a path; every call reads or writes the directory.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from multicall.core import keeper
from multicall.core.keeper import SandboxRecord
from multicall.errors import CniboxError

DEFAULT_DIR = "/run/linkerd-cni/sandboxes"


@dataclass(frozen=True, slots=True)
class RecordStore:
    """The node-local directory of sandbox records (one file per sandbox)."""

    directory: str = DEFAULT_DIR

    def ready(self) -> None:
        """Create the directory (mode 0700) or check that it is private; ConfigError else."""
        from multicall.effects.fs import private_dir

        private_dir(self.directory, create=True)

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key)

    def write(self, record: SandboxRecord) -> None:
        from multicall.effects.fs import write_atomic

        write_atomic(self.path(record.key), keeper.encode(record), 0o600)

    def remove(self, key: str) -> bool:
        from multicall.effects.fs import remove_durably

        return bool(key) and remove_durably(self.path(key))

    def read(self, key: str) -> SandboxRecord | None:
        from multicall.effects.fs import read_file

        try:
            data = read_file(self.path(key), keeper.MAX_RECORD_BYTES + 1, follow=False)
        except (OSError, CniboxError):
            return None
        record = keeper.decode(data) if data is not None else None
        return record if record is not None and record.key == key else None

    def keys(self) -> list[str]:
        """The record names in the directory (at most MAX_RECORDS, sorted)."""
        from multicall.effects.fs import is_temp_name

        names: list[str] = []
        with contextlib.suppress(OSError), os.scandir(self.directory) as entries:
            for entry in entries:
                if entry.name.endswith(keeper.RECORD_SUFFIX) and not is_temp_name(entry.name):
                    names.append(entry.name)
                if len(names) >= keeper.MAX_RECORDS:
                    break
        return sorted(names)
