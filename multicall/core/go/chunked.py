"""Go's net/http/internal chunked reader: what a chunk-size line may hold (Go 1.19, the
oracle this machine builds; tests/tools/test_http_framing_oracle.py checks the table of
tests/support/framing.py against it).

One definition for both readers of chunked bodies: the plugin's and controller's client
(effects/http.py) and the watch stream's line decoder (core/kube/watch.py), so a size
that one accepts the other does too (issue 29: the watch decoder read `0x10` and `+5`,
which Go refuses, through Python's `int(text, 16)`).
"""

from __future__ import annotations

# bufio.Reader's default size, and chunked.go's maxLineLength: a chunk-size or trailer line
# of this many bytes or more is "header line too long" (ErrLineTooLong).
MAX_LINE = 4096
# A chunk size has at most 16 hex digits (uint64); the 17th is "too large", leading zeros or not.
MAX_HEX_DIGITS = 16

_HEX = {ord(c): int(c, 16) for c in "0123456789abcdefABCDEF"}


class ChunkError(ValueError):
    """A chunked-encoding failure; `str()` is Go's error text."""


def chunk_size(line: bytes) -> int:
    """The size a chunk-size line announces, read as chunked.go's readChunkLine,
    removeChunkExtension and parseHexUint do: `line` is what ReadSlice('\\n') returned
    (its LF included); trailing space, tab, CR and LF are trimmed first, then everything
    from the first `;` (an extension) is dropped, and what is left must be 1 to 16 hex
    digits: no sign, no `0x`, no inner or leading space (so `5 ;ext` is refused, as Go
    trims before it cuts)."""
    if len(line) >= MAX_LINE:
        raise ChunkError("header line too long")
    text = line.rstrip(b" \t\r\n").split(b";", 1)[0]
    if not text:
        raise ChunkError("empty hex number for chunk length")
    size = 0
    for i, byte in enumerate(text):
        digit = _HEX.get(byte)
        if digit is None:
            raise ChunkError("invalid byte in chunk length")
        if i == MAX_HEX_DIGITS:
            raise ChunkError("http chunk length too large")
        size = size << 4 | digit
    return size
