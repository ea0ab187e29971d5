"""Time to first byte through the cache on a large shard behind a 30 ms first-byte latency.

The promise (issue 5, DESIGN invariant 6): the first sample is available after one latency plus its
own bytes, not after the whole shard. Both times are measured in the same test on the same server,
so the ratio, not an absolute figure, is asserted.

Why the link is capped at 40 MB/s per connection: moto prepares a whole object in memory before
its first byte (measured here: ~0.1 s for 64 MB, about a third of raw boto3's whole-object time on
loopback), a cost real object stores do not have. Without a realistic link speed (one S3 stream
moves ~50-200 MB/s), no reader, boto3 included, could show first-byte < 1/4 whole-shard time on
moto; with it, moto's fixed cost stays what it is and the transfer dominates as it does in reality.
"""

from __future__ import annotations

import time

import pytest

from streamio.storage import Store
from streamio.testing import FaultProxy
from support.cache import cache_for, make_shards

pytestmark = pytest.mark.slow


def test_first_chunk_arrives_long_before_the_whole_shard(s3_store: Store, proxy: FaultProxy, tmp_path) -> None:
    (shard, data), = make_shards(s3_store, 1, 64 << 20)
    cache = cache_for(tmp_path / "c", chunk_size=64 << 10)  # 64 KB: one sample's worth
    proxy.clear()
    proxy.set_latency(0.03)
    proxy.set_bandwidth(40e6)
    t0 = time.perf_counter()
    it = cache.open_range(s3_store, shard)
    first = next(it)
    t_first = time.perf_counter() - t0
    total = len(first)
    head_ok = first == data[: len(first)]
    for chunk in it:
        total += len(chunk)
    t_whole = time.perf_counter() - t0
    assert head_ok and total == shard.bytes and cache.contains(s3_store, shard)
    assert t_first >= 0.03  # the latency was really there
    assert t_first < t_whole / 4, (t_first, t_whole)
