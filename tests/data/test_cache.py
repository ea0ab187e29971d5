"""ShardCache in one process: tee, hits without network, verification, atomicity, bounds, safety.

Network tests go over real HTTP: moto server behind the FaultProxy, whose request log is the
evidence of what crossed the network.
"""

from __future__ import annotations

import logging
import os
import pickle
import stat
import threading

import pytest

from streamio.checksum import checksum_bytes
from streamio.data.cache import CacheConfig, ShardCache
from streamio.data.format.index import ShardInfo
from streamio.errors import CacheError, CacheTooSmallError, CorruptDataError
from streamio.storage import Store
from streamio.testing import FaultProxy
from support.cache import bytes_fetched, cache_files, cache_for, gets_for, make_shards

MB = 1 << 20


def _data_files(directory: str) -> list[str]:
    return [n for n in cache_files(directory) if n.endswith(".data")]


def test_miss_then_hit_without_network(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    (shard, data), = make_shards(s3_store, 1, 3 * MB + 17)
    cache = cache_for(tmp_path / "c")
    proxy.clear()
    assert b"".join(cache.open_range(s3_store, shard)) == data
    assert bytes_fetched(proxy, shard.path) == shard.bytes
    assert cache.contains(s3_store, shard)
    proxy.clear()
    for start, end in [(0, shard.bytes), (5, 6), (MB + 3, 2 * MB + 9), (shard.bytes, shard.bytes)]:
        assert b"".join(cache.open_range(s3_store, shard, start, end)) == data[start:end]
    assert proxy.log() == []  # hits: not one request, not even a HEAD
    assert cache.stats.hits == 4 and cache.stats.misses == 1
    assert cache.stats.bytes_from_network == shard.bytes


def test_mid_shard_range_first_then_whole_shard_cached(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    (shard, data), = make_shards(s3_store, 1, 2 * MB)
    cache = cache_for(tmp_path / "c")
    proxy.clear()
    start, end = MB + 100, MB + 5000
    it = cache.open_range(s3_store, shard, start, end)
    first = next(it)
    assert first == data[start : start + len(first)]
    rest = b"".join(it)
    assert first + rest == data[start:end]
    # the first request started at the run, not at byte 0 (the proxy logs a GET when it ends; the
    # two GETs of one download run one after the other, so log order is request order)
    ranges = [r.range for r in gets_for(proxy, shard.path)]
    assert ranges == [f"bytes={start}-{shard.bytes - 1}", f"bytes=0-{start - 1}"], ranges
    # the whole shard was fetched exactly once and committed
    assert bytes_fetched(proxy, shard.path) == shard.bytes
    proxy.clear()
    assert b"".join(cache.open_range(s3_store, shard)) == data
    assert proxy.log() == []


def test_partial_file_never_visible_and_early_stop_resumes(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    (shard, data), = make_shards(s3_store, 1, 4 * MB)
    cache = cache_for(tmp_path / "c")
    proxy.clear()
    it = cache.open_range(s3_store, shard)
    got = next(it) + next(it)
    assert _data_files(str(tmp_path / "c")) == []  # in flight: only KEY.part
    assert any(n.endswith(".part") for n in cache_files(str(tmp_path / "c")))
    it.close()  # the consumer stops early
    assert not cache.contains(s3_store, shard)
    proxy.clear()
    assert b"".join(cache.open_range(s3_store, shard)) == data
    # resumed from the last byte written, never from byte 0, and nothing fetched twice since
    # (the first, abandoned GET may be logged late, when the proxy notices the closed connection)
    later = [r for r in gets_for(proxy, shard.path) if r.range and r.range.startswith(f"bytes={len(got)}-")]
    assert len(later) == 1 and later[0].response_bytes == shard.bytes - len(got), proxy.log()
    assert cache.stats.resumes == 1
    assert cache.contains(s3_store, shard)


def test_flipped_byte_in_cached_file_is_detected_and_refetched(
    s3_store: Store, proxy: FaultProxy, tmp_path, caplog
) -> None:
    (shard, data), = make_shards(s3_store, 1, MB)
    d = tmp_path / "c"
    cache = cache_for(d)
    assert b"".join(cache.open_range(s3_store, shard)) == data
    (name,) = _data_files(str(d))
    with open(d / name, "r+b") as f:  # bit rot / a stray writer
        f.seek(12345)
        b = f.read(1)
        f.seek(12345)
        f.write(bytes([b[0] ^ 1]))
    proxy.clear()
    with caplog.at_level(logging.WARNING, logger="streamio.data.cache"):
        assert b"".join(cache.open_range(s3_store, shard)) == data
    assert "checksum" in caplog.text and "discarded" in caplog.text
    assert bytes_fetched(proxy, shard.path) == shard.bytes
    assert cache.stats.discarded == 1
    proxy.clear()
    assert b"".join(cache.open_range(s3_store, shard)) == data and proxy.log() == []


def test_wrong_size_cached_file_is_refetched(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    (shard, data), = make_shards(s3_store, 1, MB)
    d = tmp_path / "c"
    cache = cache_for(d)
    b"".join(cache.open_range(s3_store, shard))
    (name,) = _data_files(str(d))
    os.truncate(d / name, 1000)
    proxy.clear()
    assert b"".join(cache.open_range(s3_store, shard, 10, 20)) == data[10:20]
    assert bytes_fetched(proxy, shard.path) == shard.bytes and cache.stats.discarded == 1


def test_unstamped_cache_file_is_verified_once(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    """A cache file from another boot (no valid stamp) is re-verified, then served, with no network."""
    (shard, data), = make_shards(s3_store, 1, MB)
    d = tmp_path / "c"
    b"".join(cache_for(d).open_range(s3_store, shard))
    for name in cache_files(str(d)):
        if name.endswith(".dl"):
            os.truncate(d / name, 0)  # stamp gone, as after a reboot
    proxy.clear()
    cache = cache_for(d)
    assert b"".join(cache.open_range(s3_store, shard)) == data
    assert proxy.log() == [] and cache.stats.hits == 1 and cache.stats.discarded == 0


def test_corrupted_download_is_discarded_not_committed(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    """A flipped byte on a ranged GET passes s3fs silently (docs/design.md): only our CRC sees it."""
    (shard, data), = make_shards(s3_store, 1, MB)
    cache = cache_for(tmp_path / "c")
    proxy.clear()
    proxy.corrupt_next(1, 5000, path_contains=shard.path)
    with pytest.raises(CorruptDataError, match=shard.path):
        b"".join(cache.open_range(s3_store, shard, 1000, 2000))  # a ranged GET first: [1000, size)
    assert gets_for(proxy, shard.path)[0].fault == "corrupt"
    assert _data_files(str(tmp_path / "c")) == []
    assert not any(n.endswith(".part") for n in cache_files(str(tmp_path / "c")))
    assert b"".join(cache.open_range(s3_store, shard)) == data  # fetched again, clean
    assert cache.contains(s3_store, shard)


def test_truncated_response_is_resumed(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    (shard, data), = make_shards(s3_store, 1, 2 * MB)
    cache = cache_for(tmp_path / "c", chunk_size=2 * MB)
    proxy.clear()
    proxy.truncate_next(1, 300_000, path_contains=shard.path)
    # as over a network: a client that has not read yet when the cut lands loses what aiohttp had
    # buffered and resumes from 0 (seen under load); trickled, it reads before the cut arrives
    proxy.set_bandwidth(4 << 20)
    assert b"".join(cache.open_range(s3_store, shard)) == data
    assert cache.contains(s3_store, shard)
    ranges = [r.range for r in gets_for(proxy, shard.path)]
    # the storage layer continued from the last byte it received (<= the cut), not from byte 0
    assert len(ranges) == 2, ranges
    resumed_at = int(ranges[1].split("=")[1].split("-")[0])
    assert 0 < resumed_at <= 300_000, ranges


def test_shard_shorter_than_index_says(s3_store: Store, tmp_path) -> None:
    (shard, data), = make_shards(s3_store, 1, 1000)
    s3_store.put(shard.path, data[:900])
    cache = cache_for(tmp_path / "c")
    with pytest.raises((CorruptDataError, OSError)):
        b"".join(cache.open_range(s3_store, shard))
    assert not cache.contains(s3_store, shard)


def test_two_threads_share_one_download(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    shards = make_shards(s3_store, 3, 2 * MB)
    cache = cache_for(tmp_path / "c", chunk_size=64 << 10)
    proxy.clear()
    proxy.set_latency(0.01)
    results: dict[int, list[bytes]] = {}

    def reader(i: int) -> None:
        results[i] = [b"".join(ShardCache(cache.config).open_range(s3_store, s)) for s, _ in shards]

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert results[i] == [d for _, d in shards]
    for s, _ in shards:
        assert bytes_fetched(proxy, s.path) == s.bytes


def test_eviction_is_lru_and_never_under_a_reader(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    size = MB
    shards = make_shards(s3_store, 4, size)
    d = str(tmp_path / "c")
    cache = cache_for(d, max_bytes=2 * size + 8192)
    held = cache.open_range(s3_store, shards[0][0])
    first = next(held)  # shard 0 leased (its download in progress)
    for s, data in shards[1:]:  # each needs room; shard 0 must survive
        assert b"".join(cache.open_range(s3_store, s)) == data
        assert sum(cache_files(d).values()) <= cache.config.max_bytes
    assert first + b"".join(held) == shards[0][1]
    assert cache.contains(s3_store, shards[0][0])
    # with shard 0 leased by a second reader and no room for two more, a new shard bypasses the cache
    lease = cache.open_range(s3_store, shards[0][0])
    next(lease)
    hold2 = cache.open_range(s3_store, shards[3][0])
    next(hold2)
    proxy.clear()
    assert b"".join(cache.open_range(s3_store, shards[1][0])) == shards[1][1]
    assert cache.stats.bypasses >= 1
    assert sum(cache_files(d).values()) <= cache.config.max_bytes
    lease.close()
    hold2.close()


def test_cache_dir_is_private_and_checked(tmp_path) -> None:
    d = tmp_path / "c"
    cache = cache_for(d)
    assert cache.usage() == 0
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(CacheError, match="chmod 700"):
        cache_for(open_dir).usage()
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(CacheError, match="symlink"):
        cache_for(link).usage()


def test_symlink_under_a_cache_name_is_never_followed(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    (shard, data), = make_shards(store, 1, 5000)
    d = tmp_path / "c"
    cache = cache_for(d)
    key = cache._key(store, shard)
    victim = tmp_path / "victim"
    victim.write_bytes(data)  # even a file with the right bytes must not be served through a link
    cache.usage()
    os.symlink(victim, d / f"{key}.data")
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    os.symlink(target, d / f"{key}.part")
    assert b"".join(cache.open_range(store, shard)) == data
    assert target.read_bytes() == b"keep" and victim.read_bytes() == data
    assert not os.path.islink(d / f"{key}.data") and os.path.isfile(d / f"{key}.data")
    assert cache.stats.misses == 1


def test_pickles_as_config_and_works_after_fork(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    (shard, data), = make_shards(store, 1, 5000)
    cache = cache_for(tmp_path / "c")
    b"".join(cache.open_range(store, shard))  # the parent has a live directory fd now
    clone = pickle.loads(pickle.dumps(cache))
    assert clone.config == cache.config and clone._core.directory._fd == -1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: same object, new process -> reopens its own fd
        ok = b"".join(cache.open_range(store, shard)) == data and cache._core.directory._pid == os.getpid()
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    os.close(r)


def test_require_and_bad_config(tmp_path) -> None:
    cache = cache_for(tmp_path / "c", max_bytes=10 * MB)
    cache.require(10 * MB)
    with pytest.raises(CacheTooSmallError, match=f"max_bytes >= {10 * MB + 1}"):
        cache.require(10 * MB + 1)
    with pytest.raises(CacheTooSmallError):
        CacheConfig(str(tmp_path), 0)
    store = Store(str(tmp_path / "ds"))
    (shard, _), = make_shards(store, 1, 100)
    with pytest.raises(ValueError, match="outside shard"):
        cache.open_range(store, shard, 50, 101)


def test_shard_larger_than_cache_streams_uncached(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    (shard, data), = make_shards(store, 1, 100_000)
    cache = cache_for(tmp_path / "c", max_bytes=50_000)
    assert b"".join(cache.open_range(store, shard)) == data
    assert cache.stats.bypasses == 1 and not cache.contains(store, shard)


def test_changed_shard_gets_a_new_cache_entry(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    (shard, data), = make_shards(store, 1, 1000)
    cache = cache_for(tmp_path / "c")
    b"".join(cache.open_range(store, shard))
    new = b"x" * 1000
    store.put(shard.path, new)
    info = ShardInfo(shard.path, 1000, 1, checksum_bytes(new))
    assert b"".join(cache.open_range(store, info)) == new
    assert b"".join(cache.open_range(store, shard)) == data  # the old entry is still a valid hit


def test_free_disk_floor_is_respected(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    (shard, data), = make_shards(store, 1, 10_000)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    cache = cache_for(tmp_path / "c", min_free_bytes=free + (1 << 40))  # a floor above the free space
    assert b"".join(cache.open_range(store, shard)) == data
    assert cache.stats.bypasses == 1 and not cache.contains(store, shard)
    assert cache.fetch(store, shard) is False  # a prefetcher is told to stream it itself


def test_empty_shard_and_fetch(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    store.put("empty.tar", b"")
    empty = ShardInfo("empty.tar", 0, 0, checksum_bytes(b""))
    cache = cache_for(tmp_path / "c")
    assert b"".join(cache.open_range(store, empty)) == b""
    assert cache.contains(store, empty)
    (shard, data), = make_shards(store, 1, 300_000)
    started = []
    assert cache.fetch(store, shard, 1000, on_started=lambda: started.append(1)) is True
    assert started == [1] and cache.contains(store, shard) and cache.stats.misses == 2
    assert b"".join(cache.open_range(store, shard, 7, 70_000)) == data[7:70_000]
    assert cache.stats.hits == 1


def test_lock_files_of_uncached_shards_do_not_accumulate(tmp_path) -> None:
    store = Store(str(tmp_path / "ds"))
    shards = make_shards(store, 6, 50_000)
    d = str(tmp_path / "c")
    cache = cache_for(d, max_bytes=60_000, chunk_size=10_000)  # room for one shard
    held = cache.open_range(store, shards[0][0])
    next(held)  # shard 0 leased: the others stream uncached, leaving their (empty) lock files
    for s, data in shards[1:]:
        assert b"".join(cache.open_range(store, s)) == data
    assert cache.stats.bypasses == 5
    assert len(cache_files(d)) > 4
    held.close()
    assert b"".join(cache.open_range(store, shards[1][0])) == shards[1][1]
    names = cache_files(d)
    assert len([n for n in names if n.endswith(".data")]) == 1
    assert len(names) <= 1 + 3, sorted(names)  # .lock + one shard's .data/.dl/.use
