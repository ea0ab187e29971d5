"""index.py: schema load/validate errors, sidecars, fingerprint, build_index, validate, ranged reads."""

from __future__ import annotations

import io
import json
import tarfile
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.checksum import checksum_bytes
from streamio.data.format.index import DatasetIndex, load_index, make_index, write_index
from streamio.data.format.layout import FORMAT, INDEX_NAME, SampleLayout, ShardInfo
from streamio.data.format.patterns import split_pattern
from streamio.data.format.samples import SampleSpan, iter_samples
from streamio.data.write.indexer import build_index, scan_chunks
from streamio.data.write.verify import validate
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import (
    CorruptDataError,
    IndexFormatError,
    IndexNotFoundError,
    ObjectNotFoundError,
    ShardFormatError,
    WriteConflictError,
)
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint


def mem() -> Store:
    return Store(f"memory://ix-{uuid.uuid4().hex}")


def samples(n: int, size: int = 2000) -> list[dict]:
    return [{"__key__": f"{i:05d}", "bin": bytes([i % 256]) * size, "txt": f"t{i}".encode()} for i in range(n)]


def doc(store: Store) -> dict:
    return json.loads(store.read(INDEX_NAME))


# --------------------------------------------------------------------------- load errors
def test_missing_index_says_how_to_make_one() -> None:
    store = mem()
    with pytest.raises(IndexNotFoundError, match=r"no index.json at memory://ix-.*/index.json.*`streamio index memory://ix-"):
        load_index(store)
    with pytest.raises(FileNotFoundError):  # catchable as the builtin too
        load_index(store)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d.update(format="streamio.dataset/2"),
            r"format 'streamio.dataset/2'; this streamio reads 'streamio.dataset/1'",
        ),
        (lambda d: d.pop("format"), "format None"),
        (lambda d: d.update(samples=999), "'samples' is 999 but the shards hold 10"),
        (lambda d: d["shards"][0].update(path="../escape.tar"), "not a plain relative name below the dataset"),
        (lambda d: d["shards"][0].update(bytes=-1), r"not an integer in \[0, 2\*\*63\)"),
        (lambda d: d["shards"][0].update(checksum="md5:abc"), "not 'crc32c:<8 hex digits>'"),
        (lambda d: d["shards"][0].update(offsets=[0, 1]), "has 4 samples but 2 offsets"),
        (lambda d: d["shards"][0].update(offsets=[0, 5, 3, 9, 20]), "not increasing"),
        (lambda d: d["shards"][0].update(offsets=[0, 5, 5, 9, 20]), "not increasing"),
        (lambda d: d["shards"][0].update(crc32c=["a", 1, 2, 3]), "not all 32/64-bit integers"),
        (lambda d: d.update(shards={}), "'shards' is not a list"),
    ],
)
def test_invalid_index_fields_are_refused(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    store = mem()
    write_dataset(samples(10), store, spec=ShardSpec(max_count=4))
    d = doc(store)
    mutate(d)
    store.put(INDEX_NAME, json.dumps(d).encode())
    with pytest.raises(IndexFormatError, match=message):
        load_index(store)


def test_not_json_is_an_index_format_error() -> None:
    store = mem()
    store.put(INDEX_NAME, b"<html>oops</html>")
    with pytest.raises(IndexFormatError, match="is not valid JSON"):
        load_index(store)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    store = mem()
    write_dataset(samples(3), store)
    d = doc(store)
    d["future_field"] = {"x": 1}
    d["shards"][0]["future"] = True
    store.put(INDEX_NAME, json.dumps(d).encode())
    assert load_index(store).samples == 3


# --------------------------------------------------------------------------- layout and sidecars
def test_inline_and_sidecar_layouts_agree_and_have_the_same_fingerprint() -> None:
    a, b = mem(), mem()
    ia = write_dataset(samples(12), a, spec=ShardSpec(max_count=5))
    ib = write_dataset(samples(12), b, spec=ShardSpec(max_count=5), inline_limit=0)
    assert "offsets" in doc(a)["shards"][0] and "layout" in doc(b)["shards"][0] and "offsets" not in doc(b)["shards"][0]
    la, lb = load_index(a), load_index(b)
    assert la.fingerprint == lb.fingerprint == ia.fingerprint == ib.fingerprint
    assert doc(a)["fingerprint"] == la.fingerprint
    assert [la.layout(i, a) for i in range(3)] == [lb.layout(i, b) for i in range(3)]
    assert la.layout(1, a).offsets[0] == 0 and len(la.layout(2, a).offsets) == 3


def test_sidecars_are_read_once_and_checked() -> None:
    store = mem()
    write_dataset(samples(6), store, spec=ShardSpec(max_count=3), inline_limit=0)
    index = load_index(store)
    reads: list[str] = []
    real_read = store.read
    store.read = lambda p, *a: reads.append(p) or real_read(p, *a)  # type: ignore[method-assign]
    first = index.layout(1, store)
    assert index.layout(1, store) is first and reads == ["_layout/data-000001.tar.bin"]
    store.read = real_read  # type: ignore[method-assign]
    blob = bytearray(store.read("_layout/data-000000.tar.bin"))
    blob[20] ^= 1
    store.put("_layout/data-000000.tar.bin", bytes(blob))
    with pytest.raises(CorruptDataError, match=r"_layout/data-000000.tar.bin does not match its checksum"):
        load_index(store).layout(0, store)


def test_a_loaded_index_pickles_with_its_cached_layouts() -> None:
    import pickle

    store = mem()
    write_dataset(samples(6), store, spec=ShardSpec(max_count=3), inline_limit=0)
    index = load_index(store)
    index.layout(1, store)
    clone = pickle.loads(pickle.dumps(index))  # DataLoader workers receive it this way
    assert clone == index and clone.fingerprint == index.fingerprint
    assert clone.layout(1, store) == index.layout(1, store) and clone.layout(0, store) == index.layout(0, store)


def test_fingerprint_changes_with_the_data() -> None:
    base = [ShardInfo("a.tar", 10, 1, "crc32c:00000001")]
    other = [ShardInfo("a.tar", 10, 1, "crc32c:00000002")]
    assert make_index(base, {}, []).fingerprint == make_index(list(base), {}, ["x"]).fingerprint
    assert make_index(base, {}, []).fingerprint != make_index(other, {}, []).fingerprint


def test_a_5000_shard_index_stays_small() -> None:
    """The index of 5,000 shards x 2,500 samples keeps per-sample data in sidecars (loads in ms)."""
    shards = [ShardInfo(f"data-{i:06d}.tar", 256_000_000, 2500, "crc32c:0123abcd") for i in range(5000)]
    sidecars = {i: (f"_layout/{s.path}.bin", "crc32c:00000000") for i, s in enumerate(shards)}
    index = DatasetIndex(tuple(shards), 5000 * 2500, ("jpg",), None, _sidecars=sidecars)
    store = mem()
    d = {"format": FORMAT, "samples": index.samples, "keys": ["jpg"], "compression": None, "shards": [
        {"path": s.path, "bytes": s.bytes, "samples": s.samples, "checksum": s.checksum,
         "layout": f"_layout/{s.path}.bin", "layout_checksum": "crc32c:00000000"} for s in shards]}
    store.put(INDEX_NAME, json.dumps(d).encode())
    assert len(store.read(INDEX_NAME)) < 1_000_000
    loaded = load_index(store)
    assert loaded.samples == 12_500_000 and loaded.fingerprint == index.fingerprint


# --------------------------------------------------------------------------- build_index
def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_build_index_of_foreign_shards_matches_what_the_writer_records() -> None:
    store = mem()
    ours = write_dataset(samples(30, size=777), store, spec=ShardSpec(max_count=7))
    store.delete(INDEX_NAME)
    built = build_index(store, ["data-{000000..000002}.tar", "data-00000[34].tar"], concurrency=3)
    assert built.fingerprint == ours.fingerprint
    assert [built.layout(i, store) for i in range(5)] == [ours.layout(i, store) for i in range(5)]
    assert build_index(store).fingerprint == ours.fingerprint  # no pattern: every .tar below the root


_member_names = st.lists(
    st.tuples(
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/.\0"), min_size=1, max_size=70),
        st.sampled_from(["jpg", "cls", "seg.png", "ü"]),
        st.one_of(st.binary(max_size=1500), st.integers(0, 20_000).map(bytes)),
    ),
    min_size=1,
    max_size=15,
)


@settings(max_examples=40)
@given(
    members=_member_names,
    fmt=st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    chunk=st.integers(100, 5000),
    data=st.data(),
)
def test_scanning_foreign_tars_in_any_chunking_gives_layouts_that_read_back(members, fmt, chunk, data) -> None:  # type: ignore[no-untyped-def]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for key, ext, payload in members:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    raw = buf.getvalue()
    pieces = [raw[i : i + chunk] for i in range(0, len(raw), chunk)]
    expected = list(iter_samples(pieces, url="t.tar", handler=lambda e: True))  # duplicates skipped the same way
    try:
        shard, layout, _, _ = scan_chunks(pieces, url="t.tar", path="t.tar")
    except ShardFormatError as exc:  # a repeated field: the indexer refuses it, naming it
        assert "repeats field" in str(exc)
        return
    assert shard.bytes == len(raw) and shard.samples == len(expected)
    assert shard.checksum == checksum_bytes(raw)
    k = data.draw(st.integers(0, shard.samples))
    tail = [raw[layout.offsets[k] :][i : i + chunk] for i in range(0, len(raw), chunk)]
    got = iter_samples(tail, url="t.tar", span=SampleSpan(layout.offsets[k], k), layout=layout)
    assert list(got) == expected[k:]


def test_build_index_of_per_sample_zstd_shards_and_refusal_of_whole_file_zstd() -> None:
    import zstandard

    store = mem()
    ours = write_dataset(samples(9, size=3000), store, spec=ShardSpec(max_count=4, compression="zstd"))
    store.delete(INDEX_NAME)
    built = build_index(store)
    assert built.fingerprint == ours.fingerprint and built.compression == "zstd"
    assert [built.layout(i, store) for i in range(3)] == [ours.layout(i, store) for i in range(3)]
    whole = zstandard.ZstdCompressor().compress(_tar([("a.txt", b"1"), ("b.txt", b"2")]))
    store.put("foreign.tar.zst", whole)
    with pytest.raises(
        ShardFormatError,
        match=r"frame at byte 0 holds 2 samples and the end of the archive; .*one frame per sample",
    ):
        build_index(store, "foreign.tar.zst")
    store.put("cut.tar.zst", store.read("data-000000.tar.zst")[:-5])
    with pytest.raises(ShardFormatError, match="ends inside the zstd frame"):
        build_index(store, "cut.tar.zst")


def test_build_index_with_tarfile_shards_and_directories() -> None:
    store = mem()
    store.put("a/s-0.tar", _tar([("x/1.jpg", b"J" * 600), ("x/1.cls", b"1"), ("x/2.jpg", b""), ("y.txt", b"z")]))
    index = build_index(store, "a/s-{0..0}.tar")
    write_index(store, index)
    layout = load_index(store).layout(0, store)
    assert index.sample_counts() == [3] and index.keys == ("cls", "jpg", "txt")
    data = store.read("a/s-0.tar")
    got = list(iter_samples([data[layout.offsets[1] :]], url="a/s-0.tar", span=SampleSpan(layout.offsets[1], 1),
                            layout=layout))
    assert got == [{"__key__": "x/2", "jpg": b""}, {"__key__": "y", "txt": b"z"}]


def test_build_index_names_a_non_tar_shard() -> None:
    store = mem()
    store.put("s-0.tar", _tar([("a.txt", b"ok")]))
    store.put("s-1.tar", b"this is a text file, not a tar " * 40)
    with pytest.raises(ShardFormatError, match=r"s-1.tar.*not a valid tar header"):
        build_index(store, "s-{0..1}.tar")


def test_build_index_errors_for_no_match_and_missing_shard() -> None:
    store = mem()
    store.put("s-0.tar", _tar([("a.txt", b"ok")]))
    with pytest.raises(ObjectNotFoundError, match="no shards match 'nothing-\\*.tar' under memory://"):
        build_index(store, "nothing-*.tar")
    with pytest.raises(FileNotFoundError):
        build_index(store, "s-{0..1}.tar")


def test_split_pattern() -> None:
    assert split_pattern("s3://b/ds/shard-{000000..000099}.tar") == ("s3://b/ds", "shard-{000000..000099}.tar")
    assert split_pattern("/data/ds/*/x-*.tar") == ("/data/ds", "*/x-*.tar")
    assert split_pattern("s3://b/ds") == ("s3://b/ds", None)
    assert split_pattern("gs://b/ds/one.tar") == ("gs://b/ds", "one.tar")


# --------------------------------------------------------------------------- validate
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_validate_catches_flipped_byte_truncation_and_missing_shard(tmp_path, compression: str | None) -> None:
    store = Store(str(tmp_path))
    write_dataset(samples(20), store, spec=ShardSpec(max_count=5, compression=compression))
    index = load_index(store)
    assert validate(store, index, deep=True).ok
    names = [s.path for s in index.shards]
    flipped = bytearray((tmp_path / names[0]).read_bytes())
    offsets = index.layout(0, store).offsets
    flipped[(offsets[2] + offsets[3]) // 2] ^= 0x10
    (tmp_path / names[0]).write_bytes(bytes(flipped))
    (tmp_path / names[1]).write_bytes((tmp_path / names[1]).read_bytes()[:-1024])
    (tmp_path / names[2]).unlink()
    shallow = validate(store, index)
    assert [b.path for b in shallow.bad] == names[1:3]  # sizes only: the flipped byte needs a deep check
    report = validate(store, index, deep=True)
    reasons = {b.path: b.reason for b in report.bad}
    assert list(reasons) == names[:3] and not report.ok
    assert "sample 2" in reasons[names[0]] and "CRC32C" in reasons[names[0]]
    assert "index says" in reasons[names[1]] and reasons[names[2]].startswith("missing")


def test_deep_validate_catches_a_changed_trailer(tmp_path) -> None:
    store = Store(str(tmp_path))
    write_dataset(samples(3), store)
    raw = bytearray((tmp_path / "data-000000.tar").read_bytes())
    raw[-1] = 1  # outside every sample: only the whole-shard checksum sees it
    (tmp_path / "data-000000.tar").write_bytes(bytes(raw))
    (bad,) = validate(store, load_index(store), deep=True).bad
    assert "checksum" in bad.reason and "corrupt" in bad.reason


# --------------------------------------------------------------------------- one ranged GET over real HTTP
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_starting_at_sample_k_is_one_ranged_get_at_its_offset(s3: S3Endpoint, compression: str | None) -> None:
    write_dataset(
        samples(12, size=5000), Store(s3.url("ds"), s3.storage_options()), spec=ShardSpec(compression=compression),
    )
    with FaultProxy(s3.endpoint_url) as proxy:
        store = Store(s3.url("ds"), s3.storage_options(proxy.endpoint_url))
        index = load_index(store)
        shard, layout = index.shards[0], index.layout(0, store)
        proxy.clear()
        k = 7
        start, end = layout.byte_range(k, shard.samples)
        got = list(iter_samples(store.iter_bytes(shard.path, start, end), url=store.url(shard.path),
                                span=SampleSpan(start, k), layout=layout, compression=compression))
        assert [s["__key__"] for s in got] == [f"{i:05d}" for i in range(k, 12)]
        gets = [r for r in proxy.log() if shard.path in r.path]
        assert [(r.method, r.range) for r in gets] == [("GET", f"bytes={start}-{end - 1}")]
        assert gets[0].response_bytes == end - start


def test_a_corrupted_ranged_read_is_caught_by_the_sample_crc(s3: S3Endpoint) -> None:
    write_dataset(samples(6, size=5000), Store(s3.url("ds"), s3.storage_options()))
    with FaultProxy(s3.endpoint_url) as proxy:
        store = Store(s3.url("ds"), s3.storage_options(proxy.endpoint_url))
        index = load_index(store)
        layout = index.layout(0, store)
        proxy.corrupt_next(1, 9000, method="GET", path_contains="data-000000")
        start, end = layout.byte_range(2, 6)
        with pytest.raises(CorruptDataError, match=r"sample 3 .* fails its CRC32C"):
            list(iter_samples(store.iter_bytes("data-000000.tar", start, end), url="data-000000.tar",
                              span=SampleSpan(start, 2), layout=layout))


@pytest.mark.parametrize("kind", ["file", "memory", "s3"])
def test_a_create_only_index_write_never_replaces_one(kind: str, tmp_path, request: pytest.FixtureRequest) -> None:
    if kind == "s3":
        s3: S3Endpoint = request.getfixturevalue("s3")
        store = Store(s3.url("ds"), s3.storage_options())
    else:
        store = Store(str(tmp_path / "ds")) if kind == "file" else mem()
    ten = write_dataset(samples(10, 10), store, spec=ShardSpec(max_count=1))
    five = make_index(ten.shards[:5], {i: ten.layout(i, store) for i in range(5)}, ten.keys)
    with pytest.raises(WriteConflictError, match="index.json"):
        write_index(store, five, mode="create")
    assert load_index(store) == ten
    write_index(store, five, mode="overwrite")
    assert load_index(store) == five


# --------------------------------------------------------------------------- verify covers the whole shard
@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 6), k=st.integers(1, 5), compression=st.sampled_from([None, "zstd"]), head=st.booleans())
def test_verify_fails_an_index_listing_fewer_samples_than_the_shard_holds(
    n: int, k: int, compression: str | None, head: bool
) -> None:
    """Issue 23: bytes outside the indexed samples were never checked, so a short index passed `verify`."""
    k = min(k, n - 1)
    store = mem()
    full = write_dataset(samples(n, 100), store, spec=ShardSpec(compression=compression))
    shard, layout = full.shards[0], full.layout(0, store)
    if head:  # the index starts at sample n - k: the first ones lie before it, unlisted
        kept = SampleLayout(layout.offsets[n - k :], layout.checksums[n - k :], layout.max_sample_bytes)
        hidden, at = "00000", 0
    else:  # the index ends after sample k - 1: the rest lie after it, unlisted
        kept = SampleLayout(layout.offsets[:k] + (layout.offsets[k],), layout.checksums[:k], layout.max_sample_bytes)
        hidden, at = f"{k:05d}", 0 if compression else layout.offsets[k]
    short = make_index([ShardInfo(shard.path, shard.bytes, k, shard.checksum)], {0: kept}, full.keys)
    write_index(store, short)
    report = validate(store, load_index(store), deep=True)
    assert [b.path for b in report.bad] == [shard.path]
    assert f"member '{hidden}.bin' at byte {at} lies {'before the first' if head else 'after the last'}" in (
        report.bad[0].reason
    )
    assert validate(store, load_index(store)).ok  # sizes alone cannot see it


