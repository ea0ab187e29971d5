"""``.npy`` members are untrusted: a hostile header is refused as a ShardFormatError naming the shard,
sample and member before anything is allocated on its word, and nothing is ever unpickled.

On 15d7008 an unknown dtype raised a bare ``TypeError`` (through the token packer) or a
``DatasetError`` (through ``decode="auto"``), a shape of 10**14 a ``MemoryError``, and a uint64
token document was accepted with its ids above 2**63 - 1 wrapped negative.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamio
from streamio.data.dataset import StreamingDataset  # imported here: torch's import is not the budget
from streamio.data.decode import make_decoder
from streamio.data.format import npy
from streamio.data.format.tokens import check_document, load_tokens
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import ShardFormatError
from support import hostile_corpus as hc

pytestmark = pytest.mark.timeout(120)

BUDGET = {"seconds": 5.0, "max_bytes": 16 << 20}


def header(descr: Any = "<u2", shape: Any = (3,), fortran: Any = False) -> bytes:
    """A version 1.0 header as numpy writes it, of any field values."""
    text = "{'descr': %r, 'fortran_order': %r, 'shape': %r, }" % (descr, fortran, shape)  # noqa: UP031 - numpy's form
    body = text.encode("utf8")  # a v1.0 header is read as latin1: any bytes
    body += b" " * (63 - (10 + len(body)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


def saved(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


HOSTILE = {
    "an unknown dtype": (header("xyz") + bytes(6), r"its descr 'xyz' is not a numpy dtype"),
    "a shape of 10**14": (header("<u2", (10**14,)) + bytes(6),
                          r"its header declares 200000000000000 bytes of uint16 \(100000000000000,\), it holds 6"),
    "an object dtype": (header("|O", (1,)) + bytes(8), r"its dtype object holds Python objects"),
    "objects inside a record": (header([("a", "<i4"), ("b", "|O")], (1,)) + bytes(12),
                                r"its dtype \[.*\] holds Python objects: they need a pickle"),
    "a negative shape": (header("<u2", (-3,)) + bytes(6), r"its shape \(-3,\) is not a tuple of at most 32 integers"),
    "a float in the shape": (header("<u2", (3.0,)) + bytes(6), r"its shape \(3.0,\) is not a tuple"),
    "too many dimensions": (header("<u2", (1,) * 40) + bytes(2), r"is not a tuple of at most 32 integers"),
    "fewer bytes than declared": (header("<i8", (4,)) + bytes(31), r"declares 32 bytes of int64 \(4,\), it holds 31"),
    "more bytes than declared": (header("<i8", (4,)) + bytes(33), r"declares 32 bytes of int64 \(4,\), it holds 33"),
    "a call in the header": (header().replace(b"'<u2'", b"f(1) "), r"its header is not a Python literal"),
    "a header of 1 GiB": (b"\x93NUMPY\x02\x00" + (1 << 30).to_bytes(4, "little") + b"{", r"declares 1073741824 bytes"),
    "a version 9.9": (b"\x93NUMPY\x09\x09" + header()[8:] + bytes(6), r"version 9\.9 is not 1\.0, 2\.0 or 3\.0"),
    "a missing key": (header().replace(b"'fortran_order'", b"'fortran_ordex'") + bytes(6), r"not a dict of exactly"),
    "fortran_order 1": (header(fortran=1) + bytes(6), r"its fortran_order is 1, not True or False"),
    "10**14 items of 0 bytes": (header("|V0", (10**14,)), r"its dtype \|V0 has items of 0 bytes: 100000000000000 of"),
    "an empty shape numpy cannot make": (header("<u2", (0, 2**62, 2**62)), r"numpy cannot make uint16 \(0, 46"),
    "a 4000-digit size": (header("<u2", (10**4000,)), r"declares 2000000000.*\(4001 characters\) bytes of uint16"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_npy_header_is_refused_naming_shard_and_sample(case: str) -> None:
    raw, why = HOSTILE[case]
    sample = {"__key__": "doc7", "__url__": "s3://b/ds/data-000003.tar", "__index__": 7, "npy": raw}
    _, error = hc.within(lambda: make_decoder("auto")(sample), **BUDGET)
    assert isinstance(error, ShardFormatError), repr(error)
    where = "cannot decode member 'npy' of sample 'doc7' (number 7) of shard 's3://b/ds/data-000003.tar': "
    assert str(error).startswith(where) and re.search(why, str(error)), str(error)
    _, error = hc.within(lambda: load_tokens(raw), **BUDGET)  # what the token packer names the shard of
    assert isinstance(error, ShardFormatError) and re.search(why, str(error)), repr(error)


def _token_dataset(url: str, members: list[bytes], counts: list[int]) -> None:
    write_dataset([{"__key__": f"d{i}", "npy": m} for i, m in enumerate(members)], url, spec=ShardSpec(max_count=8))
    path = Path(url) / "index.json"
    doc = json.loads(path.read_text())
    doc["shards"][0]["tokens"] = {"npy": counts}
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("case", ["an unknown dtype", "a shape of 10**14", "an object dtype"])
def test_the_token_packer_names_a_hostile_document_instead_of_raising_what_numpy_does(
    tmp_path: Path, as_rank: Any, case: str
) -> None:
    url = str(tmp_path / "tok")
    _token_dataset(url, [saved(np.arange(5, dtype="<u2")), HOSTILE[case][0]], [5, 3])
    as_rank(0, 1)
    ds = StreamingDataset(url, shuffle=False, pack=streamio.Pack(4))
    _, error = hc.within(lambda: [s for s in ds], **BUDGET)  # noqa: C416 - a loop: list() asks len() first
    assert isinstance(error, ShardFormatError), repr(error)
    message = str(error)
    assert "data-000000.tar' sample 1: member 'npy' is not a .npy array: " in message, message
    assert re.search(HOSTILE[case][1], message), message


def test_a_uint64_document_is_refused_by_name_not_wrapped_negative(tmp_path: Path, as_rank: Any) -> None:
    with pytest.raises(ShardFormatError, match=r"shard 'a.tar' sample 2: member 'npy' is uint64, whose ids above "
                                               r"2\*\*63 - 1 would wrap negative.*uint16, uint32, int32 or int64"):
        check_document(np.array([1, 2**64 - 1], dtype="<u8"), expected=2, shard="a.tar", sample=2, member="npy")
    url = str(tmp_path / "tok")
    _token_dataset(url, [saved(np.array([1, 2], dtype="<u4")), saved(np.array([7, 2**63], dtype="<u8"))], [2, 2])
    as_rank(0, 1)
    with pytest.raises(ShardFormatError, match=r"data-000000.tar' sample 1: member 'npy' is uint64"):
        list(StreamingDataset(url, shuffle=False, pack=streamio.Pack(2)))


ARRAYS = [
    np.arange(6).reshape(2, 3), np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array(3, dtype=">i2"),
    np.zeros((0, 5), dtype="<f4"), np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]), np.array(["ab", "c"]),
    np.array([True, False]), np.arange(4, dtype="<u8"), np.zeros((2, 0, 3), dtype="<c16"),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_what_numpy_saves_decodes_as_numpy_loads_it_writable(array: np.ndarray) -> None:
    got = make_decoder("auto")({"__key__": "k", "npy": saved(array)})["npy"]
    want = np.load(io.BytesIO(saved(array)), allow_pickle=False)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert got.flags.writeable and got.flags.f_contiguous == want.flags.f_contiguous


descrs = (
    st.sampled_from(["<u2", "<i8", "|u1", ">f4", "|O", "xyz", "<U0", "|V0", "|V3", "<M8[s]", "", "<u2\x00"])
    | st.lists(st.tuples(st.text(max_size=3), st.sampled_from(["<i4", "|O", "q", "<u2"])), max_size=3)
    | st.integers()
    | st.none()
)
shapes = st.lists(st.integers(-3, 10**15), max_size=4).map(tuple) | st.integers() | st.text(max_size=4)


@settings(max_examples=200, deadline=None)
@given(descr=descrs, shape=shapes, fortran=st.sampled_from([False, True, 0, None]), payload=st.integers(0, 64))
def test_fuzzed_headers_parse_to_exactly_their_bytes_or_raise_a_shard_format_error(
    descr: Any, shape: Any, fortran: Any, payload: int
) -> None:
    raw = header(descr, shape, fortran) + bytes(payload)
    try:
        array = npy.parse(raw)
    except ShardFormatError:
        return
    assert not array.dtype.hasobject
    assert array.nbytes == payload and array.shape == shape


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), prefix=st.sampled_from([b"", b"\x93NUMPY\x01\x00", b"\x93NUMPY\x03\x00"]))
def test_fuzzed_bytes_parse_or_raise_a_shard_format_error(data: bytes, prefix: bytes) -> None:
    try:
        array = npy.parse(prefix + data)
    except ShardFormatError:
        return
    assert array.nbytes <= len(data)
