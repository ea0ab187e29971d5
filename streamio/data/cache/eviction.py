"""Bounds: the directory's usage and free space, and LRU eviction of shards nobody holds.

Before a download, under the directory lock, the usage (sum of the sizes of every regular file in
the directory) and the free space are measured; lock files of shards that are no longer cached are
removed, then least-recently-used committed shards that no reader holds are evicted, then abandoned
partial downloads, until the new ``.part`` fits both the limit and the free-disk floor. If no room
can be made (every shard is leased), the caller *bypasses* the cache: it streams without writing,
so a small cache shared by many processes never deadlocks and never exceeds its limit.

``streamio_cache_bytes`` (:mod:`streamio.metrics`) is set from these measurements only (nothing
walks the directory for it): after a reservation, the usage measured plus the room reserved; after
:func:`usage`, what it measured.

The LRU clock is the newest mtime of a shard's ``KEY.data`` / ``KEY.part`` / ``KEY.use`` (every
reader touches its lease): file times are the one clock every process on the node shares.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from streamio.data.cache.config import CacheConfig
from streamio.data.cache.directory import CacheDirectory
from streamio.data.cache.stats import ReadStats
from streamio.flocks import release
from streamio.metrics.catalog import CACHE_BYTES

log = logging.getLogger(__name__)

__all__ = ["evict", "make_room", "usage"]

_ORPHANS_PER_PASS = 64  # lock files removed per reservation: bounded work under the directory lock


@dataclass
class _Entry:
    key: str
    data: int | None = None  # size of KEY.data, if any
    part: int | None = None  # size of KEY.part, if any
    used: int = 0  # LRU clock: newest mtime (ns) of its files


def _scan(directory: CacheDirectory) -> tuple[int, dict[str, _Entry]]:
    """Usage of the directory and its entries by key."""
    usage = 0
    entries: dict[str, _Entry] = {}
    for name, st in directory.entries():
        usage += st.st_size
        key, dot, suffix = name.partition(".")
        if not dot or not key:
            continue
        e = entries.setdefault(key, _Entry(key))
        if suffix == "data":
            e.data = st.st_size
        elif suffix == "part":
            e.part = st.st_size
        elif suffix != "use":
            continue
        e.used = max(e.used, st.st_mtime_ns)
    return usage, entries


def usage(directory: CacheDirectory) -> int:
    """Bytes used by the directory now (all its regular files)."""
    used = _scan(directory)[0]
    CACHE_BYTES.set(used)
    return used


def make_room(directory: CacheDirectory, need: int, config: CacheConfig, stats: ReadStats, *, why: str) -> bool:
    """Under the directory lock: evict LRU unleased shards until ``need`` more bytes fit.

    Args:
        directory: the cache directory (its lock held by the caller).
        need: bytes the caller is about to allocate.
        config: the limit and the free-disk floor.
        stats: where evictions are counted.
        why: what the room is for (a URL), for the debug log.

    Returns:
        Whether ``need`` bytes fit now.
    """
    usage, entries = _scan(directory)
    free = directory.free_bytes()

    def fits() -> bool:
        return usage + need <= config.max_bytes and free - need >= config.min_free_bytes

    # lock files of shards that were never cached (streamed uncached) or already evicted
    orphans = [e.key for e in entries.values() if e.data is None and e.part is None]
    for key in orphans[:_ORPHANS_PER_PASS]:
        evict(directory, key)
    if fits():
        CACHE_BYTES.set(usage + need)  # the caller allocates ``need`` under the same lock
        return True
    data = sorted((e for e in entries.values() if e.data is not None), key=lambda e: e.used)
    parts = [e for e in entries.values() if e.data is None and e.part is not None]
    for entry in data + parts:
        freed = evict(directory, entry.key)
        if freed:
            usage -= freed
            free += freed
            stats.add(evictions=1)
            log.debug("evicted %s (%d bytes) from %s to fit %s", entry.key, freed, directory.path, why)
            if fits():
                CACHE_BYTES.set(usage + need)
                return True
    CACHE_BYTES.set(usage)
    return False


def evict(directory: CacheDirectory, key: str) -> int:
    """Remove every file of ``key`` if nobody reads or downloads it; bytes freed (0: in use)."""
    lease = directory.lock(key + ".use", shared=False, blocking=False)
    if lease is None:
        return 0
    try:
        dl = directory.lock(key + ".dl", shared=False, blocking=False)
        if dl is None:
            return 0
        try:
            freed = directory.unlink(key + ".data") + directory.unlink(key + ".part")
            freed += directory.unlink(key + ".dl")
            directory.unlink(key + ".use")
            return freed
        finally:
            release(dl)
    finally:
        release(lease)
