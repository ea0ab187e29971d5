"""One dataset written by many tasks (streamio.data.write.parts): names by partition id, summaries put
create-only, retried tasks never leave a second copy, one commit in partition-id order."""

from __future__ import annotations

import json
import os
import pickle
import re
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
    assert [re.sub("-[0-9a-f]{8}-", "-@-", s.path) for s in index.shards] == [
        f"data-p000000-@-00000{i}{ext}" for i in range(3)] + [f"data-p000002-@-000000{ext}"] + [
        f"data-p000003-@-00000{i}{ext}" for i in range(2)]  # @: the attempt that wrote the partition
    assert read_keys(store) == [s["__key__"] for p in sorted(counts) for s in part_samples(p, counts[p])]
    assert load_index(store).fingerprint == index.fingerprint and index.keys == ("cls", "txt")
    assert {o.path for o in store.list()} == {INDEX_NAME} | {s.path for s in index.shards}  # no summary, no marker


def test_a_retried_task_writes_names_of_its_own_and_the_commit_leaves_no_orphan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"), spec=ShardSpec(max_count=2))
    samples = part_samples(0, 11)
    with pytest.raises(RuntimeError, match="task lost"):
        write.write_part(0, failing(samples, after=9))  # 4 shards finished, at least 2 stored, no summary
    store = write.store()
    lost = {o.path for o in store.list() if o.path.endswith(".tar")}
    assert len(lost) >= 2 and all(re.fullmatch(r"data-p000000-[0-9a-f]{8}-00000[0-3]\.tar", p) for p in lost)
    write.write_part(0, samples[:2])  # the retry (here with fewer samples): names of its own
    index = write.commit()
    assert read_keys(store) == [s["__key__"] for s in samples[:2]]
    (shard,) = index.shards
    assert shard.path not in lost and {o.path for o in store.list()} == {INDEX_NAME, shard.path}  # lost ones gone
    assert index.samples == 2 and sorted(os.listdir(tmp_path / "ds")) == [shard.path, INDEX_NAME]


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
    (shard,) = index.shards
    assert re.fullmatch(rf"data-{tag}-p000000-[0-9a-f]{{8}}-000000\.tar", shard.path)
    assert {o.path for o in Store(url).list()} == {INDEX_NAME, shard.path}


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


# ----------------------------------------------------------------------------- issue 34, item 3
def snapshot(store: Store) -> dict[str, tuple[int, str | None]]:
    """Every object with its size and version: what a refused commit must leave exactly as it was."""
    return {o.path: (o.size, o.version) for o in store.list()}


def forge(write: PartitionedWrite, how: str) -> None:
    """Make partition 1's summary lie, as a task (or anyone) that can write the prefix could."""
    store = write.store()
    doc0, doc1 = (json.loads(store.read(write.summary_path(p))) for p in (0, 1))
    shard1 = doc1["shards"][0]["path"]
    if how == "copied":  # partition 0's summary put again as partition 1's
        store.put(write.summary_path(1), json.dumps(doc0).encode())
    elif how == "names-other-partition":  # says it is partition 1, lists partition 0's shards
        store.put(write.summary_path(1), json.dumps({**doc0, "part": 1}).encode())
    elif how == "shard-missing":
        store.delete(shard1)
    elif how == "shard-resized":
        store.put(shard1, store.read(shard1) + bytes(512))


@pytest.mark.parametrize("how, error, message", [
    ("copied", IndexFormatError, r"_parts/data-\w+-p000001\.json is the summary of partition 0, not of partition 1: "
                                 r"it was copied or forged\. Nothing was committed or deleted"),
    ("names-other-partition", IndexFormatError,
     r"p000001\.json names 'data-\w+-p000000-[0-9a-f]{8}-000000\.tar' as shard 0 of partition 1; this write names "
     r"it 'data-\w+-p000001-<attempt>-000000\.tar'"),
    ("shard-missing", DatasetError, r"p000001\.json names 'data-\w+-p000001-[0-9a-f]{8}-000000\.tar' of [0-9,]+ "
                                    r"bytes, which is not stored: nothing was committed or deleted"),
    ("shard-resized", DatasetError, r"p000001\.json names 'data-\w+-p000001-[0-9a-f]{8}-000000\.tar' of ([0-9,]+) "
                                    r"bytes, which has [0-9,]+ bytes: nothing was committed or deleted"),
])
def test_a_forged_or_copied_summary_refuses_the_commit_and_deletes_nothing(
    request: pytest.FixtureRequest, tmp_path, how: str, error: type[Exception], message: str  # type: ignore[no-untyped-def]
) -> None:
    """Issue 34 item 3: a copied summary was committed (one shard named twice: no reader could open the
    index), then the old dataset and partition 1's real shards were deleted. On S3 (moto) for the
    summaries that lie about shards, on local disk for the shards that are not what a summary says."""
    if how in ("copied", "names-other-partition"):
        s3: S3Endpoint = request.getfixturevalue("s3")
        url, options = s3.url("ds"), s3.storage_options()
    else:
        url, options = str(tmp_path / "ds"), None
    write_dataset(part_samples(9, 3), Store(url, options))
    write = PartitionedWrite.begin(url, spec=ShardSpec(max_count=4), storage_options=options, overwrite=True)
    for part in (0, 1):
        write.write_part(part, part_samples(part, 3))
    forge(write, how)
    store = write.store()
    before = snapshot(store)
    with pytest.raises(error, match=message):
        write.commit()
    assert snapshot(store) == before  # the old dataset, both partitions' shards, the summaries and the marker
    assert read_keys(store) == [s["__key__"] for s in part_samples(9, 3)]  # readers still see the old dataset
    with pytest.raises(error, match=message):
        write.commit([0, 1])
    assert snapshot(store) == before


