"""Helpers for the cache / prefetch tests: raw-byte shards with a correct ShardInfo, a proxy fixture,
and the child-process readers the multi-process tests spawn (importable, so `spawn` can find them).

Shards here are random bytes, not tars: the cache works on byte ranges and whole-shard CRC32C only.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from streamio.checksum import checksum_bytes
from streamio.data.cache import CacheConfig, ShardCache
from streamio.data.format.layout import ShardInfo
from streamio.storage import RetryPolicy, Store
from streamio.testing import FaultProxy, RequestRecord, S3Endpoint

FAST_RETRY = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05, max_total=20)


def make_shards(
    store: Store, n: int, size: int, *, prefix: str = "shard", seed: int = 0
) -> list[tuple[ShardInfo, bytes]]:
    """Upload ``n`` shards of ``size`` deterministic pseudo-random bytes; return (info, bytes)."""
    out = []
    for i in range(n):
        data = pseudo_random(size + i, seed=seed * 1000 + i)
        path = f"{prefix}-{i:06d}.tar"
        store.put(path, data)
        out.append((ShardInfo(path, len(data), 1, checksum_bytes(data)), data))
    return out


def pseudo_random(size: int, *, seed: int) -> bytes:
    """Fast deterministic bytes (children regenerate them to compare without pipes)."""
    block = hashlib.sha256(f"streamio-{seed}".encode()).digest() * 2048  # 64 KiB
    reps = size // len(block) + 1
    return (block * reps)[:size] if size <= 1 << 16 else _mix(block, reps, size)


def _mix(block: bytes, reps: int, size: int) -> bytes:
    # vary each 64 KiB block so a shifted range can never compare equal by accident
    parts = [bytes([i & 0xFF]) + block[1:] for i in range(reps)]
    return b"".join(parts)[:size]


def gets_for(proxy: FaultProxy, path: str) -> list[RequestRecord]:
    """Successful GETs of one object through the proxy."""
    return [r for r in proxy.log() if r.method == "GET" and r.path.endswith("/" + path) and 200 <= r.status < 300]


def bytes_fetched(proxy: FaultProxy, path: str) -> int:
    """Body bytes the proxy sent for GETs of ``path`` (each byte counted each time it crossed)."""
    return sum(r.response_bytes for r in gets_for(proxy, path))


def cache_files(directory: str) -> dict[str, int]:
    """name -> size of every entry of the cache directory (entries removed meanwhile are skipped)."""
    out = {}
    with os.scandir(directory) as it:
        for e in it:
            try:
                out[e.name] = e.stat(follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return out


def cache_for(directory: Any, max_bytes: int = 1 << 30, **kw: Any) -> ShardCache:
    kw.setdefault("min_free_bytes", 0)
    kw.setdefault("chunk_size", 256 << 10)
    return ShardCache(CacheConfig(os.fspath(directory), max_bytes, **kw))


# ---------------------------------------------------------------------- child processes (spawn)
def store_spec(store: Store, s3: S3Endpoint, endpoint_url: str) -> tuple[str, dict[str, Any]]:
    """What a child needs to build the same store itself (a Store never pickles credentials)."""
    return store.root_url, s3.storage_options(endpoint_url)


def read_all(
    cache: ShardCache,
    spec: tuple[str, dict[str, Any]],
    shards: list[ShardInfo],
    seeds: list[int],
    out: Any,
    loops: int = 1,
) -> None:
    """Child: read every shard whole through the cache, compare with the expected bytes, report."""
    try:
        store = Store(spec[0], spec[1], retry=FAST_RETRY)
        for _ in range(loops):
            for shard, seed in zip(shards, seeds, strict=False):
                got = b"".join(cache.open_range(store, shard))
                expected = pseudo_random(shard.bytes, seed=seed)
                if got != expected:
                    out.put(("bad", shard.path, len(got)))
                    return
        out.put(("ok", cache.stats.as_dict()))
    except BaseException as exc:  # reported to the parent, which fails the test with it
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def read_slowly(cache: ShardCache, spec: tuple[str, dict[str, Any]], shard: ShardInfo, progress: Any) -> None:
    """Child: start reading a shard, report each chunk, and take its time (the parent kills it)."""
    store = Store(spec[0], spec[1], retry=FAST_RETRY)
    for chunk in cache.open_range(store, shard):
        progress.put(len(chunk))
        time.sleep(0.05)


def prefetch_all(
    cache: ShardCache, spec: tuple[str, dict[str, Any]], shards: list[ShardInfo], seeds: list[int], out: Any
) -> None:
    """Child: read every shard through a Prefetcher on the shared cache; report stats."""
    from streamio.data.read.prefetch import ByteRun, PrefetchConfig, Prefetcher

    try:
        store = Store(spec[0], spec[1], retry=FAST_RETRY)
        pf = Prefetcher(store, [ByteRun(s) for s in shards], cache=cache, config=PrefetchConfig(workers=3))
        for (run, chunks), seed in zip(pf, seeds, strict=False):
            if b"".join(chunks) != pseudo_random(run.shard.bytes, seed=seed):
                out.put(("bad", run.shard.path))
                return
        out.put(("ok", pf.stats.as_dict()))
    except BaseException as exc:
        out.put(("error", f"{type(exc).__name__}: {exc}"))
