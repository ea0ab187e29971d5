"""One dataset written by many tasks (streamio.data.write.parts): names by partition id, summaries put
create-only, retried tasks never leave a second copy, one commit in partition-id order."""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Iterator

import pytest

from streamio.data.format.index import load_index
from streamio.data.format.layout import INDEX_NAME, WRITING_NAME
from streamio.data.format.samples import iter_samples
from streamio.data.write.parts import PartitionedWrite
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import ConfigError, DatasetError, IndexFormatError
from streamio.storage import Store
from streamio.testing import S3Endpoint


def part_samples(part: int, n: int) -> list[dict[str, object]]:
    return [{"__key__": f"p{part}/{i:04d}", "txt": f"part {part} sample {i}", "cls": i % 3} for i in range(n)]


def read_keys(store: Store) -> list[str]:
    index = load_index(store)
    keys: list[str] = []
    for i, shard in enumerate(index.shards):
        for sample in iter_samples(store.iter_bytes(shard.path), url=store.url(shard.path),
                                   layout=index.layout(i, store), compression=shard.compression):
            keys.append(sample["__key__"])
    return keys


def failing(samples: list[dict[str, object]], after: int) -> Iterator[dict[str, object]]:
    """The samples of a task that dies after ``after`` of them (the attempt a retry repeats)."""
    for i, sample in enumerate(samples):
        if i == after:
            raise RuntimeError("task lost")
        yield sample


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_partitions_written_in_any_order_commit_in_id_order_on_s3(s3: S3Endpoint, compression: str | None) -> None:
    write = PartitionedWrite.begin(s3.url("ds"), spec=ShardSpec(max_count=4, compression=compression),
                                   storage_options=s3.storage_options())
    write = pickle.loads(pickle.dumps(write))  # what an engine does to ship it to a task
    counts = {3: 5, 0: 9, 1: 0, 2: 4}
    summaries = [write.write_part(part, part_samples(part, n)) for part, n in counts.items()]  # finish out of order
    assert [(s.part, s.shards, s.samples) for s in summaries] == [(3, 2, 5), (0, 3, 9), (1, 0, 0), (2, 1, 4)]
    index = write.commit([s.part for s in summaries])
    store = write.store()
    ext = ".tar.zst" if compression else ".tar"
    assert [s.path for s in index.shards] == [
        f"data-p000000-00000{i}{ext}" for i in range(3)] + [f"data-p000002-000000{ext}"] + [
        f"data-p000003-00000{i}{ext}" for i in range(2)]
    assert read_keys(store) == [s["__key__"] for p in sorted(counts) for s in part_samples(p, counts[p])]
    assert load_index(store).fingerprint == index.fingerprint and index.keys == ("cls", "txt")
    assert {o.path for o in store.list()} == {INDEX_NAME} | {s.path for s in index.shards}  # no summary, no marker


def test_a_retried_task_rewrites_the_same_names_and_a_shorter_retry_leaves_no_orphan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"), spec=ShardSpec(max_count=2))
    samples = part_samples(0, 11)
    with pytest.raises(RuntimeError, match="task lost"):
        write.write_part(0, failing(samples, after=9))  # 4 shards finished, at least 2 stored, no summary
    store = write.store()
    stored = [o.path for o in store.list() if o.path.endswith(".tar")]
    assert len(stored) >= 2 and set(stored) <= {f"data-p000000-00000{i}.tar" for i in range(4)}
    write.write_part(0, samples[:2])  # the retry (here with fewer samples): shard 0 again, the others orphaned
    index = write.commit()
    assert read_keys(store) == [s["__key__"] for s in samples[:2]]
    assert {o.path for o in store.list()} == {INDEX_NAME, "data-p000000-000000.tar"}
    assert index.samples == 2 and sorted(os.listdir(tmp_path / "ds")) == ["data-p000000-000000.tar", INDEX_NAME]


def test_a_task_whose_partition_is_already_written_writes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"), spec=ShardSpec(max_count=2))
    first = write.write_part(4, part_samples(4, 5))

    def untouched() -> Iterator[dict[str, object]]:
        raise AssertionError("a finished partition's samples are not read again")
        yield {}

    assert write.write_part(4, untouched()) == first
    assert write.commit().samples == 5


