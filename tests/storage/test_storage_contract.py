"""The Store contract, run on every backend (file, memory, S3 via moto, GCS via fake-gcs-server)."""

from __future__ import annotations

import os
import pickle
import threading

import pytest

from streamio.errors import ObjectNotFoundError, StorageError, WriteConflictError
from streamio.storage import ObjectInfo, Store
from streamio.testing import S3Endpoint


def test_put_read_roundtrip_and_ranges(store: Store) -> None:
    data = os.urandom(10_000)
    version = store.put("a/b.bin", data)
    assert version
    assert store.read("a/b.bin") == data
    assert store.read("a/b.bin", 100, 200) == data[100:200]
    assert store.read("a/b.bin", 9_990) == data[9_990:]
    assert store.read("a/b.bin", 5, 5) == b""


def test_empty_object(store: Store) -> None:
    store.put("empty", b"")
    assert store.read("empty") == b""
    assert list(store.iter_bytes("empty")) == []
    assert store.info("empty").size == 0


def test_info_is_fresh_and_version_changes(store: Store) -> None:
    v1 = store.put("x", b"one")
    info = store.info("x")
    assert info == ObjectInfo("x", 3, v1)
    v2 = store.put("x", b"two!")
    assert v2 != v1
    assert store.info("x") == ObjectInfo("x", 4, v2)


def test_list_is_recursive_sorted_and_fresh(store: Store) -> None:
    assert store.list() == []
    for p in ["b/2", "a", "b/1", "b/c/3"]:
        store.put(p, p.encode())
    assert [o.path for o in store.list()] == ["a", "b/1", "b/2", "b/c/3"]
    assert [o.path for o in store.list("b/c")] == ["b/c/3"]
    assert [o.size for o in store.list("b")] == [3, 3, 5]
    store.put("b/0", b"new")  # written after a listing: visible at once
    assert [o.path for o in store.list("b")][0] == "b/0"
    assert store.list("nothing-here") == []


def test_missing_object_errors_name_the_url(store: Store) -> None:
    for call in (lambda: store.read("nope"), lambda: store.info("nope"), lambda: list(store.iter_bytes("nope"))):
        with pytest.raises(ObjectNotFoundError) as info:
            call()
        assert store.url("nope") in str(info.value)
        assert isinstance(info.value, FileNotFoundError)
    assert not store.exists("nope")


def test_exists_and_delete(store: Store) -> None:
    store.put("d/e", b"1")
    assert store.exists("d/e")
    store.delete("d/e")
    assert not store.exists("d/e")
    store.delete("d/e")  # already gone: not an error


def test_iter_bytes_streams_ranges_and_verifies(store: Store) -> None:
    data = os.urandom(3 * (1 << 20) + 17)
    store.put("s", data)
    chunks = list(store.iter_bytes("s", chunk_size=1 << 20))
    assert b"".join(chunks) == data
    assert all(0 < len(c) <= 1 << 20 for c in chunks)
    assert b"".join(store.iter_bytes("s", 1000, 2_000_000, chunk_size=300_000)) == data[1000:2_000_000]
    assert b"".join(store.iter_bytes("s", 5)) == data[5:]
    assert list(store.iter_bytes("s", 10, 10)) == []


def test_create_only_put(store: Store) -> None:
    v = store.put("c", b"first", mode="create")
    with pytest.raises(WriteConflictError) as info:
        store.put("c", b"second", mode="create")
    assert store.url("c") in str(info.value) and isinstance(info.value, FileExistsError)
    assert store.read("c") == b"first"
    assert store.info("c").version == v


def test_compare_and_swap_put(store: Store) -> None:
    v1 = store.put("p", b"v1")
    v2 = store.put("p", b"v2", if_match=v1)
    assert store.read("p") == b"v2"
    with pytest.raises(WriteConflictError) as info:
        store.put("p", b"stale", if_match=v1)
    assert store.url("p") in str(info.value)
    assert store.read("p") == b"v2"
    store.put("p", b"v3", if_match=v2)
    assert store.read("p") == b"v3"


def test_read_versioned_gives_the_version_of_the_bytes_read(store: Store) -> None:
    v1 = store.put("p", b"one")
    assert store.read_versioned("p") == (b"one", v1) == (b"one", store.info("p").version)
    v2 = store.put("p", b"two!", if_match=v1)
    data, version = store.read_versioned("p", max_bytes=4)
    assert (data, version) == (b"two!", v2)
    with pytest.raises(WriteConflictError):
        store.put("p", b"stale", if_match=v1)  # what was read before is no longer what is there
    store.put("p", b"three", if_match=version)  # what was just read still is
    with pytest.raises(ObjectNotFoundError):
        store.read_versioned("gone")


def test_compare_and_swap_on_missing_object_conflicts(store: Store) -> None:
    v = store.put("q", b"x")
    store.delete("q")
    with pytest.raises(WriteConflictError):
        store.put("q", b"y", if_match=v)
    assert not store.exists("q")


