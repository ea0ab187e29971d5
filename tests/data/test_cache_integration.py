"""The composition the dataset builds on: plan runs -> byte runs (layout) -> Prefetcher + ShardCache
-> iter_samples, over shards written by streamio's own writer (real tars, per-sample CRC32C)."""

from __future__ import annotations

import pytest

from streamio.data.cache import CacheConfig, ShardCache
from streamio.data.format.index import load_index
from streamio.data.format.samples import SampleSpan, iter_samples
from streamio.data.read.prefetch import ByteRun, PrefetchConfig, Prefetcher
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import CorruptDataError
from streamio.storage import Store


def _samples(n: int) -> list[dict]:
    return [
        {"__key__": f"s{i:05d}", "txt": f"sample {i}".encode() * (1 + i % 7), "cls": str(i % 10).encode()}
        for i in range(n)
    ]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_runs_through_cache_yield_exactly_the_planned_samples(tmp_path, compression: str | None) -> None:
    store = Store(str(tmp_path / "ds"))
    written = _samples(300)
    write_dataset(written, store, spec=ShardSpec(max_count=64, compression=compression))
    index = load_index(store)
    # runs as the planner makes them (shard id, first sample, end sample), mid-shard starts included
    plan = [(0, 10, 64), (1, 0, 64), (2, 30, 31), (4, 5, index.shards[4].samples), (0, 0, 10)]
    runs, expected = [], []
    base = [sum(s.samples for s in index.shards[:i]) for i in range(len(index.shards))]
    for shard_id, first, end in plan:
        layout = index.layout(shard_id, store)
        runs.append(ByteRun(index.shards[shard_id], *layout.byte_range(first, end)))
        expected += [written[base[shard_id] + i]["__key__"] for i in range(first, end)]
    cache = ShardCache(CacheConfig(tmp_path / "cache", max_bytes=1 << 30, min_free_bytes=0))
    for attempt in ("cold", "warm"):
        got = []
        pf = Prefetcher(store, runs, cache=cache, config=PrefetchConfig(workers=3))
        for (shard_id, first, end), (run, chunks) in zip(plan, pf, strict=False):
            got += [s["__key__"] for s in iter_samples(
                chunks, url=store.url(run.shard.path), span=SampleSpan(run.start, first, end - first),
                layout=index.layout(shard_id, store), compression=run.shard.compression,
            )]
        assert got == expected, attempt
    assert cache.stats.hits >= len(plan)  # the warm pass read only the cache


def test_bit_rot_that_keeps_the_stamp_is_caught_per_sample_then_invalidated(tmp_path) -> None:
    """A flipped byte that leaves size/mtime alone passes the cache's stamp check; the per-sample
    CRC in iter_samples catches it, and ``invalidate`` makes the next read fetch the shard again."""
    import os

    store = Store(str(tmp_path / "ds"))
    write_dataset(_samples(50), store, spec=ShardSpec(max_count=50))
    index = load_index(store)
    shard, layout = index.shards[0], index.layout(0, store)
    cache = ShardCache(CacheConfig(tmp_path / "cache", max_bytes=1 << 30, min_free_bytes=0))
    b"".join(cache.open_range(store, shard))
    (name,) = [n for n in os.listdir(tmp_path / "cache") if n.endswith(".data")]
    path = tmp_path / "cache" / name
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(layout.offsets[3] + 600)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the stamp still matches
    with pytest.raises(CorruptDataError):
        list(iter_samples(cache.open_range(store, shard), url=store.url(shard.path), layout=layout))
    cache.invalidate(store, shard)
    assert len(list(iter_samples(cache.open_range(store, shard), url=store.url(shard.path), layout=layout))) == 50
