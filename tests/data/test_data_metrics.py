"""The data path's metrics against what really happened: the loop's own clock and the proxy's log.

A dataset of 6 shards on moto behind the fault proxy with 30 ms before every response's first byte,
read by a loop that does nothing with its batches. What is asserted is a relation with an outside
measure, never "non-zero": the loader's waits sum to what the loop measured around ``next()``; a
cold epoch's cache misses are the shards the proxy saw fetched, a warm epoch's hits the same shards
with no shard GET at all; the cache-bytes gauge is the shards' bytes plus the per-shard lock files;
the prefetch depth is back to 0 after an epoch and after an abandoned iterator. With DataLoader
workers (slow), the workers' counts reach the main process's snapshot when the epoch ends, through
``StreamingDataLoader`` and a plain ``torch.utils.data.DataLoader`` alike.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from streamio import metrics
from streamio.checksum import checksum_bytes
from streamio.data.cache import CacheConfig
from streamio.data.cache.core import CacheCore
from streamio.data.cache.source import Source
from streamio.data.cache.transfer import RESERVE
from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.data.options import DatasetOptions
from streamio.metrics import processes
from streamio.testing import FaultProxy, S3Endpoint
from support.dataset import make_dataset

SHARDS, PER_SHARD, BATCH = 6, 40, 8
LATENCY_S = 0.03


@pytest.fixture
def open_dataset(s3: S3Endpoint, proxy: FaultProxy, tmp_path: Path) -> Callable[..., StreamingDataset]:
    """``open_dataset(**kw)``: the 6-shard dataset through the proxy, with a node cache."""
    make_dataset(s3.url("ds"), s3.storage_options(), [PER_SHARD] * SHARDS)
    options = DatasetOptions(cache=CacheConfig(tmp_path / "cache", max_bytes=1 << 30))

    def opened(**kw: Any) -> StreamingDataset:
        return StreamingDataset(s3.url("ds"), batch_size=BATCH, storage_options=s3.storage_options(proxy.endpoint_url),
                                options=options, **kw)

    return opened


@pytest.fixture
def dataset(open_dataset: Callable[..., StreamingDataset]) -> StreamingDataset:
    return open_dataset()


def _sizes(batch: list[Any]) -> int:
    return len(batch)


def timed_epoch(loader: Any) -> tuple[list[float], dict[str, Any]]:
    """The loop's own wait for each batch, and the snapshot once the iterator is exhausted."""
    waits = []
    it: Iterator[Any] = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        waits.append(time.perf_counter() - t0)
    return waits, metrics.snapshot()


def shard_gets(proxy: FaultProxy) -> set[str]:
    return {r.path for r in proxy.log() if r.method == "GET" and r.path.endswith(".tar") and r.status < 300}


def test_loader_wait_shows_the_stall_a_warm_cache_removes_it_and_cache_counts_match_the_proxy(
    dataset: StreamingDataset, proxy: FaultProxy
) -> None:
    loader = StreamingDataLoader(dataset, collate_fn=_sizes)
    shard_bytes = sum(sh.bytes for sh in dataset.index.shards)
    proxy.set_latency(LATENCY_S)
    sums = []
    for epoch in range(2):
        metrics.reset()
        proxy.clear()
        dataset.set_epoch(epoch)
        waits, snap = timed_epoch(loader)
        wait = snap["streamio_loader_wait_seconds"]
        batches = SHARDS * PER_SHARD // BATCH
        assert len(waits) == wait["count"] == snap["streamio_loader_batches_total"] == batches
        # the loader's window lies inside the loop's: the same waits, less the loop's own few microseconds
        assert sum(waits) - 0.0005 * batches <= wait["sum"] <= sum(waits)
        assert snap["streamio_prefetch_depth"] == 0
        fetched = shard_gets(proxy)
        if epoch == 0:  # cold: one download per shard, each behind the injected latency
            assert len(fetched) == SHARDS
            assert (snap["streamio_cache_misses_total"], snap["streamio_cache_hits_total"]) == (len(fetched), 0)
            assert wait["sum"] >= LATENCY_S  # the first batch alone waited for a shard's first byte
            # what the cache holds as measured at its last reservation: the shards and their lock files
            assert shard_bytes <= snap["streamio_cache_bytes"] <= shard_bytes + SHARDS * RESERVE
        else:  # warm: every shard read from the cache, not one shard request
            assert fetched == set()
            assert (snap["streamio_cache_misses_total"], snap["streamio_cache_hits_total"]) == (0, SHARDS)
        sums.append(wait["sum"])
    assert sums[1] < sums[0] / 2, sums


def test_prefetch_depth_counts_runs_fetched_ahead_and_returns_to_zero_when_abandoned(
    open_dataset: Callable[..., StreamingDataset], proxy: FaultProxy
) -> None:
    in_order = open_dataset(shuffle=False)  # one shard after the other: each run is one shard
    loader = StreamingDataLoader(in_order, collate_fn=_sizes)
    proxy.set_latency(LATENCY_S)
    metrics.reset()
    it = iter(loader)
    next(it)  # from run 0, behind 30 ms of latency: the 4 prefetch threads started runs 0-3 meanwhile
    assert metrics.snapshot()["streamio_prefetch_depth"] == in_order.options.prefetch.workers - 1 == 3
    del it
    gc.collect()
    assert metrics.snapshot()["streamio_prefetch_depth"] == 0


