"""Node-local shard cache: filled while streaming, verified, atomic, bounded, shared by every process.

``ShardCache.open_range(store, shard, start, end)`` yields the bytes ``[start, end)`` of one shard
as they arrive. Three sources, chosen per call:

* **hit** — a committed, verified cache file: read from local disk, no network at all;
* **download** — nobody has the shard: this call becomes its *downloader*: it streams the shard
  from the store, writes every byte into a temp file beside the final name and yields the requested
  range as soon as its bytes have arrived; when the whole shard is there and its CRC32C matches
  ``shard.checksum`` the temp file is committed with one ``os.replace``;
* **follow** — another thread or process on the node is downloading the shard: this call reads the
  growing temp file behind it, guided by a progress record, and never opens a connection. If the
  downloader dies (its ``flock`` is released by the kernel) a follower takes the download over and
  continues from the last byte recorded.

Why whole shards, fetched range-first. The cache unit is the whole shard because the index has one
checksum per shard and because the other runs of the same shard (other DataLoader workers, other
ranks on the node) are then served locally. A downloader whose run starts mid-shard at byte ``A``
fetches ``[A, size)`` first and ``[0, A)`` last, so its first sample costs one request latency plus
that sample's bytes, exactly like a range-only read.

Files in the cache directory (``KEY`` = a hash of store URL, shard path, size and checksum):

* ``KEY.data`` — committed, verified shard; only ever appears through ``os.replace``.
* ``KEY.part`` — download in progress, preallocated to the full shard size.
* ``KEY.dl``   — the download lock (``flock`` exclusive, held by the downloader) and the progress /
  verification record.
* ``KEY.use``  — the reader lease: every reader holds it shared for the whole call; eviction takes
  it exclusive and non-blocking, so a shard being read is never evicted under its reader. Its
  mtime is the LRU clock.
* ``.lock``    — the directory lock, held briefly for reservations, eviction, discard and commit.

Call order: ``cache = ShardCache(CacheConfig(dir, max_bytes))`` -> (optional) ``cache.require(n)``
-> ``for chunk in cache.open_range(store, shard, start, end)`` (close the generator to stop early;
a download stopped early stays resumable) -> ``cache.stats``. A prefetcher calls
``cache.fetch(store, shard, start)`` in a background thread first: it downloads into the cache
without handing bytes over, and the consumer's ``open_range`` then follows that download.
:meth:`ShardCache.require` raises :class:`~streamio.errors.CacheTooSmallError` up front when a
limit cannot even hold what one process's prefetch depth needs; below that, a read that finds no
room *bypasses* the cache (streams without writing) rather than deadlock or exceed the limit.

Fork/spawn safety: a ``ShardCache`` holds only its :class:`CacheConfig` until first use in a
process; the directory descriptor is opened lazily per process id, and the cache pickles as its
config. Nothing is ever unpickled from the cache.

The design: docs/design.md "Node cache and prefetch"; the map of this package's modules (the
protocol core takes a ``fetch(start, end)`` callable and a clock, so it is unit-tested without a
server): docs/design.md "Layout and the direction of dependencies".
"""

from streamio.data.cache.config import CacheConfig
from streamio.data.cache.facade import ShardCache
from streamio.data.cache.stats import ReadStats

__all__ = ["CacheConfig", "ReadStats", "ShardCache"]