def test_verify_accepts_directory_entries_before_the_first_sample_and_tar_padding(tmp_path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:  # GNU tar style: a directory entry first, a 10 KiB record
        info = tarfile.TarInfo("a")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for i in range(3):
            info = tarfile.TarInfo(f"a/{i}.txt")
            info.size = 2
            tar.addfile(info, io.BytesIO(b"%02d" % i))
    (tmp_path / "s-0.tar").write_bytes(buf.getvalue())
    store = Store(str(tmp_path))
    write_index(store, build_index(store))
    assert load_index(store).layout(0, store).offsets[0] == 512
    report = validate(store, load_index(store), deep=True)
    assert report.ok, report.bad


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_verify_fails_bytes_after_the_end_of_archive_that_are_not_padding(compression: str | None) -> None:
    import zstandard

    store = mem()
    index = write_dataset(samples(3, 100), store, spec=ShardSpec(compression=compression))
    shard = index.shards[0]
    extra = zstandard.ZstdCompressor().compress(bytes(2 << 20)) if compression else b"x" * 512
    data = store.read(shard.path) + extra  # a size and checksum the index then agrees with
    store.put(shard.path, data)
    grown = ShardInfo(shard.path, len(data), shard.samples, checksum_bytes(data))
    write_index(store, make_index([grown], {0: index.layout(0, store)}, index.keys))
    (bad,) = validate(store, load_index(store), deep=True).bad
    assert "after the last indexed sample" in bad.reason
    assert ("decompresses to more than" if compression else "are not the end of the archive") in bad.reason


def test_verify_fails_an_end_of_archive_before_the_first_indexed_sample() -> None:
    store = mem()
    index = write_dataset(samples(2, 100), store)
    shard, layout = index.shards[0], index.layout(0, store)
    data = bytes(1024) + store.read(shard.path)  # tar readers stop at the first two zero blocks: nothing after
    store.put(shard.path, data)
    moved = SampleLayout(tuple(o + 1024 for o in layout.offsets), layout.checksums)
    grown = ShardInfo(shard.path, len(data), shard.samples, checksum_bytes(data))
    write_index(store, make_index([grown], {0: moved}, index.keys))
    (bad,) = validate(store, load_index(store), deep=True).bad
    assert "the end-of-archive block at byte 0 lies before the first indexed sample" in bad.reason
