"""Replacing a dataset (streamio.data.write.publish): names that cannot collide, the index as the one conditional
commit, the old shards deleted only after it, and what a write that did not finish leaves and how it goes."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from streamio.data.format.index import load_index, write_index
from streamio.data.format.layout import INDEX_NAME, WRITING_NAME
from streamio.data.format.marker import read_marker
from streamio.data.write.indexer import build_index
from streamio.data.write.writer import DatasetWriter, ShardSpec, write_dataset
from streamio.errors import DatasetError, IndexFormatError
from streamio.storage import Store
from streamio.testing import S3Endpoint


def samples(n: int, tag: str = "s") -> list[dict[str, object]]:
    return [{"__key__": f"{tag}{i:03d}", "txt": f"{tag} {i}"} for i in range(n)]


def mem() -> Store:
    return Store(f"memory://pub-{uuid.uuid4().hex}")


def test_names_alternate_so_a_replacement_never_writes_over_the_live_dataset() -> None:
    store = mem()
    first = write_dataset(samples(4), store, spec=ShardSpec(max_count=2))
    assert [s.path for s in first.shards] == ["data-000000.tar", "data-000001.tar"]  # a first write: plain names
    second = write_dataset(samples(6, "t"), store, spec=ShardSpec(max_count=2), overwrite=True)
    tag = second.shards[0].path.split("-")[1]
    assert [s.path for s in second.shards] == [f"data-{tag}-{i:06d}.tar" for i in range(3)] and len(tag) == 8
    assert {o.path for o in store.list()} == {INDEX_NAME} | {s.path for s in second.shards}  # the old ones gone
    third = write_dataset(samples(2, "u"), store, overwrite=True)
    assert [s.path for s in third.shards] == ["data-000000.tar"]  # the plain names are free again
    assert {o.path for o in store.list()} == {INDEX_NAME, "data-000000.tar"}


def test_the_old_dataset_is_readable_while_a_replacement_is_written() -> None:
    store = mem()
    old = write_dataset(samples(4), store, spec=ShardSpec(max_count=1))
    with DatasetWriter(store, spec=ShardSpec(max_count=1), overwrite=True) as writer:
        for sample in samples(5, "t"):
            writer.write(sample)
            assert load_index(store).fingerprint == old.fingerprint  # what readers see until the commit
        assert store.exists(WRITING_NAME)
    assert load_index(store).samples == 5 and not store.exists(WRITING_NAME)


def test_a_commit_never_replaces_an_index_another_write_committed(s3: S3Endpoint) -> None:
    store = Store(s3.url("ds"), s3.storage_options())
    write_dataset(samples(2), store, spec=ShardSpec(max_count=1))
    writer = DatasetWriter(store, overwrite=True)
    writer.write(samples(1, "mine")[0])
    other = write_index(store, build_index(store, "data-000000.tar"))  # another writer commits meanwhile
    assert other is not None
    with pytest.raises(DatasetError, match="changed while this write ran .* it was not replaced"):
        writer.close()
    assert store.info(INDEX_NAME).version == other and store.exists("data-000000.tar")


def test_a_dataset_indexed_elsewhere_keeps_its_shards_when_its_index_is_replaced(tmp_path: Path) -> None:
    shards = Store(str(tmp_path / "public"))
    write_dataset(samples(3), shards)
    shards.delete(INDEX_NAME)
    apart = Store(str(tmp_path / "mine"))
    index = build_index(shards)
    from dataclasses import replace

    write_index(apart, replace(index, shards_url=f"file://{tmp_path}/public"))
    write_dataset(samples(2, "t"), apart, overwrite=True)
    assert shards.exists("data-000000.tar")  # not below the prefix written: never this write's to delete


def test_a_marker_not_written_by_streamio_is_not_trusted_for_cleanup() -> None:
    store = mem()
    store.put(WRITING_NAME, b'{"format": "something/else", "prefix": "../x", "tag": ""}')
    with pytest.raises(IndexFormatError, match="is not a streamio.write/1 marker"):
        read_marker(store)
    with pytest.raises(IndexFormatError):
        write_dataset(samples(1), store, overwrite=True)


def test_a_write_that_finds_another_marker_appearing_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamio.data.write import publish

    store = mem()
    store.put(WRITING_NAME, b'{"format": "streamio.write/1", "prefix": "data", "tag": "", "started": "now"}')
    with pytest.raises(DatasetError, match="did not finish .* pass overwrite=True"):
        DatasetWriter(store)
    monkeypatch.setattr(publish, "occupied", lambda store: None)  # as if it appeared just after the check
    with pytest.raises(DatasetError, match="another write into .* started meanwhile"):
        DatasetWriter(store)


def test_a_damaged_index_is_replaced_and_what_it_named_is_left(caplog: pytest.LogCaptureFixture) -> None:
    store = mem()
    write_dataset(samples(2), store)
    store.put(INDEX_NAME, b"{not json")
    write_dataset(samples(3, "t"), store, overwrite=True)
    assert load_index(store).samples == 3 and store.exists("data-000000.tar")
    assert "cannot be read" in caplog.text and "left in place" in caplog.text