def test_concurrent_creates_have_exactly_one_winner(store: Store) -> None:
    wins: list[int] = []
    losses: list[int] = []

    def attempt(i: int) -> None:
        try:
            store.put("race", str(i).encode(), mode="create")
            wins.append(i)
        except WriteConflictError:
            losses.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 5
    assert store.read("race") == str(wins[0]).encode()


def test_put_many_read_many(store: Store) -> None:
    items = [(f"m/{i:03d}", os.urandom(1000 + i)) for i in range(20)]
    store.put_many(items, concurrency=4)
    assert store.read_many([p for p, _ in items], concurrency=4) == [d for _, d in items]
    assert store.read_many([]) == []


def test_read_many_error_names_the_missing_url(store: Store) -> None:
    store.put("r/1", b"1")
    with pytest.raises(ObjectNotFoundError) as info:
        store.read_many(["r/1", "r/missing"])
    assert store.url("r/missing") in str(info.value)


def test_child_store_and_urls(store: Store) -> None:
    child = store.child("sub/dir")
    child.put("f", b"z")
    assert store.read("sub/dir/f") == b"z"
    assert child.url("f") == store.url("sub/dir/f")
    assert child.root_url == store.url("sub/dir")


def test_abandoned_stream_releases_and_store_keeps_working(store: Store) -> None:
    store.put("big", os.urandom(3 << 20))
    for _ in range(20):  # more than any connection pool: each abandoned stream must be released
        stream = store.iter_bytes("big", chunk_size=64 << 10)
        assert len(next(stream)) > 0
        stream.close()
    assert store.read("big", 0, 10) == store.read("big")[:10]


def test_store_pickles_into_a_working_store(store: Store) -> None:
    store.put("k", b"v")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.read("k") == b"v"
    assert repr(clone) == repr(store)


def test_read_view_is_the_whole_object(store: Store) -> None:
    data = os.urandom(70_000)
    store.put("v", data)
    assert bytes(store.read_view("v")) == data
    with pytest.raises(ObjectNotFoundError):
        store.read_view("missing")


def test_all_storage_errors_are_streamio_errors(store: Store) -> None:
    with pytest.raises(StorageError):
        store.read("missing")


def test_range_past_the_end_is_a_clear_error_not_a_retry_loop(store: Store) -> None:
    from streamio.errors import CorruptDataError

    store.put("short", b"0123456789")
    with pytest.raises(CorruptDataError) as info:
        list(store.iter_bytes("short", 2, 50))
    assert store.url("short") in str(info.value)
    with pytest.raises((StorageError, CorruptDataError)):  # local: shorter; S3/GCS: 416 InvalidRange
        store.read("short", 20, 30)


def test_gcs_resumable_upload_keeps_conditions(gcs, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from streamio.storage import store as store_module

    monkeypatch.setattr(store_module, "MULTIPART_THRESHOLD", 1 << 20)
    monkeypatch.setattr(store_module, "PART_SIZE", 512 << 10)
    from streamio.storage.backends import gcs as gcs_backend

    parts: list[int] = []
    real_sync = gcs_backend.sync

    def counting_sync(loop, fn, *args, **kw):  # type: ignore[no-untyped-def]
        if "Content-Range" in (kw.get("headers") or {}):
            parts.append(1)
        return real_sync(loop, fn, *args, **kw)

    monkeypatch.setattr(gcs_backend, "sync", counting_sync)
    store = Store(gcs.url("r"), gcs.storage_options())
    data = os.urandom((3 << 20) + 5)
    v0 = store.put("big", data[:-1])  # unconditional: resumable, in 512 KiB parts
    assert store.read("big") == data[:-1] and store.info("big").version == v0
    assert len(parts) == 7  # 3 MiB + 4 bytes in 512 KiB parts
    store.delete("big")
    v1 = store.put("big", data, mode="create")  # conditional: one request
    assert store.read("big") == data and store.info("big").version == v1
    with pytest.raises(WriteConflictError):
        store.put("big", data[::-1], mode="create")
    with pytest.raises(WriteConflictError):
        store.put("big", data[::-1], if_match="1")
    v2 = store.put("big", data[::-1], if_match=v1)
    assert v2 != v1 and store.read("big") == data[::-1]


def test_incomplete_multipart_uploads_are_listed_and_aborted(s3: S3Endpoint) -> None:
    """A killed writer's multipart upload is invisible to listings; the store can find and abort it."""
    store = Store(s3.url("root"), s3.storage_options())
    client = s3.boto3_client()
    upload_id = client.create_multipart_upload(Bucket=s3.bucket, Key="root/ckpt/part.bin")["UploadId"]
    client.create_multipart_upload(Bucket=s3.bucket, Key="elsewhere/x.bin")
    assert store.list() == []
    found = store.incomplete_uploads()
    assert [(u.path, u.upload_id) for u in found] == [("ckpt/part.bin", upload_id)]
    assert found[0].initiated is not None
    store.abort_upload(found[0])
    assert store.incomplete_uploads() == []
    assert [u["Key"] for u in client.list_multipart_uploads(Bucket=s3.bucket)["Uploads"]] == ["elsewhere/x.bin"]


def test_incomplete_uploads_are_empty_where_the_backend_has_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert Store(str(tmp_path)).incomplete_uploads() == []
