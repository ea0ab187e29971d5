"""The node-wide cache with real processes (spawned, as DataLoader workers and ranks are) over real
HTTP through the FaultProxy: one download per shard per node, kill -9 takeover, the byte limit
under concurrent eviction, and time to first byte on a large shard.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import threading
import time

import pytest

from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from support.cache import (
    bytes_fetched,
    cache_files,
    cache_for,
    gets_for,
    make_shards,
    prefetch_all,
    read_all,
    read_slowly,
    store_spec,
)

pytestmark = pytest.mark.slow
MB = 1 << 20
# forkserver: every child is a fresh process that gets its arguments pickled (as with spawn, so
# the cache and the store cross as configuration), but the imports are paid once per session
CTX = mp.get_context("forkserver")
CTX.set_forkserver_preload(["support.cache"])
SPAWN = mp.get_context("spawn")  # one test pays for a real spawn, as DataLoader workers may


def _results(queue, procs, timeout: float = 60) -> list[tuple]:  # type: ignore[no-untyped-def]
    out = [queue.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=timeout)
        assert p.exitcode == 0
    return out


def test_four_processes_download_each_shard_once(s3_store: Store, proxy: FaultProxy, s3: S3Endpoint, tmp_path) -> None:
    shards = make_shards(s3_store, 8, 256 << 10, seed=1)
    seeds = [1000 + i for i in range(8)]
    cache = cache_for(tmp_path / "c", chunk_size=64 << 10)
    proxy.clear()
    proxy.set_latency(0.02)  # every request slow enough that the readers overlap
    queue = CTX.Queue()
    spec = store_spec(s3_store, s3, proxy.endpoint_url)
    procs = [
        CTX.Process(target=read_all, args=(cache, spec, [s for s, _ in shards], seeds, queue)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    results = _results(queue, procs)
    assert all(r[0] == "ok" for r in results), results  # each compared all 8 shards byte for byte
    for s, _ in shards:
        assert bytes_fetched(proxy, s.path) == s.bytes, (s.path, [r.range for r in gets_for(proxy, s.path)])
    stats = [r[1] for r in results]
    assert sum(st["misses"] for st in stats) == 8
    assert sum(st["bytes_from_network"] for st in stats) == sum(s.bytes for s, _ in shards)
    assert sum(st["follows"] + st["hits"] for st in stats) == 3 * 8


def test_two_prefetching_processes_share_downloads(
    s3_store: Store, proxy: FaultProxy, s3: S3Endpoint, tmp_path
) -> None:
    """DataLoader workers of one node: each Prefetcher downloads ahead; the other follows."""
    shards = make_shards(s3_store, 6, 256 << 10, seed=3)
    seeds = [3000 + i for i in range(6)]
    cache = cache_for(tmp_path / "c", chunk_size=64 << 10)
    proxy.clear()
    proxy.set_latency(0.02)
    queue = CTX.Queue()
    spec = store_spec(s3_store, s3, proxy.endpoint_url)
    procs = [
        CTX.Process(target=prefetch_all, args=(cache, spec, [s for s, _ in shards], seeds, queue)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    results = _results(queue, procs)
    assert all(r[0] == "ok" for r in results), results
    for s, _ in shards:
        assert bytes_fetched(proxy, s.path) == s.bytes
    assert sum(r[1]["misses"] for r in results) == 6
    assert sum(r[1]["bytes_from_network"] for r in results) == sum(s.bytes for s, _ in shards)


def test_kill_9_mid_shard_leaves_no_final_file_and_is_taken_over(
    s3_store: Store, proxy: FaultProxy, s3: S3Endpoint, tmp_path
) -> None:
    (shard, data), = make_shards(s3_store, 1, 2 * MB)
    d = tmp_path / "c"
    cache = cache_for(d, chunk_size=64 << 10)
    proxy.clear()
    progress = CTX.Queue()
    child = CTX.Process(target=read_slowly, args=(cache, store_spec(s3_store, s3, proxy.endpoint_url), shard, progress))
    child.start()
    for _ in range(4):
        progress.get(timeout=60)
    # a second reader (this process) arrives while the child downloads: it follows
    follower: dict[str, object] = {}

    def follow() -> None:
        mine = cache_for(d, chunk_size=64 << 10)
        follower["data"] = b"".join(mine.open_range(s3_store, shard))
        follower["stats"] = mine.stats.as_dict()

    t = threading.Thread(target=follow)
    t.start()
    time.sleep(0.2)
    child.kill()  # SIGKILL mid-shard
    child.join()
    t.join(timeout=60)
    assert follower["data"] == data
    stats = follower["stats"]
    assert stats["follows"] == 1 and stats["resumes"] == 1, stats  # took the download over, resumed
    key = cache._key(s3_store, shard)
    assert cache.contains(s3_store, shard)
    ranges = [r.range for r in gets_for(proxy, shard.path)]
    assert ranges[-1] is not None and not ranges[-1].startswith("bytes=0-"), ranges
    assert bytes_fetched(proxy, shard.path) < 2 * shard.bytes
    # the dead child's lock is free
    fd = os.open(d / f"{key}.dl", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


def test_killed_reader_alone_leaves_only_a_resumable_part(
    s3_store: Store, proxy: FaultProxy, s3: S3Endpoint, tmp_path
) -> None:
    (shard, data), = make_shards(s3_store, 1, 2 * MB)
    d = tmp_path / "c"
    cache = cache_for(d, chunk_size=64 << 10)
    progress = SPAWN.Queue()
    spec = store_spec(s3_store, s3, proxy.endpoint_url)
    child = SPAWN.Process(target=read_slowly, args=(cache, spec, shard, progress))
    child.start()
    for _ in range(3):
        progress.get(timeout=60)
    child.kill()
    child.join()
    names = cache_files(str(d))
    assert not any(n.endswith(".data") for n in names), names  # never a partial file under the final name
    assert any(n.endswith(".part") for n in names)
    proxy.clear()
    fresh = cache_for(d, chunk_size=64 << 10)
    assert b"".join(fresh.open_range(s3_store, shard)) == data
    assert fresh.stats.resumes == 1
    assert gets_for(proxy, shard.path)[0].range.split("=")[1].split("-")[0] != "0"


def test_limit_of_three_shards_two_processes_ten_shards(
    s3_store: Store, proxy: FaultProxy, s3: S3Endpoint, tmp_path
) -> None:
    size = 256 << 10
    shards = make_shards(s3_store, 10, size, seed=2)
    seeds = [2000 + i for i in range(10)]
    d = tmp_path / "c"
    limit = 3 * (size + 10) + 4096
    cache = cache_for(d, max_bytes=limit, chunk_size=32 << 10)
    cache.usage()  # create the directory before the monitor starts
    proxy.set_latency(0.005)
    peak = [0]
    stop = threading.Event()

    def monitor() -> None:
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], sum(cache_files(str(d)).values()))
                time.sleep(0.0005)
            except FileNotFoundError:  # a file vanished between listing and stat
                continue

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    queue = CTX.Queue()
    order = [s for s, _ in shards]
    spec = store_spec(s3_store, s3, proxy.endpoint_url)
    procs = [
        CTX.Process(target=read_all, args=(cache, spec, order, seeds, queue, 3)),
        CTX.Process(target=read_all, args=(cache, spec, order[::-1], seeds[::-1], queue, 3)),
    ]
    for p in procs:
        p.start()
    try:
        results = _results(queue, procs, timeout=120)
    finally:
        stop.set()
        watcher.join()
    assert all(r[0] == "ok" for r in results), results  # no FileNotFoundError, every byte right
    assert 0 < peak[0] <= limit, (peak[0], limit)
    assert peak[0] > 2 * size  # the cache was really used up to its limit
    stats = [r[1] for r in results]
    assert sum(st["evictions"] for st in stats) > 0
