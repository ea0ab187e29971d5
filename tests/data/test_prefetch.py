"""Prefetcher: order, byte bound, errors at the consumer, clean early shutdown, cache without network."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator

import pytest

from streamio.data.format.index import ShardInfo
from streamio.data.read.prefetch import ByteRun, PrefetchConfig, Prefetcher
from streamio.errors import CacheTooSmallError, ConfigError, CorruptDataError, ObjectNotFoundError
from streamio.storage import RetryPolicy, Store
from streamio.testing import FaultProxy
from support.cache import cache_for, make_shards

KB = 1 << 10


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("streamio-prefetch")]


class _CountingStore(Store):
    """A local store that records how many bytes are fetched but not yet consumed."""

    def __init__(self, url: str, outstanding: list[int], delay: float = 0.0) -> None:
        super().__init__(url)
        self.outstanding = outstanding
        self.delay = delay

    def iter_bytes(
        self, path: str, start: int = 0, end: int | None = None, *, chunk_size: int = 8 << 20
    ) -> Iterator[bytes]:
        for chunk in super().iter_bytes(path, start, end, chunk_size=chunk_size):
            if self.delay:
                time.sleep(self.delay)
            self.outstanding[0] += len(chunk)
            self.outstanding[1] = max(self.outstanding[1], self.outstanding[0])
            yield chunk


def test_in_order_with_mid_shard_runs(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    shards = make_shards(store, 6, 50 * KB)
    runs = [ByteRun(s, (i * 997) % 1000, s.bytes - i) for i, (s, _) in enumerate(shards)]
    runs.append(ByteRun(shards[0][0]))  # the same shard twice
    cfg = PrefetchConfig(workers=3, max_bytes=64 * KB, chunk_size=8 * KB)
    got = [(run, b"".join(chunks)) for run, chunks in Prefetcher(store, runs, config=cfg)]
    assert [r for r, _ in got] == runs
    data = dict((s.path, d) for s, d in shards)
    for run, body in got:
        assert body == data[run.shard.path][run.start : run.stop]
    assert not _prefetch_threads()


def test_bounded_in_bytes_not_runs(tmp_path) -> None:
    outstanding = [0, 0]
    store = _CountingStore(str(tmp_path / "ds"), outstanding)
    shards = make_shards(Store(str(tmp_path / "ds")), 4, 400 * KB)
    cfg = PrefetchConfig(workers=4, max_bytes=100 * KB, chunk_size=16 * KB)
    for _run, chunks in Prefetcher(store, [ByteRun(s) for s, _ in shards], config=cfg):
        for chunk in chunks:
            time.sleep(0.001)  # a slow consumer: producers run ahead until the bound stops them
            outstanding[0] -= len(chunk)
    # bytes fetched and not yet consumed never exceeded the bound + the one chunk the head run may
    # add + one chunk per thread between the store and its queue + the chunk the consumer holds
    assert outstanding[1] <= cfg.max_bytes + (cfg.workers + 2) * cfg.chunk_size
    assert outstanding[1] >= cfg.max_bytes // 2  # and it did prefetch


def test_error_raised_at_the_consumer_in_stream_order(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    shards = make_shards(store, 3, 20 * KB)
    missing = ShardInfo("gone-000001.tar", 1000, 1, shards[1][0].checksum)
    runs = [ByteRun(shards[0][0]), ByteRun(missing), ByteRun(shards[2][0])]
    seen = []
    with pytest.raises(ObjectNotFoundError, match="gone-000001.tar"):
        for run, chunks in Prefetcher(store, runs, config=PrefetchConfig(workers=3, chunk_size=4 * KB)):
            for chunk in chunks:
                seen.append((run.shard.path, len(chunk)))
    # run 0 fully delivered, then the error of run 1, and nothing of run 2 (fetched, never handed over)
    assert sum(n for p, n in seen if p == shards[0][0].path) == shards[0][0].bytes
    assert {p for p, _ in seen} == {shards[0][0].path}
    assert not _prefetch_threads()


def test_short_shard_is_an_error_not_a_short_run(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"), retry=RetryPolicy(max_attempts=1))
    (s, _), = make_shards(store, 1, 20 * KB)
    longer = ShardInfo(s.path, s.bytes + 100, 1, s.checksum)  # the index says more than there is
    with pytest.raises((CorruptDataError, OSError), match=s.path):
        for _, chunks in Prefetcher(store, [ByteRun(longer)]):
            b"".join(chunks)


@pytest.mark.parametrize("how", ["break", "close", "gc"])
def test_early_stop_shuts_down_cleanly(tmp_path, how: str) -> None:
    outstanding = [0, 0]
    store = _CountingStore(str(tmp_path / "ds"), outstanding, delay=0.002)
    shards = make_shards(Store(str(tmp_path / "ds")), 8, 200 * KB)
    cache = cache_for(tmp_path / "c", chunk_size=8 * KB)
    config = PrefetchConfig(workers=3, max_bytes=64 * KB)
    pf = Prefetcher(store, [ByteRun(s) for s, _ in shards], cache=cache, config=config)
    it = iter(pf)
    run, chunks = next(it)
    next(chunks)
    assert _prefetch_threads()
    if how == "break":
        for _ in it:
            break
        it.close()
    elif how == "close":
        it.close()
    else:
        del it, chunks, run
        gc.collect()
    deadline = time.monotonic() + 5
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _prefetch_threads()
    # locks were released: another reader can download and commit every shard now
    for s, data in shards:
        assert b"".join(cache.open_range(store, s)) == data


def test_cached_runs_need_no_network(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    shards = make_shards(s3_store, 4, 300 * KB)
    cache = cache_for(tmp_path / "c", chunk_size=64 * KB)
    runs = [ByteRun(s) for s, _ in shards]
    cold = Prefetcher(s3_store, runs, cache=cache, config=PrefetchConfig(workers=2))
    assert [b"".join(c) for _, c in cold] == [d for _, d in shards]
    assert cold.stats.misses == 4 and cold.stats.bytes_from_network == sum(s.bytes for s, _ in shards)
    proxy.clear()
    warm = Prefetcher(s3_store, runs, cache=cache, config=PrefetchConfig(workers=2))
    assert [b"".join(c) for _, c in warm] == [d for _, d in shards]
    assert proxy.log() == []
    assert warm.stats.hits == 4 and warm.stats.bytes_from_network == 0
    assert warm.stats.bytes_from_cache == sum(s.bytes for s, _ in shards)
    assert warm.stats.stall_s >= 0.0


@pytest.mark.parametrize("cached", [False, True])
def test_stall_time_is_measured(s3_store: Store, proxy: FaultProxy, tmp_path, cached: bool) -> None:
    shards = make_shards(s3_store, 2, 50 * KB)
    cache = cache_for(tmp_path / "c", chunk_size=8 * KB) if cached else None
    proxy.set_latency(0.1)
    pf = Prefetcher(s3_store, [ByteRun(s) for s, _ in shards], cache=cache, config=PrefetchConfig(workers=1))
    got = [b"".join(chunks) for _, chunks in pf]
    assert got == [d for _, d in shards]
    assert pf.stats.stall_s >= 0.09  # at least the first response's latency
    assert pf.stats.bytes_from_network == sum(s.bytes for s, _ in shards)
    if cached:  # the consumer read behind the prefetch thread's downloads
        assert pf.stats.misses == 2 and pf.stats.follows >= 1


def test_no_room_in_the_cache_streams_into_memory(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    shards = make_shards(store, 4, 100 * KB)
    cache = cache_for(tmp_path / "c", max_bytes=250 * KB, chunk_size=16 * KB)
    held = [cache.open_range(store, s) for s, _ in shards[:2]]
    for h in held:
        next(h)  # two shards leased: no room for a third
    pf = Prefetcher(store, [ByteRun(s) for s, _ in shards[2:]], cache=cache, config=PrefetchConfig(workers=1))
    assert [b"".join(c) for _, c in pf] == [d for _, d in shards[2:]]
    assert pf.stats.bypasses == 2 and pf.stats.misses == 0
    for h in held:
        h.close()


def test_cache_too_small_for_depth_fails_at_start(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    shards = make_shards(store, 4, 100 * KB)
    cache = cache_for(tmp_path / "c", max_bytes=250 * KB)
    with pytest.raises(CacheTooSmallError, match=r"max_bytes >= \d+"):
        Prefetcher(store, [ByteRun(s) for s, _ in shards], cache=cache, config=PrefetchConfig(workers=4))
    Prefetcher(store, [ByteRun(s) for s, _ in shards], cache=cache, config=PrefetchConfig(workers=2))


def test_iterated_once_and_validates_runs(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    (s, _), = make_shards(store, 1, 1000)
    pf = Prefetcher(store, [ByteRun(s)])
    list(pf)
    with pytest.raises(ConfigError, match="once"):
        iter(pf)
    with pytest.raises(ValueError, match="outside shard"):
        Prefetcher(store, [ByteRun(s, 10, 2000)])
