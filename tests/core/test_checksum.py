"""CRC32C over every buffer type streamio hands it, without copies changing the answer."""

from __future__ import annotations

import mmap

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.checksum import Crc32c, checksum_bytes, combine_all, crc32c, crc32c_combine, parse_checksum


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


@given(st.binary(max_size=2048), st.binary(max_size=2048), st.binary(max_size=64))
def test_combine_gives_the_crc_of_the_joined_bytes(a: bytes, b: bytes, c: bytes) -> None:
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)  # either side may be empty
    assert combine_all([(crc32c(a), len(a)), (crc32c(b), len(b)), (crc32c(c), len(c))]) == crc32c(a + b + c)


@settings(max_examples=30)
@given(st.binary(max_size=64), st.binary(max_size=64), st.integers(0, 1 << 18))
def test_combine_over_long_pieces(a: bytes, head: bytes, zeros: int) -> None:
    b = head + bytes(zeros)  # long: every bit of the length's shift table is exercised up to 2^18
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)
