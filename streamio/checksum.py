"""CRC32C checksums, the one checksum of every streamio format.

CRC32C (Castagnoli) runs at several GB/s through ``google-crc32c``'s C extension, is what GCS
reports for objects, and is strong enough to catch the flipped bytes and truncations that
s3fs hands back silently on ranged reads. Checksums are written as ``"crc32c:0123abcd"`` so a
format can move to another algorithm without ambiguity.

:func:`crc32c_combine` derives the CRC of ``A + B`` from the CRCs of ``A`` and ``B`` and the length
of ``B`` (zlib's ``crc32_combine`` over the Castagnoli polynomial: multiplying by ``x^(8 len(B))``
modulo the polynomial, O(log len(B)) in pure Python, memoised per length). A checkpoint's bytes are
CRC'd once, in pieces cut at every tensor, block and part boundary, and each recorded checksum is
combined from its pieces (:mod:`streamio.checkpoint.tensors.crcs`) instead of passing over the
bytes once per level.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import google_crc32c

from streamio.errors import ConfigError

PREFIX = "crc32c:"


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value`` (the CRC of what came before)."""
    if not isinstance(data, bytes):
        # The extension takes only buffers without a release hook (bytes, ndarrays): a bytearray
        # or memoryview is handed over as a zero-copy ndarray view, never copied (bytes(view)
        # cost a full copy of every cached shard and restored part).
        data = (_frombuffer or _load_frombuffer())(data, dtype="u1")
    return google_crc32c.extend(value, data)


_frombuffer: Any = None  # numpy.frombuffer once a view was checked: the read path checks one per sample


def _load_frombuffer() -> Any:
    """``numpy.frombuffer``, imported on first use: every CLI verb imports this module, few need numpy
    (an ``import`` statement in :func:`crc32c` itself cost 2 microseconds per call)."""
    global _frombuffer
    import numpy as np

    _frombuffer = np.frombuffer
    return _frombuffer


_POLY = 0x82F63B78  # Castagnoli, bit-reflected (as the CRC is computed)


def _multiply(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial, both reflected (bit 31 is ``x^0``)."""
    product, mask = 0, 1 << 31
    while a:
        if a & mask:
            product ^= b
            a ^= mask
        mask >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _square_table() -> tuple[int, ...]:
    """``x^(2^k)`` modulo the polynomial for k = 0..63 (reflected)."""
    table = [1 << 30]  # x^1
    for _ in range(63):
        table.append(_multiply(table[-1], table[-1]))
    return tuple(table)


_X2N = _square_table()


@functools.lru_cache(maxsize=4096)  # lengths repeat: equal tensors, equal parts, equal blocks
def _shift(nbytes: int) -> int:
    """``x^(8 nbytes)`` modulo the polynomial: what appending ``nbytes`` bytes multiplies a CRC by."""
    power, k, n = 1 << 31, 3, nbytes  # x^0; bytes -> bits is k = 3
    while n:
        if n & 1:
            power = _multiply(_X2N[k % 64], power)
        n >>= 1
        k += 1
    return power


def crc32c_combine(first: int, second: int, second_len: int) -> int:
    """CRC32C of ``A + B`` from ``first`` = CRC32C(A), ``second`` = CRC32C(B) and ``len(B)``."""
    if second_len <= 0:
        return first
    return _multiply(_shift(second_len), first) ^ second


def combine_all(pieces: Iterable[tuple[int, int]]) -> int:
    """CRC32C of consecutive pieces joined, from each one's ``(crc, length)`` in order."""
    value = 0
    for crc, nbytes in pieces:
        value = crc32c_combine(value, crc, nbytes)
    return value


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
