"""CRC32C over every buffer type streamio hands it, without copies changing the answer."""

from __future__ import annotations

import mmap

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from streamio.checksum import Crc32c, checksum_bytes, crc32c, parse_checksum


@given(st.binary(max_size=4096), st.integers(0, 4096))
def test_every_buffer_type_gives_the_crc_of_its_bytes(data: bytes, cut: int) -> None:
    want = crc32c(data)
    views = [bytearray(data), memoryview(data), memoryview(bytearray(data)), np.frombuffer(data, np.uint8)]
    assert all(crc32c(v) == want for v in views)
    cut = min(cut, len(data))
    assert crc32c(memoryview(data)[cut:], crc32c(memoryview(data)[:cut])) == want  # slices, continued
    c = Crc32c()
    c.update(bytearray(data[:cut]))
    c.update(memoryview(data)[cut:])
    assert parse_checksum(c.hexdigest()) == want and c.size == len(data) and c.hexdigest() == checksum_bytes(data)


def test_known_value_and_a_memory_map(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    path = tmp_path / "f"
    path.write_bytes(b"123456789" * 1000)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        assert crc32c(view) == crc32c(b"123456789" * 1000)
        view.release()
