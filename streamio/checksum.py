"""CRC32C checksums, the one checksum of every streamio format.

CRC32C (Castagnoli) runs at several GB/s through ``google-crc32c``'s C extension, is what GCS
reports for objects, and is strong enough to catch the flipped bytes and truncations that
s3fs hands back silently on ranged reads. Checksums are written as ``"crc32c:0123abcd"`` so a
format can move to another algorithm without ambiguity.
"""

from __future__ import annotations

import google_crc32c

from streamio.errors import ConfigError

PREFIX = "crc32c:"


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (the CRC of what came before)."""
    if not isinstance(data, bytes):
        # The extension takes only buffers without a release hook (bytes, ndarrays): a bytearray
        # or memoryview is handed over as a zero-copy ndarray view, never copied (bytes(view)
        # cost a full copy of every cached shard and restored part).
        import numpy as np  # here, not at the top: every CLI verb imports this module, few need numpy

        data = np.frombuffer(data, dtype=np.uint8)
    return google_crc32c.extend(value, data)


def format_checksum(value: int) -> str:
    """``0x1234abcd`` -> ``"crc32c:1234abcd"``."""
    return f"{PREFIX}{value:08x}"


def parse_checksum(text: str) -> int:
    """``"crc32c:1234abcd"`` -> ``0x1234abcd``; raises ``ValueError`` for anything else."""
    if not isinstance(text, str) or not text.startswith(PREFIX) or len(text) != len(PREFIX) + 8:
        raise ConfigError(f"checksum {text!r} is not of the form 'crc32c:<8 hex digits>'")
    return int(text[len(PREFIX) :], 16)


def checksum_bytes(data: bytes | bytearray | memoryview) -> str:
    """The formatted CRC32C of ``data``."""
    return format_checksum(crc32c(data))


class Crc32c:
    """Incremental CRC32C over a stream of chunks: ``update(chunk)`` ..., then ``hexdigest()``."""

    __slots__ = ("value", "size")

    def __init__(self) -> None:
        self.value = 0
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self.value = crc32c(data, self.value)
        self.size += len(data)

    def hexdigest(self) -> str:
        return format_checksum(self.value)