def test_a_losing_attempt_never_overwrites_the_winners_shards_on_s3(s3: S3Endpoint) -> None:
    """Issue 34 item 3: the loser of two attempts with different samples rewrote the winner's shard names
    before its summary was refused, so the committed shard then failed its CRC."""
    from streamio.data.write.verify import validate

    write = PartitionedWrite.begin(s3.url("ds"), spec=ShardSpec(max_count=2), storage_options=s3.storage_options())
    winner = part_samples(1, 5)

    def loser() -> Iterator[dict[str, object]]:
        yield from part_samples(7, 2)  # one shard's worth: it is stored once the next sample comes
        write.write_part(1, winner)  # the other attempt finishes first (summary stored)
        yield from part_samples(7, 5)[2:]  # the loser's shards go on being stored after that

    with pytest.raises(DatasetError, match="partition 1 of .* written by two attempts with different samples"):
        write.write_part(1, loser())
    store = write.store()
    assert len([o for o in store.list() if o.path.endswith(".tar")]) == 6  # the loser's 3 shards and the winner's 3
    index = write.commit()
    assert read_keys(store) == [s["__key__"] for s in winner]
    report = validate(store, index, deep=True)
    assert report.ok, report.bad  # every shard's bytes are the winner's: size, CRC32C, each sample's CRC32C
    assert {o.path for o in store.list()} == {INDEX_NAME} | {s.path for s in index.shards}  # the loser's removed


def test_two_attempts_with_the_same_samples_both_succeed_and_one_copy_is_committed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A speculative copy of a task (Spark) writes the same samples under names of its own: not a conflict."""
    write = PartitionedWrite.begin(str(tmp_path / "ds"), spec=ShardSpec(max_count=2))
    samples = part_samples(2, 5)

    def speculative() -> Iterator[dict[str, object]]:
        yield from samples[:3]
        write.write_part(2, samples)
        yield from samples[3:]

    assert write.write_part(2, speculative()) == write.write_part(2, samples)  # (the last one: skipped)
    index = write.commit()
    assert read_keys(write.store()) == [s["__key__"] for s in samples]
    assert {o.path for o in write.store().list()} == {INDEX_NAME} | {s.path for s in index.shards}


@pytest.mark.parametrize("parts", [[True], [0, -1], [0, "1"]])
def test_commit_takes_partition_ids_as_write_part_does(tmp_path, parts: list[object]) -> None:  # type: ignore[no-untyped-def]
    write = PartitionedWrite.begin(str(tmp_path / "ds"))
    write.write_part(1, part_samples(1, 2))
    with pytest.raises(ConfigError, match=r"a partition id must be an int in \[0, 1,000,000,000\)"):
        write.commit(parts)  # type: ignore[arg-type]
    assert write.store().exists(WRITING_NAME) and not write.store().exists(INDEX_NAME)


def test_a_zombie_task_after_the_commit_leaves_nothing_behind(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A task that outlived its job (started, or still packing, when the commit ran) neither writes into the
    committed dataset nor leaves a summary and shards that no commit would ever remove."""
    write = PartitionedWrite.begin(str(tmp_path / "ds"), spec=ShardSpec(max_count=2))
    write.write_part(0, part_samples(0, 3))

    def committed_midway() -> Iterator[dict[str, object]]:
        yield from part_samples(1, 3)
        write.commit([0])  # the driver commits while this task is still packing

    store = write.store()
    with pytest.raises(DatasetError, match=r"partition 1 of .*: this write \(data-\*\.tar\*, started .*\) is no "
                                           r"longer open: it was committed, or another write replaced it"):
        write.write_part(1, committed_midway())
    committed = {o.path for o in store.list()}
    with pytest.raises(DatasetError, match="is no longer open"):
        write.write_part(2, part_samples(2, 3))  # one that starts after the commit
    assert {o.path for o in store.list()} == committed == {INDEX_NAME} | {s.path for s in load_index(store).shards}
    assert read_keys(store) == [s["__key__"] for s in part_samples(0, 3)]
