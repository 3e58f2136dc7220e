"""/proc/self/mountinfo read as the kernel writes it (proc(5)): which file system type holds
a path. Pure: the text in, the answer out.

Rules of this module:
1. A mount point is the line's fifth field with the kernel's octal escapes (`\\040` for a
   space, `\\011`, `\\012`, `\\134`) undone; the type is the first field after the ` - `
   separator.
2. The mount of a path is the one whose mount point is the longest prefix of the path by whole
   components; of equal mount points the later line wins (it is mounted over the earlier).
3. A malformed line is skipped, never an error: the caller's question then gets "" (unknown).
"""

from __future__ import annotations

import re

_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def fs_type(path: str, text: str) -> str:
    """The file system type of the mount holding the absolute, clean `path`; "" if none."""
    best, found = -1, ""
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or not tail.split():
            continue
        point = _unescape(fields[4])
        inside = point in ("/", path) or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, found = len(point), tail.split()[0]
    return found
