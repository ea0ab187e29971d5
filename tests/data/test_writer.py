"""writer.py: deterministic shards, size/count limits, index last, errors, S3, webdataset interop."""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from streamio.data.format.index import load_index, write_index
from streamio.data.format.layout import INDEX_NAME, WRITING_NAME
from streamio.data.format.samples import iter_samples
from streamio.data.write.indexer import build_index
from streamio.data.write.sources import samples_from_directory, samples_from_jsonl, samples_from_shards
from streamio.data.write.writer import DatasetWriter, ShardSpec, write_dataset
from streamio.errors import BucketNotFoundError, ConfigError, DatasetError
from streamio.storage import Store
from streamio.testing import S3Endpoint


def make_samples(n: int, size: int = 1000) -> list[dict]:
    return [{"__key__": f"{i:06d}", "bin": bytes([i % 256]) * size, "cls": str(i % 7)} for i in range(n)]


def read_all(store: Store) -> list[dict]:
    index = load_index(store)
    out: list[dict] = []
    for i, shard in enumerate(index.shards):
        out += iter_samples(store.iter_bytes(shard.path), url=store.url(shard.path), layout=index.layout(i, store),
                            compression=shard.compression)
    return out


def digests(root) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_same_input_gives_identical_shards(tmp_path, compression: str | None) -> None:
    for run in ("a", "b"):
        write_dataset(
            make_samples(30), str(tmp_path / run), spec=ShardSpec(max_count=8, compression=compression),
        )
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    assert len(digests(tmp_path / "a")) == 5  # 4 shards + index.json


def test_field_order_does_not_change_the_bytes(tmp_path) -> None:
    write_dataset([{"__key__": "k", "a": b"1", "b": b"2"}], str(tmp_path / "x"))
    write_dataset([{"b": b"2", "__key__": "k", "a": b"1"}], str(tmp_path / "y"))
    assert digests(tmp_path / "x") == digests(tmp_path / "y")


def test_max_bytes_and_max_count_split_shards() -> None:
    store = Store(f"memory://w-{uuid.uuid4().hex}")
    samples = make_samples(20, size=10_000)  # 10,752 bytes of tar each
    index = write_dataset(samples, store, spec=ShardSpec(max_bytes=50_000))
    assert index.sample_counts() == [4, 4, 4, 4, 4]
    assert all(s.bytes <= 50_000 for s in index.shards)
    assert [s.path for s in index.shards] == [f"data-{i:06d}.tar" for i in range(5)]
    store2 = Store(f"memory://w-{uuid.uuid4().hex}")
    spec = ShardSpec(max_bytes=10**9, max_count=6, prefix="train")
    assert write_dataset(samples, store2, spec=spec).sample_counts() == [6, 6, 6, 2]
    assert load_index(store2).shards[0].path == "train-000000.tar"
    assert read_all(store2) == [{**s, "cls": s["cls"].encode()} for s in samples]


def test_a_sample_larger_than_max_bytes_gets_its_own_shard() -> None:
    store = Store(f"memory://w-{uuid.uuid4().hex}")
    samples = [{"__key__": "a", "x": b"1"}, {"__key__": "b", "x": bytes(100_000)}, {"__key__": "c", "x": b"3"}]
    assert write_dataset(samples, store, spec=ShardSpec(max_bytes=20_000)).sample_counts() == [1, 1, 1]


def test_index_records_what_the_shards_hold(tmp_path) -> None:
    index = write_dataset(make_samples(10), str(tmp_path), spec=ShardSpec(max_count=4, compression="zstd"))
    assert index.compression == "zstd" and index.keys == ("bin", "cls") and index.samples == 10
    store = Store(str(tmp_path))
    rebuilt = load_index(store)
    assert rebuilt.fingerprint == index.fingerprint
    for i, shard in enumerate(rebuilt.shards):
        assert os.path.getsize(tmp_path / shard.path) == shard.bytes
        assert rebuilt.layout(i, store) == index.layout(i, store)


def _failing(n: int) -> Iterator[dict]:
    yield from make_samples(n)
    raise RuntimeError("source broke")


def test_no_index_is_written_when_writing_fails(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="source broke"):
        write_dataset(_failing(25), str(tmp_path), spec=ShardSpec(max_count=10))
    assert (tmp_path / "data-000000.tar").exists()  # finished shards may be there ...
    assert not (tmp_path / INDEX_NAME).exists()  # ... but the prefix is not a dataset


def test_index_is_the_last_object_written() -> None:
    store = Store(f"memory://w-{uuid.uuid4().hex}")
    order: list[str] = []
    real_put = store.put

    def recording_put(path: str, data: bytes, **kw: object) -> str | None:
        order.append(path)
        return real_put(path, data, **kw)  # type: ignore[arg-type]

    store.put = recording_put  # type: ignore[method-assign]
    write_dataset(make_samples(12), store, spec=ShardSpec(max_count=3))
    assert order[0] == WRITING_NAME and order[-1] == INDEX_NAME  # the marker first, the index last
    assert sorted(order[1:-1]) == [f"data-{i:06d}.tar" for i in range(4)]
    assert not store.exists(WRITING_NAME)  # removed once the index is committed


