"""Per-document token counts in the index: written with the shards, read back bounded, refused when hostile."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamio.data.format.index import load_index, parse_index
from streamio.data.format.tokens import check_document, load_tokens, npy_tokens
from streamio.data.write.localfiles import local_file
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import DatasetError, IndexFormatError, ShardFormatError, StreamioError
from streamio.limits import MAX_DOCUMENT_TOKENS
from streamio.storage import Store

pytestmark = pytest.mark.timeout(60)


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def docs(lengths: list[int], dtype: str = "<u2") -> list[dict[str, Any]]:
    return [
        {"__key__": f"d{i:05d}", "npy": npy(np.arange(n, dtype=dtype)), "txt": "meta"} for i, n in enumerate(lengths)
    ]


@pytest.mark.parametrize("dtype", ["<u2", "<u4", "<i4", "<i8"])
def test_the_writer_records_each_documents_token_count(tmp_path: Path, dtype: str) -> None:
    lengths = [0, 5, 17, 3, 9]
    index = write_dataset(docs(lengths, dtype), f"file://{tmp_path}", spec=ShardSpec(max_count=2))
    assert index.token_counts("npy") == [(0, 5), (17, 3), (9,)]
    stored = json.loads((tmp_path / "index.json").read_text())
    assert [s["tokens"] for s in stored["shards"]] == [{"npy": [0, 5]}, {"npy": [17, 3]}, {"npy": [9]}]
    loaded = load_index(Store(f"file://{tmp_path}"))
    assert loaded.token_counts("npy") == [(0, 5), (17, 3), (9,)]
    assert loaded.token_fields() == ("npy",)


def test_counts_survive_layout_sidecars(tmp_path: Path) -> None:
    write_dataset(docs([4, 6, 8]), f"file://{tmp_path}", spec=ShardSpec(max_count=2), inline_limit=1)
    assert load_index(Store(f"file://{tmp_path}")).token_counts("npy") == [(4, 6), (8,)]


def test_a_local_file_member_is_counted_from_its_header(tmp_path: Path) -> None:
    src = tmp_path / "doc.npy"
    src.write_bytes(npy(np.arange(70_000, dtype=np.uint32)))  # larger than the header read
    index = write_dataset([{"__key__": "a", "npy": local_file(str(src))}], f"file://{tmp_path / 'ds'}")
    assert index.token_counts("npy") == [(70_000,)]


def test_named_token_fields_are_counted_each(tmp_path: Path) -> None:
    samples = [
        {"__key__": "a", "ids.npy": npy(np.arange(3, dtype=np.int32)), "mask.npy": npy(np.ones(3, dtype=np.int32))},
        {"__key__": "b", "ids.npy": npy(np.arange(6, dtype=np.int32)), "mask.npy": npy(np.ones(6, dtype=np.int32))},
    ]
    index = write_dataset(samples, f"file://{tmp_path}")
    assert index.token_fields() == ("ids.npy", "mask.npy")
    assert index.token_counts("ids.npy") == [(3, 6)]


def test_a_shard_with_a_non_token_document_records_no_counts_and_packing_says_why(tmp_path: Path) -> None:
    samples = docs([3, 4]) + [{"__key__": "z", "npy": npy(np.zeros((2, 2), dtype=np.int32))}]
    index = write_dataset(samples, f"file://{tmp_path}", spec=ShardSpec(max_count=2))
    assert index.token_fields() == ()
    with pytest.raises(DatasetError, match=r"shard 'data-000001.tar' records no token counts for member 'npy'"):
        index.token_counts("npy")


def test_an_index_without_counts_is_still_readable(tmp_path: Path) -> None:
    write_dataset(docs([3, 4]), f"file://{tmp_path}")
    doc = json.loads((tmp_path / "index.json").read_text())
    for shard in doc["shards"]:
        del shard["tokens"]
    (tmp_path / "index.json").write_text(json.dumps(doc))
    index = load_index(Store(f"file://{tmp_path}"))
    assert index.samples == 2
    with pytest.raises(DatasetError, match=r"records no token counts .*write_dataset\(\) or `streamio shard`"):
        index.token_counts("npy")


def _index_with(tokens: Any) -> bytes:
    shard = {
        "path": "a.tar",
        "bytes": 4096,
        "samples": 2,
        "checksum": "crc32c:00000000",
        "offsets": [0, 1024, 2048],
        "crc32c": [0, 0],
        "tokens": tokens,
    }
    return json.dumps({"format": "streamio.dataset/1", "samples": 2, "keys": [], "shards": [shard]}).encode()


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        ({"npy": [1, -1]}, r"shard 'a.tar' sample 1: token count -1 of 'npy'"),
        ({"npy": [MAX_DOCUMENT_TOKENS + 1, 0]}, r"shard 'a.tar' sample 0: token count 1099511627777"),
        ({"npy": [True, 1]}, r"sample 0: token count True"),
        ({"npy": [1.0, 1]}, r"sample 0: token count 1.0"),
        ({"npy": [1]}, r"'tokens' 'npy' of shard 'a.tar' has 1 counts for 2 samples"),
        ({"npy": "12"}, r"has '12' counts for 2 samples"),
        ([1, 2], r"'tokens' of shard 'a.tar' is \[1, 2\], not an object"),
        ({f"f{i}": [1, 1] for i in range(17)}, r"not an object of at most 16 fields"),
        ({"a/b": [1, 1]}, r"names the field 'a/b'"),
    ],
)
def test_hostile_token_counts_are_refused_naming_shard_and_sample(tokens: Any, match: str) -> None:
    with pytest.raises(IndexFormatError, match=match):
        parse_index(_index_with(tokens), url="mem://ds/index.json")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@given(tokens=json_values | st.dictionaries(st.sampled_from(["npy", "x.npy", ""]), json_values, max_size=3))
def test_fuzzed_token_fields_parse_or_raise_an_index_error(tokens: Any) -> None:
    try:
        index = parse_index(_index_with(tokens), url="mem://ds/index.json")
    except IndexFormatError:
        return
    for field in index.token_fields():
        assert all(type(c) is int and 0 <= c <= MAX_DOCUMENT_TOKENS for s in index.token_counts(field) for c in s)


@given(data=st.binary(max_size=200), size=st.integers(0, 400))
def test_npy_header_parsing_is_bounded_and_never_raises(data: bytes, size: int) -> None:
    assert npy_tokens(data, size) is None or npy_tokens(data, size) >= 0


def test_a_document_that_disagrees_with_the_index_names_shard_and_sample() -> None:
    with pytest.raises(
        ShardFormatError, match=r"shard 'a.tar' sample 3: member 'npy' holds 4 tokens, but the index says 5"
    ):
        check_document(np.arange(4), expected=5, shard="a.tar", sample=3, member="npy")
    with pytest.raises(ShardFormatError, match=r"member 'npy' is float64\(4,\), not a 1-D integer token array"):
        check_document(np.zeros(4), expected=4, shard="a.tar", sample=3, member="npy")
    with pytest.raises(StreamioError, match=r"is bytes, not a 1-D integer"):
        check_document(b"x", expected=4, shard="a.tar", sample=3, member="npy")


@given(
    dtype=st.sampled_from(["<u2", "<u4", "<i4", "<i8", "|u1", ">u2", "<f4"]),
    shape=st.sampled_from([(0,), (1,), (7,), (300,), (2, 3), ()]),
)
def test_load_tokens_reads_what_numpy_wrote_as_numpy_does(dtype: str, shape: tuple[int, ...]) -> None:
    array = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    got = load_tokens(npy(array))
    assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)


@given(head=st.sampled_from([b"", b"\x93NUMPY\x01\x00", b"\x93NUMPY\x02\x00", b"\x93NUMPY\x01\x00v\x00"]),
       data=st.binary(max_size=300))
def test_load_tokens_on_garbage_raises_what_the_packer_names(head: bytes, data: bytes) -> None:
    try:
        load_tokens(head + data)
    except (ValueError, OSError, EOFError):
        pass


@pytest.mark.parametrize(("compression", "where"), [(None, "file"), ("zstd", "file"), (None, "s3")])
def test_indexing_existing_shards_records_the_token_counts_a_writer_records(  # type: ignore[no-untyped-def]
    tmp_path, request, compression, where
) -> None:
    """`streamio index` of token shards written by anything: Pack can plan them (their counts from the .npy headers)."""
    from streamio.data.write.indexer import build_index
    from streamio.data.write.writer import ShardSpec, write_dataset
    from streamio.storage import Store

    if where == "s3":  # streamed from moto over HTTP in chunks, not read from a file
        s3 = request.getfixturevalue("s3")
        store = Store(s3.url("tok"), s3.storage_options())
    else:
        store = Store(str(tmp_path))
    docs = [{"__key__": f"d{i:03d}", "npy": np.arange(1 + i * 7, dtype=np.uint16), "txt": "x"} for i in range(30)]
    written = write_dataset(docs, store, spec=ShardSpec(max_count=8, compression=compression))
    scanned = build_index(store, "data-*")
    assert scanned.token_counts("npy") == written.token_counts("npy")
    assert scanned.token_fields() == ("npy",) and scanned.fingerprint == written.fingerprint


def test_a_sample_with_more_token_fields_than_an_index_holds_still_makes_a_readable_index(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """20 one-dimensional .npy fields a sample: the index recorded all 20, then refused itself on load (16 at most)."""
    from streamio.data.format.index_schema import MAX_TOKEN_FIELDS
    from streamio.data.write.writer import write_dataset
    from streamio.storage import Store

    fields = [f"f{j:02d}.npy" for j in range(MAX_TOKEN_FIELDS + 4)]
    write_dataset([{"__key__": f"d{i}", **{f: np.arange(i + 1, dtype=np.uint16) for f in fields}} for i in range(3)],
                  str(tmp_path))
    index = load_index(Store(str(tmp_path)))
    assert index.token_fields() == tuple(fields[:MAX_TOKEN_FIELDS])
    assert index.token_counts(fields[0]) == [(1, 2, 3)]


def test_verify_names_a_document_whose_tokens_disagree_with_the_index(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`streamio verify --deep` reads every byte: the token counts planning relies on are checked against them too."""
    from streamio.data.write.verify import validate
    from streamio.data.write.writer import ShardSpec, write_dataset
    from streamio.storage import Store

    docs = [{"__key__": f"d{i:03d}", "npy": np.arange(5 + i, dtype=np.uint16)} for i in range(6)]
    write_dataset(docs, str(tmp_path), spec=ShardSpec(max_count=3))
    store = Store(str(tmp_path))
    assert validate(store, load_index(store), deep=True).ok
    doc = json.loads((tmp_path / "index.json").read_text())
    doc["shards"][1]["tokens"]["npy"][2] = 99  # sample d005 holds 10 tokens
    (tmp_path / "index.json").write_text(json.dumps(doc))
    report = validate(store, load_index(store), deep=True)
    (bad,) = report.bad
    assert bad.path == doc["shards"][1]["path"]
    assert "sample 2 ('d005')" in bad.reason and "10 tokens, the index says 99" in bad.reason


@pytest.mark.parametrize("cut", [100, 600, 2000])
def test_an_index_scan_of_a_shard_cut_inside_a_npy_member_names_the_truncation(cut: int) -> None:
    """The scan keeps a .npy member's head and passes over the rest: a shard that ends there is refused, named."""
    import tarfile

    from streamio.data.write.indexer import scan_chunks
    from streamio.errors import ShardFormatError

    buf = io.BytesIO()
    np.save(buf, np.arange(2000, dtype=np.uint16))
    payload = buf.getvalue()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("d0.npy")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    data = raw.getvalue()[: 512 + cut]  # the header, then part of the member's data
    with pytest.raises(ShardFormatError, match=r"inside member 'd0\.npy'.*truncated"):
        scan_chunks([data], url="s3://b/t.tar", path="t.tar")
