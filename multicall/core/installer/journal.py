"""The installer's undo journal: what it changed on the node, as bytes it keeps on disk so a
restarted installer (after a SIGKILL) or `install-cni --uninstall` can put the node back.

Rules of this module:
1. The journal records, before each change is made (write-ahead), every CNI config the
   installer rewrote (the path it now has, the name, bytes and mode it had before, and the
   SHA-256 of the bytes the installer wrote), the binary it copied (path and SHA-256) and the
   kubeconfig it wrote. Links need no record: they are recognised by their target.
2. A journal is JSON (version 1, sorted keys, the original bytes in base64), so it is
   readable by an operator and a stable byte string: writing the same journal twice writes
   the same bytes.
3. Decoding trusts nothing: an unknown version, a wrong type, undecodable base64 or a path
   outside the CNI config dir (configs) or bin dir (the binary) is a ConfigError, and the
   installer then undoes without it (removing linkerd entries only) rather than restore
   bytes to a place the journal should never name.
4. What a record means when the file changed since the installer wrote it is the undo's
   business (installer/undo.py): restored only if its bytes are still ours, else only
   its linkerd entry goes.
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
from dataclasses import dataclass

from multicall.errors import ConfigError

VERSION = 1


@dataclass(frozen=True, slots=True)
class Patched:
    """One CNI config the installer rewrote: `target` now holds bytes hashing to `written`;
    before, `original_path` held `original` with mode `mode`."""

    target: str
    original_path: str
    original: bytes
    mode: int
    written: str


@dataclass(frozen=True, slots=True)
class Journal:
    """What the installer changed, so that it can be undone."""

    patched: tuple[Patched, ...] = ()
    copied: tuple[tuple[str, str], ...] = ()  # (binary path, sha256)
    kubeconfig: str = ""

    @property
    def empty(self) -> bool:
        return not (self.patched or self.copied or self.kubeconfig)


def encode(journal: Journal) -> bytes:
    doc = {
        "version": VERSION,
        "patched": [
            {
                "target": p.target,
                "original_path": p.original_path,
                "original": base64.b64encode(p.original).decode("ascii"),
                "mode": p.mode,
                "written": p.written,
            }
            for p in sorted(journal.patched, key=lambda p: p.target)
        ],
        "copied": [{"path": path, "sha256": digest} for path, digest in sorted(journal.copied)],
        "kubeconfig": journal.kubeconfig,
    }
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def decode(data: bytes, *, net_dir: str, bin_dir: str) -> Journal:
    """The journal in `data`; ConfigError for anything rule 3 refuses."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"the undo journal is not valid JSON: {_reason(exc)}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ConfigError(f"the undo journal is not a version {VERSION} journal")
    patched = tuple(_patched(item, net_dir) for item in _list(doc, "patched"))
    copied = tuple(_copied(item, bin_dir) for item in _list(doc, "copied"))
    kubeconfig = doc.get("kubeconfig", "")
    if not isinstance(kubeconfig, str) or (kubeconfig and not _below(kubeconfig, net_dir)):
        raise ConfigError(f"the undo journal names a kubeconfig outside {net_dir}")
    return Journal(patched, copied, kubeconfig)


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


def _patched(item: object, net_dir: str) -> Patched:
    target = _text(item, "target")
    original_path = _text(item, "original_path")
    for path in (target, original_path):
        if not _in_dir(path, net_dir):
            raise ConfigError(f"the undo journal names {path!r}, which is not in {net_dir}")
    try:
        original = base64.b64decode(_text(item, "original"), validate=True)
    except binascii.Error:
        raise ConfigError(f"the undo journal's copy of {original_path} is not base64") from None
    mode = _get(item, "mode")
    if not isinstance(mode, int) or isinstance(mode, bool) or not 0 <= mode <= 0o7777:
        raise ConfigError(f"the undo journal has an invalid mode for {original_path}")
    return Patched(target, original_path, original, mode, _text(item, "written"))


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