def test_existing_dataset_is_not_overwritten_by_accident(tmp_path) -> None:
    write_dataset(make_samples(3), str(tmp_path))
    with pytest.raises(DatasetError, match="already holds a dataset.*overwrite=True"):
        write_dataset(make_samples(3), str(tmp_path))
    index = write_dataset(make_samples(5), str(tmp_path), overwrite=True)
    assert load_index(Store(str(tmp_path))).samples == index.samples == 5


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([], "no samples were written .* the source is empty"),
        ([{"__key__": "a.b", "x": b""}], "has a dot in its last part"),
        ([{"__key__": "../a", "x": b""}], "'..' component"),
        ([{"__key__": "/abs", "x": b""}], "absolute path"),
        ([{"__key__": "k"}], "has no fields"),
        ([{"__key__": "k", "x": b"1"}, {"__key__": "k", "y": b"2"}], "repeats the previous sample's key"),
        ([{"__key__": "k", "x": 1.5}], "field 'x' is a float"),
        ([{"__key__": "k", "a/b": b""}], "not a valid extension"),
        ([{"__key__": "k", "npy": np.array([{}, 1], dtype=object)}], "array of Python objects"),
        ([{"__key__": "k", "bin": np.arange(3)}], "field 'bin' is a ndarray.*a numpy array for a '.npy' field"),
    ],
)
def test_bad_samples_get_a_clear_error(samples: list[dict], message: str) -> None:
    store = Store(f"memory://w-{uuid.uuid4().hex}")
    with pytest.raises(DatasetError, match=message):
        write_dataset(samples, store)
    assert not store.exists(INDEX_NAME)


def test_a_numpy_array_in_a_npy_field_is_stored_as_npy_with_its_token_count() -> None:
    store = Store(f"memory://w-{uuid.uuid4().hex}")
    tokens = np.arange(17, dtype=np.uint16)
    index = write_dataset([{"__key__": "doc", "tokens.npy": tokens}], store)
    (got,) = read_all(store)
    assert np.array_equal(np.load(io.BytesIO(got["tokens.npy"]), allow_pickle=False), tokens)
    assert index.token_counts("tokens.npy") == [(17,)]


def test_values_are_encoded_by_type() -> None:
    store = Store(f"memory://w-{uuid.uuid4().hex}")
    write_dataset([{"txt": "héllo", "cls": 3, "json": {"a": [1, 2]}, "bin": bytearray(b"\x00\x01")}], store)
    (got,) = read_all(store)
    assert got == {
        "__key__": "000000000", "txt": "héllo".encode(), "cls": b"3", "json": b'{"a":[1,2]}', "bin": b"\x00\x01"
    }


def test_upload_errors_surface_and_no_index_is_written(s3: S3Endpoint) -> None:
    store = Store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/ds", s3.storage_options())
    with pytest.raises(BucketNotFoundError):
        write_dataset(make_samples(6), store, spec=ShardSpec(max_count=2))


def test_round_trip_on_s3_with_sidecars(s3: S3Endpoint) -> None:
    store = Store(s3.url("ds"), s3.storage_options())
    samples = make_samples(40, size=3000)
    index = write_dataset(samples, store, spec=ShardSpec(max_count=10, compression="zstd"), inline_limit=0)
    assert [o.path for o in store.list("_layout")] == [f"_layout/data-{i:06d}.tar.zst.bin" for i in range(4)]
    assert read_all(store) == [{**s, "cls": s["cls"].encode()} for s in samples]
    assert load_index(store).fingerprint == index.fingerprint


# --------------------------------------------------------------------------- sources
def test_directory_source_groups_by_basename(tmp_path) -> None:
    (tmp_path / "v1.2").mkdir()
    for name, data in [("v1.2/a.jpg", b"J"), ("v1.2/a.seg.png", b"P"), ("b.txt", b"T"), (".DS_Store", b"junk")]:
        (tmp_path / name).write_bytes(data)
    assert list(samples_from_directory(str(tmp_path))) == [
        {"__key__": "b", "txt": b"T"},
        {"__key__": "v1.2/a", "jpg": b"J", "seg.png": b"P"},
    ]
    shuffled = [s["__key__"] for s in samples_from_directory(str(tmp_path), shuffle_seed=1)]
    assert sorted(shuffled) == ["b", "v1.2/a"]
    assert shuffled == [s["__key__"] for s in samples_from_directory(str(tmp_path), shuffle_seed=1)]


@pytest.mark.parametrize("case", ["empty", "no-extension", "unreadable"])
def test_directory_source_bad_inputs(tmp_path, case: str) -> None:
    if case == "no-extension":
        (tmp_path / "README").write_bytes(b"x")
        message = "README has no extension"
    elif case == "unreadable":
        (tmp_path / "ok.txt").write_bytes(b"x")
        os.symlink(tmp_path / "gone", tmp_path / "broken.jpg")  # root reads anything chmod'ed; this it cannot
        message = r"broken.jpg is a symbolic link to .*gone, which does not exist"
    else:
        message = "holds no files: nothing to shard"
    with pytest.raises(DatasetError, match=message):
        list(samples_from_directory(str(tmp_path)))