def test_two_attempts_with_different_samples_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"))

    def racing() -> Iterator[dict[str, object]]:
        yield from part_samples(1, 2)
        write.write_part(1, part_samples(1, 3))  # another attempt finishes first, with other samples

    with pytest.raises(DatasetError, match="partition 1 .* two attempts with different samples"):
        write.write_part(1, racing())


def test_commit_names_partitions_that_did_not_finish(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"))
    write.write_part(0, part_samples(0, 2))
    with pytest.raises(DatasetError, match=r"partition\(s\) \[1, 2\] .* did not finish"):
        write.commit([0, 1, 2])
    assert not write.store().exists(INDEX_NAME) and write.store().exists(WRITING_NAME)


def test_an_empty_write_makes_no_dataset(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"))
    write.write_part(0, [])
    with pytest.raises(DatasetError, match="every partition was empty"):
        write.commit()
    assert not write.store().exists(INDEX_NAME) and not write.store().exists(WRITING_NAME)


@pytest.mark.parametrize("part", [-1, 10**9, 1.0, True, "3"])
def test_partition_ids_are_small_non_negative_ints(tmp_path, part: object) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"))
    with pytest.raises(ConfigError, match=r"a partition id must be an int in \[0, 1,000,000,000\)"):
        write.write_part(part, [])  # type: ignore[arg-type]


def test_a_summary_not_written_by_streamio_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"))
    write.store().put(write.summary_path(0), b'{"format": "something/9", "shards": []}')
    with pytest.raises(IndexFormatError, match="something/9"):
        write.commit()


def test_overwrite_replaces_a_dataset_and_an_unfinished_partitioned_write(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = str(tmp_path / "ds")
    write_dataset(part_samples(9, 3), url)
    with pytest.raises(DatasetError, match="already holds a dataset"):
        PartitionedWrite.begin(url)
    stopped = PartitionedWrite.begin(url, overwrite=True)
    stopped.write_part(0, part_samples(0, 2))  # then the driver dies: no commit
    assert read_keys(Store(url)) == [s["__key__"] for s in part_samples(9, 3)]  # readers still see the old one
    with pytest.raises(DatasetError, match="already holds a dataset"):
        PartitionedWrite.begin(url)
    again = PartitionedWrite.begin(url, overwrite=True)  # removes the stopped write's shards and summaries
    again.write_part(0, part_samples(5, 4))
    index = again.commit()
    assert read_keys(Store(url)) == [s["__key__"] for s in part_samples(5, 4)]
    tag = again.generation.tag
    assert {o.path for o in Store(url).list()} == {INDEX_NAME, f"data-{tag}-p000000-000000.tar"} == {
        INDEX_NAME} | {s.path for s in index.shards}


def test_its_repr_and_pickle_never_show_the_storage_options(s3: S3Endpoint) -> None:
    options = s3.storage_options()
    write = PartitionedWrite.begin(s3.url(f"ds-{uuid.uuid4().hex[:6]}"), storage_options=options)
    assert options["secret"] not in repr(write)


def _npy(tokens: list[int]) -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.asarray(tokens, dtype=np.uint16))
    return buf.getvalue()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_token_counts_of_every_partition_reach_the_committed_index(tmp_path, compression: str | None) -> None:  # type: ignore[no-untyped-def]
    """A token data set written by tasks packs like one written by write_dataset (issue 28 over issue 27)."""
    def docs(part: int) -> list[dict[str, object]]:
        return [{"__key__": f"p{part}/{i:03d}", "npy": _npy(list(range(1 + part * 10 + i)))} for i in range(7)]

    write = PartitionedWrite.begin(str(tmp_path / "ds"), spec=ShardSpec(max_count=3, compression=compression))
    for part in (1, 0):
        write.write_part(part, docs(part))
    index = write.commit()
    counts = [c for shard in index.token_counts("npy") for c in shard]
    assert counts == [1 + p * 10 + i for p in (0, 1) for i in range(7)]
    assert load_index(Store(str(tmp_path / "ds"))).token_counts("npy") == index.token_counts("npy")
