"""The installer's undo journal: what it changed on the node, as bytes it keeps on disk so a
restarted installer (after a SIGKILL) or `install-cni --uninstall` can put the node back.

Rules of this module:
1. The journal is a directory of small files, never one growing document, so its size per
   file is bounded by design and recording one change costs the same with 10 or 10,000
   configs (a rewrite of one whole journal per patch made installs quadratic):
   - `undo.json` (`encode`/`decode`): the binary the installer copied (path and SHA-256) and
     the kubeconfig it wrote. Links need no record: they are recognised by their target.
   - records of the CNI config names the installer changed, in group files in the records
     dir (`encode_group`/`decode_group`, version 3): one per batch of configs patched
     together, split so that no group exceeds `RECORD_LIMIT` (`group_sizes`; a record of a
     1 MiB config, in base64, fits alone), so that limit bounds every read and a batch costs
     one file creation per group, not one per config (on ext4 each creation costs 0.1-0.9 ms
     in the kernel). A record: the bytes and mode the name held before the installer first
     changed it (`original`, None when the installer created the name) and the SHA-256 of
     what the installer left there (`written`, "" when it removed the name, as when `x.conf`
     became `x.conflist`). A group is durable before any change it records is made
     (write-ahead). Groups are named `group-<number>`, never a CNI config name; a later
     group's record of a name replaces an earlier one (read in number order), and a file
     goes once no current record is in it (every record in it replaced, or undone).
   - version 2 per-name records (`decode_record`: a file named after its config, one record)
     written by cnibox before groups are still read, before every group, and undone.
2. Records are JSON (sorted keys, the original bytes in base64): readable by an operator and
   a stable byte string, so writing the same record twice writes the same bytes. A group is
   one line (the json module's C encoder: 10,000 configs write 20,000 records); a record
   written indented by an earlier version reads the same.
3. Decoding trusts nothing: an unknown version, a wrong type, undecodable base64, a record
   whose path is not the config of its own name, or a path outside the CNI config dir
   (configs) or bin dir (the binary) is a ConfigError. An unreadable group loses (to
   undo) the originals of every config it records, not just one: the installer refuses
   to install and `--uninstall` names the group file. The installer never goes on as if
   the journal were not there: it refuses to install, and `--uninstall` undoes what the
   readable records allow and then fails, naming the record to look at.
4. A version 1 `undo.json` (one document holding every config, written by cnibox before
   records existed) is still read: its entries become records (`Journal.records`).
5. What a record means when the file changed since the installer wrote it is the undo's
   business (installer/undo.py): restored only while its bytes are still the installer's.
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
from dataclasses import dataclass

from multicall.core.limits import INSTALLER_FILE, KIB
from multicall.errors import ConfigError

VERSION = 2
GROUP_VERSION = 3
# One record: a config of at most INSTALLER_FILE bytes in base64, plus paths and digests.
RECORD_LIMIT = INSTALLER_FILE * 4 // 3 + 64 * KIB
# A group file's name: never a CNI config name (those end in .conf/.conflist), so never a
# version 2 per-name record's; the number orders groups (a later group's record wins).
GROUP_PREFIX = "group-"
_GROUP_HEAD = b'{"records": ['
_GROUP_TAIL = b'], "version": 3}\n'


@dataclass(frozen=True, slots=True)
class Record:
    """One CNI config name the installer changed: before, `path` held `original` (None: it
    did not exist) with mode `mode`; now it holds bytes hashing to `written` ("": nothing)."""

    path: str
    original: bytes | None
    mode: int
    written: str

    def holds(self, current: bytes | None, digest: str | None) -> bool:
        """Whether `current` (None: the name is free), hashing to `digest`, is what the
        installer left at the path."""
        if not self.written:
            return current is None
        return current is not None and digest == self.written


@dataclass(frozen=True, slots=True)
class Journal:
    """`undo.json`: the binary and kubeconfig; `records` only from a version 1 journal."""

    copied: tuple[tuple[str, str], ...] = ()  # (binary path, sha256)
    kubeconfig: str = ""
    records: tuple[Record, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.records or self.copied or self.kubeconfig)


def encode(journal: Journal) -> bytes:
    doc = {
        "version": VERSION,
        "copied": [{"path": path, "sha256": digest} for path, digest in sorted(journal.copied)],
        "kubeconfig": journal.kubeconfig,
    }
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def decode(data: bytes, *, net_dir: str, bin_dir: str) -> Journal:
    """The journal in `data`; ConfigError for anything rule 3 refuses."""
    doc = _document(data, "undo journal")
    if doc.get("version") not in (1, VERSION):
        raise ConfigError(f"the undo journal is not a version {VERSION} journal")
    records: list[Record] = []
    if doc.get("version") == 1:
        for item in _list(doc, "patched"):
            records.extend(_version1(item, net_dir))
    copied = tuple(_copied(item, bin_dir) for item in _list(doc, "copied"))
    kubeconfig = doc.get("kubeconfig", "")
    if not isinstance(kubeconfig, str) or (kubeconfig and not _below(kubeconfig, net_dir)):
        raise ConfigError(f"the undo journal names a kubeconfig outside {net_dir}")
    return Journal(copied, kubeconfig, tuple(records))


def encode_record(record: Record) -> bytes:
    doc = {
        "version": VERSION,
        "path": record.path,
        "original": None if record.original is None else _b64(record.original),
        "mode": record.mode,
        "written": record.written,
    }
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


def encode_group_entry(record: Record) -> bytes:
    """One record as it stands in a group (`encode_group`): the record without its version."""
    doc = {
        "path": record.path,
        "original": None if record.original is None else _b64(record.original),
        "mode": record.mode,
        "written": record.written,
    }
    return json.dumps(doc, sort_keys=True).encode()


def group_sizes(entries: list[bytes], limit: int = RECORD_LIMIT) -> list[int]:
    """How many of `entries` (in order) each group file takes so that no group's bytes
    exceed `limit`: a group closes before the entry that would overflow it; an entry alone
    always fits (one 1 MiB config's record is below RECORD_LIMIT by its 64 KiB margin)."""
    sizes: list[int] = []
    room = limit - len(_GROUP_HEAD) - len(_GROUP_TAIL)
    count = used = 0
    for entry in entries:
        need = len(entry) + (2 if count else 0)  # ", " between entries
        if count and used + need > room:
            sizes.append(count)
            count = used = 0
            need = len(entry)
        count += 1
        used += need
    if count:
        sizes.append(count)
    return sizes


def encode_group(entries: list[bytes]) -> bytes:
    """A group file: many records (`encode_group_entry`), one line, sorted keys."""
    return _GROUP_HEAD + b", ".join(entries) + _GROUP_TAIL


def group_name(number: int) -> str:
    return f"{GROUP_PREFIX}{number:09d}"


def group_number(name: str) -> int | None:
    """The number of the group file `name`; None when `name` is not a group file's."""
    digits = name[len(GROUP_PREFIX) :]
    if not name.startswith(GROUP_PREFIX) or not digits.isdigit() or not digits.isascii():
        return None
    return int(digits)


def decode_group(data: bytes, *, net_dir: str) -> tuple[Record, ...]:
    """The records of a group file, in order; ConfigError for anything rule 3 refuses."""
    doc = _document(data, "undo record group")
    if doc.get("version") != GROUP_VERSION:
        raise ConfigError(f"the undo record group is not a version {GROUP_VERSION} group")
    records: list[Record] = []
    for item in _list(doc, "records"):
        path = _text(item, "path")
        if not _in_dir(path, net_dir):
            raise ConfigError(f"the undo record group names {path!r}, which is not in {net_dir}")
        original = None if _get(item, "original") is None else _unb64(item, "original", path)
        records.append(Record(path, original, _mode(item, path), _text(item, "written")))
    return tuple(records)


def decode_record(data: bytes, *, net_dir: str, name: str) -> Record:
    """The record in `data`, kept under `name`; ConfigError for anything rule 3 refuses."""
    doc = _document(data, "undo record")
    if doc.get("version") != VERSION:
        raise ConfigError(f"the undo record is not a version {VERSION} record")
    path = _text(doc, "path")
    if not _in_dir(path, net_dir) or posixpath.basename(path) != name:
        raise ConfigError(f"the undo record names {path!r}, not {net_dir}/{name}")
    original = None if doc.get("original") is None else _unb64(doc, "original", path)
    return Record(path, original, _mode(doc, path), _text(doc, "written"))


def _document(data: bytes, what: str) -> dict[str, object]:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"the {what} is not valid JSON: {_reason(exc)}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"the {what} is not a JSON object")
    return doc


def _version1(item: object, net_dir: str) -> tuple[Record, ...]:
    """A version 1 entry: `target` holds `written`; `original_path` held `original`."""
    target = _text(item, "target")
    original_path = _text(item, "original_path")
    for path in (target, original_path):
        if not _in_dir(path, net_dir):
            raise ConfigError(f"the undo journal names {path!r}, which is not in {net_dir}")
    original = _unb64(item, "original", original_path)
    mode = _mode(item, original_path)
    written = _text(item, "written")
    if target == original_path:
        return (Record(target, original, mode, written),)
    return (Record(target, None, mode, written), Record(original_path, original, mode, ""))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(item: object, key: str, path: str) -> bytes:
    try:
        return base64.b64decode(_text(item, key), validate=True)
    except binascii.Error:
        raise ConfigError(f"the undo journal's copy of {path} is not base64") from None


def _mode(item: object, path: str) -> int:
    mode = _get(item, "mode")
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise ConfigError(f"the undo journal has an invalid mode for {path}")
    return mode


def _reason(exc: BaseException) -> str:
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)


def _list(doc: dict[str, object], key: str) -> list[object]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"the undo journal's {key} is not a list")
    return value


def _get(item: object, key: str) -> object:
    return item.get(key) if isinstance(item, dict) else None


def _text(item: object, key: str) -> str:
    value = _get(item, key)
    if not isinstance(value, str):
        raise ConfigError(f"the undo journal has an entry without a valid {key}")
    return value


def _copied(item: object, bin_dir: str) -> tuple[str, str]:
    path = _text(item, "path")
    if not _in_dir(path, bin_dir):
        raise ConfigError(f"the undo journal names {path!r}, which is not in {bin_dir}")
    return path, _text(item, "sha256")


def _below(path: str, directory: str) -> bool:
    return path.startswith(directory + "/") and posixpath.normpath(path) == path


def _in_dir(path: str, directory: str) -> bool:
    """A direct child of `directory` (what the installer writes), spelled cleanly."""
    head, name = posixpath.split(path)
    return head == directory and name not in ("", ".", "..") and posixpath.normpath(path) == path