def test_jsonl_source_reads_named_files(tmp_path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "1.jpg").write_bytes(b"JPEG")
    lines = [{"__key__": "s1", "jpg": "img/1.jpg", "txt": "a caption", "cls": 4, "meta": {"w": 2}}, {"txt": "no key"}]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert list(samples_from_jsonl(str(path), split_fields=True)) == [
        {"__key__": "s1", "jpg": b"JPEG", "txt": "a caption", "cls": "4", "meta": '{"w":2}'},
        {"txt": "no key"},
    ]
    with pytest.raises(DatasetError, match=r"cannot read .*a caption"):
        list(samples_from_jsonl(str(path), file_fields=["txt"], split_fields=True))
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2 is a JSON list, not an object"):
        list(samples_from_jsonl(str(tmp_path / "bad.jsonl")))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="holds no samples"):
        list(samples_from_jsonl(str(tmp_path / "empty.jsonl")))


def test_shard_source_reshards_existing_shards(tmp_path) -> None:
    write_dataset(make_samples(9), str(tmp_path / "src"), spec=ShardSpec(max_count=4, compression="zstd"))
    got = list(samples_from_shards(Store(str(tmp_path / "src")), "data-{000000..000002}.tar.zst"))
    assert [s["__key__"] for s in got] == [f"{i:06d}" for i in range(9)]


# --------------------------------------------------------------------------- webdataset interop
# webdataset 1.0.2 leaves shard files open (ResourceWarning at garbage collection): not ours.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_webdataset_reads_our_shards(tmp_path) -> None:
    import webdataset as wds

    samples = [
        {"__key__": f"d.x/{i:04d}", "bin": bytes([i]) * (i * 300), "seg.png": b"P" * i, "txt": b""} for i in range(25)
    ]
    write_dataset(samples, str(tmp_path), spec=ShardSpec(max_count=10))
    ds = wds.WebDataset(str(tmp_path / "data-{000000..000002}.tar"), shardshuffle=False)
    got = [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in ds]
    assert got == samples


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_webdataset_shardwriter_shards_are_indexed_and_read(tmp_path) -> None:
    import webdataset as wds

    samples = [{"__key__": f"k{i:04d}", "bin": os.urandom(i * 100), "txt": f"t{i}".encode()} for i in range(23)]
    with wds.ShardWriter(str(tmp_path / "shard-%06d.tar"), maxcount=10, verbose=0) as sink:
        for s in samples:
            sink.write(s)
    store = Store(str(tmp_path))
    index = build_index(store, "shard-{000000..000002}.tar")
    assert index.sample_counts() == [10, 10, 3] and index.keys == ("bin", "txt")
    write_index(store, index)
    assert read_all(store) == samples


def test_class_form_counts_and_refuses_writes_after_close() -> None:
    store = Store(f"memory://w-{uuid.uuid4().hex}")
    with DatasetWriter(store, spec=ShardSpec(max_count=2, compression="zstd", prefix="p")) as writer:
        for s in make_samples(5):
            writer.write(s)
        assert writer.samples_written == 5 and writer.bytes_written > 0
    assert writer.index is not None and writer.index.sample_counts() == [2, 2, 1]
    assert writer.close() is writer.index  # idempotent
    with pytest.raises(DatasetError, match="is closed"):
        writer.write(make_samples(1)[0])
    with pytest.raises(ValueError, match="compression must be one of"):
        DatasetWriter(store, spec=ShardSpec(compression="gzip"))


def test_an_exception_inside_the_writer_block_writes_no_index() -> None:
    store = Store(f"memory://w-{uuid.uuid4().hex}")
    with pytest.raises(KeyError), DatasetWriter(store, spec=ShardSpec(max_count=1)) as writer:
        writer.write(make_samples(1)[0])
        writer.write(make_samples(2)[1])
        raise KeyError("user code failed")
    assert not store.exists(INDEX_NAME)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"compression": "gzip"}, "compression must be one of"),
        ({"max_bytes": 0}, r"max_bytes \(0\), max_count \(None\) and max_sample_bytes \(1073741824\) must be pos"),
        ({"max_count": 0}, r"max_bytes \(256000000\), max_count \(0\) and max_sample_bytes"),
        ({"max_sample_bytes": 0}, r"and max_sample_bytes \(0\) must be positive"),
        ({"prefix": "a/b"}, "prefix 'a/b' must be a plain file-name prefix"),
        ({"prefix": ".."}, "prefix '..' must be a plain file-name prefix"),
    ],
)
def test_shard_spec_is_checked_when_made(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ShardSpec(**fields)  # type: ignore[arg-type]


def test_shard_spec_names_shards() -> None:
    assert ShardSpec().shard_path(7) == "data-000007.tar"
    assert ShardSpec(compression="zstd", prefix="train").shard_path(123456) == "train-123456.tar.zst"