@pytest.mark.slow
def test_forked_workers_counts_reach_the_main_process_when_the_epoch_ends(
    dataset: StreamingDataset, proxy: FaultProxy
) -> None:
    """With 2 forked workers: StreamingDataLoader (cold), then a plain DataLoader (warm)."""
    metrics.reset()
    proxy.clear()
    waits, snap = timed_epoch(StreamingDataLoader(dataset, num_workers=2, collate_fn=_sizes))
    assert len(shard_gets(proxy)) == SHARDS
    assert (snap["streamio_cache_misses_total"], snap["streamio_cache_hits_total"]) == (SHARDS, 0)
    assert snap["streamio_loader_wait_seconds"]["count"] == len(waits) == SHARDS * PER_SHARD // BATCH
    assert snap["streamio_prefetch_depth"] == 0
    metrics.reset()
    proxy.clear()
    dataset.set_epoch(1)
    _, snap = timed_epoch(DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=_sizes))
    assert shard_gets(proxy) == set()
    assert (snap["streamio_cache_misses_total"], snap["streamio_cache_hits_total"]) == (0, SHARDS)
    assert snap["streamio_loader_batches_total"] == 0  # a plain DataLoader is not measured: no loader counts


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_holds_no_prefetch_depth_and_keeps_its_last_report(
    open_dataset: Callable[..., StreamingDataset], proxy: FaultProxy
) -> None:
    in_order = open_dataset(shuffle=False)  # 3 shards per worker: run 0 read, runs 1-2 fetched ahead
    metrics.reset()
    others = {p.pid for p in multiprocessing.active_children()}
    it = iter(StreamingDataLoader(in_order, num_workers=2, collate_fn=_sizes))
    next(it)
    workers = [p.pid for p in multiprocessing.active_children() if p.pid not in others]
    time.sleep(processes.REPORT_EVERY_S * 1.5)  # each worker reported once, blocked on its full queue
    before = metrics.snapshot()
    assert before["streamio_prefetch_depth"] == 4 and before["streamio_cache_misses_total"] == SHARDS
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        for _ in it:
            pass
    del it
    gc.collect()
    after = metrics.snapshot()
    assert after["streamio_prefetch_depth"] == 0  # what the dead worker held is held no more
    assert after["streamio_cache_misses_total"] == SHARDS  # its last report stays counted


# ---------------------------------------------------------------------------- the counting rule, without a server
class _Object:
    """An object in memory whose fetches are counted (what the store would have seen)."""

    def __init__(self, size: int) -> None:
        self.data = bytes(i * 7 & 0xFF for i in range(size))
        self.fetches = 0

    def fetch(self, start: int, end: int) -> Iterator[bytes]:
        self.fetches += 1
        yield self.data[start:end]

    def source(self) -> Source:
        return Source("k" * 40, "mem://obj", len(self.data), checksum_bytes(self.data), self.fetch)


def _counts() -> tuple[float, float]:
    snap = metrics.snapshot()
    return snap["streamio_cache_misses_total"], snap["streamio_cache_hits_total"]


def test_misses_are_the_fetches_reads_started_and_a_prefetched_read_counts_once(tmp_path: Path) -> None:
    core, obj = CacheCore(CacheConfig(tmp_path / "c", max_bytes=1 << 20)), _Object(5000)
    src = obj.source()
    metrics.reset()
    assert b"".join(core.open_range(src, 0, 5000)) == obj.data  # cold: downloads
    assert b"".join(core.open_range(src, 100, 200)) == obj.data[100:200]  # committed: a hit
    assert (_counts(), obj.fetches) == ((1, 1), 1)
    core.invalidate(src.key)
    assert core.fill(src) and b"".join(core.open_range(src, 0, 5000, prefetched=True)) == obj.data
    assert core.fill(src) and b"".join(core.open_range(src, 0, 10, prefetched=True)) == obj.data[:10]
    assert (_counts(), obj.fetches) == ((2, 2), 2)  # one miss, then one hit: each read once
    # a committed file damaged since (its size changed): the prefetch's look found it (a hit), the
    # consumer's verification discarded it and fetched again: that fetch is a miss too
    data_file = next(p for p in (tmp_path / "c").iterdir() if p.name.endswith(".data"))
    data_file.write_bytes(obj.data[:-1])
    assert core.fill(src) and b"".join(core.open_range(src, 0, 5000, prefetched=True)) == obj.data
    assert (_counts(), obj.fetches) == ((3, 3), 3)


def test_an_object_larger_than_the_cache_is_a_miss_per_read(tmp_path: Path) -> None:
    core, obj = CacheCore(CacheConfig(tmp_path / "c", max_bytes=1000)), _Object(5000)
    metrics.reset()
    assert b"".join(core.open_range(obj.source(), 0, 5000)) == obj.data
    assert not core.fill(obj.source())  # the prefetcher streams it itself: a fetch, so a miss
    assert (_counts(), obj.fetches) == ((2, 0), 1)
