"""``ShardCache``: the cache as the data path uses it, shards of a store in, bytes out.

It turns ``(store, shard)`` into what the core (:class:`~streamio.data.cache.core.CacheCore`) works
on: a :class:`~streamio.data.cache.source.Source` whose ``fetch(start, end)`` is
``store.iter_bytes`` (which resumes on resets by ranged GET) and whose key is a hash of the store
URL, shard path, size and checksum, so no user-controlled string becomes a file name and a
rewritten shard gets a new key.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from streamio.data.cache.config import CacheConfig
from streamio.data.cache.core import CacheCore
from streamio.data.cache.source import Source
from streamio.data.cache.stats import ReadStats
from streamio.data.format.layout import ShardInfo
from streamio.errors import CacheTooSmallError, ConfigError
from streamio.storage import Store

__all__ = ["ShardCache"]

_KEY_HEX_DIGITS = 40


class ShardCache:
    """The node-local shard cache; see :mod:`streamio.data.cache` for the protocol.

    Args:
        config: where and how big.
        clock: seconds, monotonic: measures the time readers wait (``stats.stall_s``).
        sleep: how a reader waits for another process's download to progress.

    A ``ShardCache`` pickles as its config (``clock`` and ``sleep`` are the defaults again on the
    other side): nothing live crosses a fork or spawn, and the directory is opened lazily per process.
    """

    def __init__(
        self,
        config: CacheConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.config = config
        self._core = CacheCore(config, clock=clock, sleep=sleep)
        self.stats: ReadStats = self._core.stats

    # pickles as its config: nothing live crosses a fork or spawn
    def __reduce__(self) -> tuple[Any, ...]:
        return (ShardCache, (self.config,))

    def __repr__(self) -> str:
        return f"ShardCache({self._core.directory.path!r}, max_bytes={self.config.max_bytes})"

    def require(self, nbytes: int, *, why: str = "the prefetch depth") -> None:
        """Fail now if the limit cannot hold ``nbytes`` (what one process needs at once).

        Raises:
            CacheTooSmallError: naming the minimum size.
        """
        if self.config.max_bytes < nbytes:
            raise CacheTooSmallError(
                f"cache {self._core.directory.path!r}: max_bytes={self.config.max_bytes} is below the {nbytes} "
                f"bytes that {why} needs; set CacheConfig(max_bytes >= {nbytes}) or lower the prefetch depth"
            )

    def open_range(
        self,
        store: Store,
        shard: ShardInfo,
        start: int = 0,
        end: int | None = None,
        *,
        stats: ReadStats | None = None,
        prefetched: bool = False,
    ) -> Iterator[bytes]:
        """Yield the bytes ``[start, end)`` of ``shard`` as they arrive.

        From the committed cache file (a hit: no network at all), from this call's download
        (range-first: ``[start, size)``, then ``[0, start)``), or behind another reader's download.
        Close the generator to stop early: a download stopped early stays resumable.

        Args:
            store: the dataset store ``shard.path`` is relative to.
            shard: the shard as the index records it (size and CRC32C are trusted).
            start: first byte wanted.
            end: end of the range (default: the end of the shard).
            stats: an extra counter object updated beside :attr:`stats` (a prefetcher's).
            prefetched: :meth:`fetch` began this read (a prefetcher's consumer): the read's cache
                hit or miss was counted there (:mod:`streamio.data.cache.core`: one per read).

        Raises:
            ValueError: the range is outside the shard (at once, not when iterated).
            CorruptDataError: the downloaded shard does not match its size or checksum (the partial
                file is discarded; the next call fetches it again).
            CacheError: the cache directory is unsafe or unusable.
            StorageError: from the store, after its retries.
        """
        end = shard.bytes if end is None else end
        if not 0 <= start <= end <= shard.bytes:
            raise ConfigError(
                f"range [{start}, {end}) is outside shard {store.url(shard.path)!r} of {shard.bytes} bytes"
            )
        return self._core.open_range(self._source(store, shard), start, end, stats=stats, prefetched=prefetched)

    def fetch(
        self,
        store: Store,
        shard: ShardInfo,
        start: int = 0,
        *,
        stats: ReadStats | None = None,
        on_started: Callable[[], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> bool:
        """Make sure ``shard`` is cached or being cached, without handing any bytes over.

        What a prefetcher calls ahead of the consumer, whose own :meth:`open_range` then reads the
        committed file or follows the download in flight: the download never waits for the
        consumer (so other processes following it are never throttled by this one's consumer),
        and no prefetched byte is held in memory.

        Args:
            store: the dataset store.
            shard: the shard as the index records it.
            start: where the consumer will start reading: the download fetches ``[start, size)``
                first, then ``[0, start)``.
            stats: an extra counter object updated beside :attr:`stats`.
            on_started: called once the shard is cached, or its download (by this call or by
                another reader) is under way: from then on ``open_range`` serves it.
            cancelled: polled after each piece; when it returns True the download stops (and
                stays resumable).

        Returns:
            False when the cache has no room for the shard (every shard in it is being read):
            the caller must stream it without the cache.
        """
        src = self._source(store, shard)
        return self._core.fill(src, start, stats=stats, on_started=on_started, cancelled=cancelled)

    def contains(self, store: Store, shard: ShardInfo) -> bool:
        """Whether a committed file exists for ``shard`` (not verified; for tests and tools)."""
        return self._core.contains(self._key(store, shard))

    def invalidate(self, store: Store, shard: ShardInfo) -> None:
        """Discard the cached copy of ``shard`` (e.g. after a per-sample checksum failed on it)."""
        self._core.invalidate(self._key(store, shard))

    def usage(self) -> int:
        """Bytes used by the cache directory now (all its regular files)."""
        return self._core.usage()

    @staticmethod
    def _key(store: Store, shard: ShardInfo) -> str:
        ident = "\0".join((store.root_url, shard.path, str(shard.bytes), shard.checksum))
        return hashlib.sha256(ident.encode()).hexdigest()[:_KEY_HEX_DIGITS]

    def _source(self, store: Store, shard: ShardInfo) -> Source:
        path, chunk_size = shard.path, self.config.chunk_size

        def fetch(start: int, end: int) -> Iterator[bytes]:
            return store.iter_bytes(path, start, end, chunk_size=chunk_size)

        return Source(self._key(store, shard), store.url(path), shard.bytes, shard.checksum, fetch)
