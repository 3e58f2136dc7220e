"""Pack the standalone dist behind the launcher: dist/cnibox = launcher + zstd payload + trailer.

The format is the one build/launcher.c reads (see its header comment):
  payload  zstd frame (with content checksum) of a record stream, one record per entry:
           u32 type ('d', 'f', 'l'), u32 mode, u32 path length, u32 0, u64 size, path, data
  trailer  b"CNIBOX\\x01\\n", u64 payload offset, u64 payload size, u64 raw size,
           16 hex chars content hash, u64 format version, u64 XXH64 of the 56 bytes before

Rules of this module:
1. The stream is deterministic (sorted paths, no timestamps, no owners), so the content hash
   (the extraction directory's name) changes exactly when the extracted files would.
2. The hash covers the format version too: a launcher with another extraction layout never
   reuses a directory unpacked by an older one.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import zstandard

MAGIC = b"CNIBOX\x01\n"
FORMAT_VERSION = 1
HEADER = struct.Struct("<IIIIQ")
ZSTD_LEVEL = 19


def records(dist: Path) -> Iterator[bytes]:
    """The record stream of `dist`, parents before children, in a stable order."""
    for base, dirs, files in os.walk(dist):
        dirs.sort()
        rel_base = Path(base).relative_to(dist)
        for name in sorted([*dirs, *files]):
            path = Path(base) / name
            rel = str(rel_base / name) if str(rel_base) != "." else name
            yield _record(path, rel)


def _record(path: Path, rel: str) -> bytes:
    st = path.lstat()
    mode = stat.S_IMODE(st.st_mode) & 0o755
    encoded = os.fsencode(rel)
    if stat.S_ISLNK(st.st_mode):
        data = os.fsencode(os.readlink(path))
        kind = ord("l")
    elif stat.S_ISDIR(st.st_mode):
        data = b""
        kind = ord("d")
    elif stat.S_ISREG(st.st_mode):
        data = path.read_bytes()
        kind = ord("f")
    else:
        raise SystemExit(f"pack: {path}: not a file, directory or symlink")
    return HEADER.pack(kind, mode, len(encoded), 0, len(data)) + encoded + data


def xxh64(data: bytes) -> int:
    """XXH64 with seed 0, as the launcher computes it (zstd's copy of xxhash)."""
    prime1, prime2, prime3, prime4, prime5 = (
        0x9E3779B185EBCA87,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0x85EBCA77C2B2AE63,
        0x27D4EB2F165667C5,
    )
    mask = (1 << 64) - 1

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (64 - r))) & mask

    def round_(acc: int, lane: int) -> int:
        return (rotl((acc + lane * prime2) & mask, 31) * prime1) & mask

    length, i = len(data), 0
    if length >= 32:
        v = [(prime1 + prime2) & mask, prime2, 0, (-prime1) & mask]
        while i + 32 <= length:
            for j in range(4):
                v[j] = round_(v[j], int.from_bytes(data[i + 8 * j : i + 8 * j + 8], "little"))
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & mask
        for lane in v:
            h = ((h ^ round_(0, lane)) * prime1 + prime4) & mask
    else:
        h = prime5
    h = (h + length) & mask
    while i + 8 <= length:
        h ^= round_(0, int.from_bytes(data[i : i + 8], "little"))
        h = (rotl(h, 27) * prime1 + prime4) & mask
        i += 8
    if i + 4 <= length:
        h ^= (int.from_bytes(data[i : i + 4], "little") * prime1) & mask
        h = (rotl(h, 23) * prime2 + prime3) & mask
        i += 4
    while i < length:
        h ^= (data[i] * prime5) & mask
        h = (rotl(h, 11) * prime1) & mask
        i += 1
    h ^= h >> 33
    h = (h * prime2) & mask
    h ^= h >> 29
    h = (h * prime3) & mask
    return h ^ (h >> 32)


def trailer(offset: int, size: int, raw_size: int, digest: str) -> bytes:
    body = MAGIC + struct.pack("<QQQ", offset, size, raw_size)
    body += digest.encode("ascii") + struct.pack("<Q", FORMAT_VERSION)
    return body + struct.pack("<Q", xxh64(body))


def pack_artifact(launcher: Path, dist: Path, programs: tuple[str, str], out: Path) -> str:
    """Write `out` from the dist whose (main binary, loader) are `programs`; returns a report."""
    for required in (*programs, "locale/C.utf8/LC_CTYPE"):
        if not (dist / required).exists():
            raise SystemExit(
                f"pack: {dist / required} missing (was the dist built by build/binary.py?)"
            )
    raw = b"".join(records(dist))
    digest = hashlib.sha256(b"format %d\n" % FORMAT_VERSION + raw).hexdigest()[:16]
    payload = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1, write_checksum=True).compress(
        raw
    )
    head = launcher.read_bytes()
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(head)
        f.write(payload)
        f.write(trailer(len(head), len(payload), len(raw), digest))
    os.chmod(tmp, 0o755)  # noqa: S103 - programs and shared libraries
    os.replace(tmp, out)  # a running copy keeps its inode: replacing is safe
    return (
        f"{out}: {out.stat().st_size} bytes (launcher {len(head)}, payload {len(payload)}, "
        f"unpacked {len(raw)}), hash {digest}"
    )
