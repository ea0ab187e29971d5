"""One CRC32C pass over a rank's byte stream, from which every checksum of its save is combined.

A save records CRC32C at three levels over the same bytes: each part's (what a restore checks),
each block's of a part (ranged reads of sharded state, :mod:`.fetch`) and each tensor's (``streamio
ckpt verify``). Taken one by one they pass over every byte two or three times, with the GIL held.
Instead each part's upload thread CRCs its bytes once, in *pieces* cut at every boundary that any
level has inside the part (:func:`scan`), and each checksum is combined from the pieces that tile
its range (:class:`Pieces`, :func:`~streamio.checksum.crc32c_combine`); a tensor that spans two
parts is combined from both parts' pieces. The values are those a direct CRC gives, bit for bit:
saves written before and after verify alike.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence

import numpy as np

from streamio.checksum import combine_all, crc32c

__all__ = ["Piece", "Pieces", "cut_points", "scan"]

Piece = tuple[int, int, int]
"""``(stream offset, length, CRC32C)`` of one piece of a stream."""


def cut_points(ranges: Iterable[tuple[int, int]]) -> tuple[int, ...]:
    """The sorted offsets where one of ``ranges`` (``(offset, nbytes)``) begins or ends."""
    return tuple(sorted({x for offset, nbytes in ranges for x in (offset, offset + nbytes)}))


def scan(stream: np.ndarray, start: int, end: int, cuts: Sequence[int], block_size: int = 0) -> list[Piece]:
    """CRC32C of ``stream[start:end]`` in pieces, cut at every offset of ``cuts`` (sorted) inside
    it and, with ``block_size``, every ``block_size`` bytes from ``start``: one pass over the bytes."""
    inside = cuts[bisect.bisect_right(cuts, start) : bisect.bisect_left(cuts, end)]
    blocks = range(start + block_size, end, block_size) if block_size > 0 else ()
    points = sorted({start, end, *inside, *blocks})
    view = stream.view()
    view.flags.writeable = False  # the CRC32C extension takes a read-only array without a copy
    return [(a, b - a, crc32c(view[a:b])) for a, b in itertools.pairwise(points)]  # type: ignore[arg-type]


class Pieces:
    """The pieces of one stream, from any number of :func:`scan` calls that do not overlap."""

    def __init__(self, pieces: Iterable[Piece]) -> None:
        self._pieces = sorted(pieces)
        self._starts = [p[0] for p in self._pieces]

    def crc(self, offset: int, nbytes: int) -> int:
        """CRC32C of ``[offset, offset + nbytes)``, which must begin and end on piece boundaries
        (every range :func:`scan` was told to cut at does)."""
        lo = bisect.bisect_left(self._starts, offset)
        hi = bisect.bisect_left(self._starts, offset + nbytes)
        return combine_all((crc, length) for _, length, crc in self._pieces[lo:hi])
