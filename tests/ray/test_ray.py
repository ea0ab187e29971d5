"""streamio.ray on a local Ray cluster (2 CPUs, one for the module): DatasetSink writes a dataset that
reads back with every row exactly once, also when a task fails on its first attempt and is retried;
streamio.ray.index writes the same index.json as `streamio index`."""

from __future__ import annotations

import io
import json
import os
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import ray
import ray.data

import streamio.ray
from streamio.data.format.index import index_document, load_index
from streamio.data.format.layout import INDEX_NAME
from streamio.data.format.samples import iter_samples
from streamio.data.write.indexer import build_index
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import DatasetError
from streamio.storage import Store
from streamio.testing import S3Endpoint

# Ray 2.60's DataContext warns about its own deprecated settings when it is made: not ours to fix.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240), pytest.mark.filterwarnings("ignore::DeprecationWarning:ray")]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """One local Ray cluster for every test here; its workers get no AWS_* of the host's."""
    with pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.startswith("AWS_"):
                env.delenv(name)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    yield
    ray.shutdown()


def read_all(store: Store) -> list[dict[str, object]]:
    index = load_index(store)
    out: list[dict[str, object]] = []
    for i, shard in enumerate(index.shards):
        out += iter_samples(store.iter_bytes(shard.path), url=store.url(shard.path), layout=index.layout(i, store),
                            compression=shard.compression)
    return out


def rows(n: int) -> list[dict[str, object]]:
    return [
        {"__key__": f"{i:05d}", "txt": f"row {i}", "bin": bytes([i % 256]) * 3, "cls": i % 7,
         "meta.json": {"i": i, "even": i % 2 == 0}, "emb": np.arange(4, dtype=np.float32) * i}
        for i in range(n)
    ]


def test_a_ray_dataset_becomes_a_streamio_dataset_on_s3(s3: S3Endpoint) -> None:
    sink = streamio.ray.DatasetSink(s3.url("ds"), spec=ShardSpec(max_count=7, compression="zstd"),
                                    storage_options=s3.storage_options())
    ray.data.from_items(rows(40), override_num_blocks=4).write_datasink(sink)
    store = Store(s3.url("ds"), s3.storage_options())
    assert sink.index is not None and load_index(store).fingerprint == sink.index.fingerprint
    got = read_all(store)
    assert sorted(s["__key__"] for s in got) == [f"{i:05d}" for i in range(40)]  # every row exactly once
    by_key = {s["__key__"]: s for s in got}
    sample = by_key["00013"]
    assert sample["txt"] == b"row 13" and sample["bin"] == b"\r\r\r" and sample["cls"] == b"6"
    assert json.loads(sample["meta.json"]) == {"i": 13, "even": False}
    np.testing.assert_array_equal(np.load(io.BytesIO(sample["emb"])), np.arange(4, dtype=np.float32) * 13)
    assert sink.index.keys == ("bin", "cls", "emb", "meta.json", "txt")
    assert {o.path for o in store.list()} == {INDEX_NAME} | {s.path for s in sink.index.shards}


def test_a_task_that_fails_once_is_retried_and_the_dataset_has_every_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = tmp_path / "attempts"
    flags.mkdir()

    def fails_once_midway(row: dict[str, object]) -> dict[str, object]:
        if row["__key__"] == "00031":  # the second block of a task: the first one's shards are stored already
            attempt = len(os.listdir(flags))
            (flags / f"{attempt}").touch()
            if attempt == 0:
                def first() -> list[Path]:  # this task's first shard, uploading in the background
                    return list(Path(url).glob("data-p000002-*-000000.tar"))

                deadline = time.monotonic() + 20
                while not first() and time.monotonic() < deadline:
                    time.sleep(0.05)
                (flags / "0").write_text(str(bool(first())))
                raise RuntimeError("first attempt lost")
        return row

    url = str(tmp_path / "ds")
    retry = {"max_retries": 2, "retry_exceptions": True}
    sink = streamio.ray.DatasetSink(url, spec=ShardSpec(max_count=2), rows_per_task=12)  # 2 blocks a task
    ctx = ray.data.DataContext.get_current()
    monkeypatch.setattr(ctx, "target_max_block_size", 256)  # map output in small blocks, each written as it comes
    with warnings.catch_warnings():  # Ray 2.60 has no named parameter for retry_exceptions yet, and warns
        warnings.simplefilter("ignore", DeprecationWarning)
        ds = ray.data.from_items(rows(48), override_num_blocks=8).map(fails_once_midway, **retry)
    ds.write_datasink(sink, ray_remote_args=retry)  # fused with the map: the retried task writes again
    assert sorted(os.listdir(flags)) == ["0", "1"]  # it failed, and the retry went past it
    assert (flags / "0").read_text() == "True"  # ... after storing shards; the retry wrote names of its own
    store = Store(url)
    keys = [s["__key__"] for s in read_all(store)]
    assert sorted(keys) == [f"{i:05d}" for i in range(48)] and len(keys) == len(set(keys))
    named = [s.path for s in load_index(store).shards]
    pattern = [rf"data-p{p:06d}-[0-9a-f]{{8}}-{i:06d}\.tar" for p in range(4) for i in range(6)]  # retry kept its id
    assert all(re.fullmatch(r, n) for r, n in zip(pattern, named, strict=True)), named
    assert {o.path for o in store.list()} == {INDEX_NAME, *named}  # no orphan shard, no summary, no marker


def test_small_blocks_are_bundled_into_tasks_of_a_shards_worth_of_rows(tmp_path: Path) -> None:
    """40 rows in 20 blocks made 20 partitions of one 2-row shard each; a task now takes >= max_count rows."""
    sink = streamio.ray.DatasetSink(str(tmp_path / "ds"), spec=ShardSpec(max_count=10))
    ray.data.from_items(rows(40), override_num_blocks=20).write_datasink(sink)
    assert sink.index is not None and sink.index.samples == 40
    assert len(sink.index.shards) <= 8, [s.samples for s in sink.index.shards]


def test_the_sink_refuses_a_dataset_already_there(tmp_path: Path) -> None:
    url = str(tmp_path / "ds")
    write_dataset([{"__key__": "a", "txt": "x"}], url)
    with pytest.raises(Exception, match="already holds a dataset") as caught:
        ray.data.from_items(rows(4)).write_datasink(streamio.ray.DatasetSink(url))
    assert isinstance(caught.value, DatasetError) or "DatasetError" in repr(caught.value)
    sink = streamio.ray.DatasetSink(url, overwrite=True)
    ray.data.from_items(rows(4)).write_datasink(sink)
    assert sink.index is not None and sink.index.samples == 4


def test_ray_index_writes_what_streamio_index_writes(s3: S3Endpoint) -> None:
    store = Store(s3.url("shards"), s3.storage_options())
    write_dataset(({"__key__": f"{i:04d}", "txt": f"t{i}" * (i % 5)} for i in range(70)), store,
                  spec=ShardSpec(max_count=10))
    store.delete(INDEX_NAME)
    expected = build_index(store)
    got = streamio.ray.index(s3.url("shards"), s3.storage_options(), tasks=3)
    assert got.fingerprint == expected.fingerprint
    assert index_document(load_index(store), store) == index_document(expected, store)
    with pytest.raises(DatasetError, match="index.json exists"):
        streamio.ray.index(s3.url("shards"), s3.storage_options())
    apart = streamio.ray.index(s3.url("shards/data-0000{00..04}.tar"), s3.storage_options(),
                               index_url=s3.url("elsewhere/five.json"))
    assert apart.samples == 50 and apart.shards_url == s3.url("shards")
