"""Text onto the binary standard streams: applets control every byte they print."""

from __future__ import annotations

from typing import BinaryIO


def write_text(stream: BinaryIO, text: str) -> None:
    """Write text to a binary stream as UTF-8 (surrogates kept, like os.fsencode), flushed."""
    stream.write(text.encode("utf-8", "surrogateescape"))
    stream.flush()
