"""One CRC32C pass over a stream gives every checksum a save records, equal to a direct CRC."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from streamio.checkpoint.format import layout
from streamio.checkpoint.tensors.crcs import Pieces, cut_points, scan
from streamio.checksum import crc32c

Case = tuple[bytes, list[tuple[int, int]], int, int]


@st.composite
def streams(draw: st.DrawFn) -> Case:
    """A stream, tensors laid in it (with gaps: padding), a part size and a block size."""
    sizes = draw(st.lists(st.integers(0, 300), max_size=8))
    gaps = draw(st.lists(st.integers(0, 70), min_size=len(sizes), max_size=len(sizes)))
    tensors, pos = [], 0
    for size, gap in zip(sizes, gaps, strict=True):
        tensors.append((pos, size))
        pos += size + gap
    data = draw(st.binary(min_size=pos, max_size=pos))
    return data, tensors, draw(st.integers(1, 700)), draw(st.sampled_from([0, 7, 64, 1000]))


@given(streams())
def test_every_level_combined_from_one_pass_equals_a_direct_crc(case: Case) -> None:
    data, tensors, part_size, block = case
    stream = np.frombuffer(data, dtype=np.uint8)
    cuts = cut_points(tensors)
    scanned = []
    for start, end in layout.split_ranges(len(data), part_size):
        pieces = scan(stream, start, end, cuts, block)
        assert sum(n for _, n, _ in pieces) == end - start  # one pass: each byte in exactly one piece
        own = Pieces(pieces)
        assert own.crc(start, end - start) == crc32c(data[start:end])
        for b in range(start, end, block or end - start):
            n = min(block or end - start, end - b)
            assert own.crc(b, n) == crc32c(data[b : b + n])
        scanned += pieces
    whole = Pieces(scanned)
    for offset, nbytes in tensors:  # tensors that span parts too
        assert whole.crc(offset, nbytes) == crc32c(data[offset : offset + nbytes])
