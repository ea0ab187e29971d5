"""The cache protocol over one directory, for objects described by :class:`Source` values.

No Store and no index here: bytes come from ``Source.fetch(start, end)`` and time from the
``clock`` / ``sleep`` callables (tenacity takes ``sleep=`` for the same reason), so the whole
single-process protocol (hits, range-first downloads, follow and takeover, eviction, corrupted
files) runs in unit tests against an in-memory fetcher and a fake clock. The facade
(:class:`~streamio.data.cache.ShardCache`) turns a store and an index entry into a ``Source``.

Each call holds the object's reader lease (``KEY.use``, ``flock`` shared) from start to end: eviction
takes it exclusive and non-blocking, so an object being read is never evicted under its reader; the
lease file's mtime is the LRU clock. Inside the lease, one look (:meth:`CacheCore._claim`) decides:

* **hit** — a committed file, verified (:mod:`~streamio.data.cache.verify`): read from local disk;
* **download** — nobody has it: this call takes ``KEY.dl`` and downloads (:class:`Download`);
* **busy** — another thread or process downloads it: follow the ``.part`` (:class:`Follower`), then
  look again (it committed, or its downloader went away and this call takes over);
* **full** — no room can be made (every object in the cache is leased): stream it uncached.

``open_range`` (a reader) and ``fill`` (a prefetcher: cached or being cached, no bytes handed over)
share that one look.

**Hits and misses** (``streamio_cache_hits_total`` / ``streamio_cache_misses_total``,
:mod:`streamio.metrics`) count *reads*: one per ranged read of a shard (a run). A miss is every look
that sends the read to the store: it starts or resumes the download, or streams the object uncached
(no room, or larger than the cache). A hit is a read whose first look found the object committed,
or being downloaded by another reader on the node (this read fetched nothing). A prefetcher's
``fill`` is the first look of the read its consumer's ``open_range(..., prefetched=True)`` then
serves, so that read counts once. So ``misses`` is the number of fetches from the store this
process's reads started, and ``hits + misses`` the number of runs read, except for a read that
fetched after all (it took over the download of a reader that died, or its committed file failed
verification): it counts a hit and a miss.

A write the system refuses (file-size limit, full disk, read-only, permissions, the directory
removed: :func:`~streamio.data.cache.directory.write_refused`) is a
:class:`~streamio.errors.CacheWriteError`; under ``CacheConfig(on_error="bypass")`` the read goes on
from the store without the cache, from the byte it had reached, logged once per cause. Any other
``OSError`` of the cache's own files is a :class:`~streamio.errors.CacheError` naming the directory.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from streamio.data.cache.config import CacheConfig
from streamio.data.cache.directory import CacheDirectory, read_chunks, write_refused
from streamio.data.cache.eviction import make_room, usage
from streamio.data.cache.source import Source
from streamio.data.cache.stats import Counters, ReadStats
from streamio.data.cache.transfer import RESERVE, Download, Follower
from streamio.data.cache.verify import open_verified
from streamio.errors import CacheError, CacheWriteError, CorruptDataError, StreamioError
from streamio.flocks import release
from streamio.metrics.catalog import CACHE_HITS, CACHE_MISSES

log = logging.getLogger(__name__)

__all__ = ["CacheCore"]


class _Hit:
    """A committed file: its verified fd (None when the caller did not ask for verification)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int | None) -> None:
        self.fd = fd


_BUSY = "busy"  # another reader downloads the object
_FULL = "full"  # no room: stream it uncached


class CacheCore:
    """The node-local cache of one directory, for any byte objects (see the module docstring).

    Args:
        config: where and how big.
        clock: seconds, monotonic; measures how long readers wait (``stall_s``).
        sleep: how a follower waits for a download to progress.
    """

    def __init__(
        self,
        config: CacheConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.config = config
        self.stats = ReadStats()
        self.directory = CacheDirectory(os.fspath(config.directory))
        self._clock, self._sleep = clock, sleep
        self._warned: set[int] = set()  # errno values of refused writes already logged

    def fits(self, size: int) -> bool:
        """Whether an object of ``size`` bytes can be cached at all (else it is always streamed)."""
        return size + RESERVE <= self.config.max_bytes

    # ------------------------------------------------------------------ readers
    def open_range(
        self, src: Source, start: int, end: int, *, stats: ReadStats | None = None, prefetched: bool = False
    ) -> Iterator[bytes]:
        """Yield ``[start, end)`` of ``src`` as it arrives: from the cache, a download, or a follow.

        Closing the generator early leaves a download resumable and releases every lock.
        ``prefetched``: :meth:`fill` made the first look of this read (and counted it: see the module docstring).

        Raises:
            CorruptDataError: the object does not match its size or checksum.
            CacheError: the cache directory is unsafe or unusable.
        """
        counters = Counters(self.stats, stats)
        if not self.fits(src.size):
            log.warning(
                "shard %s (%d bytes) is larger than cache %s can hold; streaming it uncached",
                src.url, src.size, self.directory.path,
            )
            if not prefetched:
                CACHE_MISSES.add(1.0)
            yield from self.bypass(src, start, end, counters)
            return
        pos, cached = start, self._cached_range(src, start, end, counters, count=not prefetched)
        try:
            for chunk in cached:
                pos += len(chunk)
                yield chunk
        except OSError as exc:
            self._refused(exc, src)  # raises unless the policy bypasses it
            yield from self.bypass(src, pos, end, counters)
        finally:
            cached.close()

    def _cached_range(self, src: Source, start: int, end: int, counters: Counters, *, count: bool) -> Iterator[bytes]:
        """:meth:`open_range` through the cache (the one look, then a hit, a download or a follow)."""
        with self._lease(src.key):
            pos = start
            while True:
                claim = self._claim(src, pos, counters, verify=True)
                _count_read(claim, first=count)  # see the module docstring
                count = False
                if isinstance(claim, _Hit):
                    yield from self._read_hit(claim, pos, end, counters)
                    return
                if isinstance(claim, Download):
                    with claim:
                        yield from claim.run(pos, end)
                    return
                if claim == _FULL:
                    yield from self.bypass(src, pos, end, counters)
                    return
                pos = yield from Follower(self.directory, self.config, src, counters, self._wait).read(pos, end)
                if pos >= end:
                    return
                # the downloader went away (or committed): look again

    def fill(
        self,
        src: Source,
        start: int = 0,
        *,
        stats: ReadStats | None = None,
        on_started: Callable[[], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> bool:
        """Make sure ``src`` is cached or being cached, without handing bytes over (a prefetcher's call).

        Args:
            src: the object.
            start: where the consumer will start reading: a download fetches ``[start, size)`` first.
            stats: an extra counter object updated beside :attr:`stats`.
            on_started: called once the object is cached, or its download (by this call or by
                another reader) is under way.
            cancelled: polled after each piece; True stops the download (it stays resumable).

        Returns:
            False when the cache has no room for it: the caller must stream it without the cache.
        """
        counters = Counters(self.stats, stats)
        if not self.fits(src.size):
            CACHE_MISSES.add(1.0)  # the caller streams it from the store
            return False
        started = False

        def start_reading() -> None:
            nonlocal started
            started = True
            if on_started is not None:
                on_started()

        try:
            return self._fill(src, start, counters, start_reading, cancelled)
        except OSError as exc:
            self._refused(exc, src)  # raises unless the policy bypasses it
            return started  # once started, the consumer reads (and bypasses) by itself

    def _fill(
        self, src: Source, start: int, counters: Counters, on_started: Callable[[], None],
        cancelled: Callable[[], bool] | None,
    ) -> bool:
        with self._lease(src.key):
            claim = self._claim(src, min(start, src.size), counters, verify=False)
            _count_read(claim, first=True)
            if claim == _FULL:
                return False
            on_started()
            if isinstance(claim, Download):
                with claim:
                    for _ in claim.run(src.size, src.size, cancelled):
                        pass  # pragma: no cover - nothing is yielded for an empty range
            return True

    def _refused(self, exc: OSError, src: Source) -> None:
        """Apply the error policy to ``exc``, raised by the cache while reading ``src``.

        Returns (the caller bypasses the cache) for a refused write under ``on_error="bypass"``;
        raises anything else: a StreamioError as it is (the store's errors among them), a refused
        write as a CacheWriteError, any other OSError as a CacheError naming the directory.
        """
        if isinstance(exc, StreamioError) and not isinstance(exc, CacheWriteError):
            raise exc
        what = f"the copy of {src.url} ({src.size} bytes)"
        error = exc if isinstance(exc, CacheWriteError) else write_refused(exc, self.directory.path, what)
        if error is None:
            raise CacheError(
                f"cache {self.directory.path!r}: {exc.strerror or exc} while reading {src.url}; check the "
                "directory's disk, or point CacheConfig(directory=...) elsewhere"
            ) from exc
        if self.config.on_error == "raise":
            if error is exc:
                raise error
            raise error from exc
        code = getattr(error.__cause__, "errno", None) or getattr(exc, "errno", None) or 0
        if code not in self._warned:
            self._warned.add(code)
            log.warning("%s. Reading %s (and what else it refuses) from the store without the cache", error, src.url)

    def bypass(self, src: Source, start: int, end: int, counters: Counters) -> Iterator[bytes]:
        """Stream ``[start, end)`` from ``src.fetch`` without caching it."""
        counters.add(bypasses=1)
        got = start
        for chunk in src.fetch(start, end):
            got += len(chunk)
            counters.add(bytes_from_network=len(chunk))
            yield chunk
        if got != end:
            raise CorruptDataError(
                f"shard {src.url!r} ended after {got} bytes; the index says {src.size}. "
                f"Re-run `streamio verify` on the dataset."
            )

    # ------------------------------------------------------------------ tools
    def contains(self, key: str) -> bool:
        """Whether a committed file exists for ``key`` (not verified; for tests and tools)."""
        return self.directory.is_file(key + ".data")

    def invalidate(self, key: str) -> None:
        """Discard the committed file of ``key`` (e.g. after a per-sample checksum failed on it)."""
        with self.directory.locked():
            self.directory.unlink(key + ".data")

    def usage(self) -> int:
        """Bytes used by the cache directory now (all its regular files)."""
        return usage(self.directory)

    # ------------------------------------------------------------------ the one look
    def _claim(self, src: Source, pos: int, counters: Counters, *, verify: bool) -> _Hit | Download | str:
        """Look at the object's state once (see the module docstring); a Download is the caller's to close."""
        directory, data = self.directory, src.key + ".data"
        while True:
            if verify:
                fd = open_verified(directory, src, self.stats, chunk_size=self.config.chunk_size)
                if fd is not None:
                    return _Hit(fd)
            elif directory.exists(data):
                return _Hit(None)
            dl = directory.lock(src.key + ".dl", shared=False, blocking=False)
            if dl is None:
                return _BUSY
            download = Download(directory, self.config, src, dl, counters)
            try:
                if directory.exists(data):
                    download.close()
                    continue  # committed between our look and the lock
                if download.prepare(pos, lambda need: make_room(directory, need, self.config, self.stats, why=src.url)):
                    return download
            except BaseException:
                download.close()
                raise
            download.close()
            return _FULL

    def _read_hit(self, hit: _Hit, pos: int, end: int, counters: Counters) -> Iterator[bytes]:
        assert hit.fd is not None
        counters.add(hits=1)
        try:
            for chunk in read_chunks(hit.fd, pos, end, chunk_size=self.config.chunk_size, where=self.directory.path):
                counters.add(bytes_from_cache=len(chunk))
                yield chunk
        finally:
            os.close(hit.fd)

    @contextmanager
    def _lease(self, key: str) -> Iterator[None]:
        """Hold the reader lease of ``key`` (shared) and touch it: the LRU clock."""
        lease = self.directory.lock(key + ".use", shared=True, blocking=True)
        if lease is None:  # pragma: no cover - blocking locks always return an fd
            raise CacheError(f"cannot lock {self.directory.where(key + '.use')!r}")
        try:
            os.utime(lease)
            yield
        finally:
            release(lease)

    def _wait(self, seconds: float) -> float:
        """Sleep ``seconds``; the seconds that really passed (a reader's stall)."""
        before = self._clock()
        self._sleep(seconds)
        return self._clock() - before


def _count_read(claim: _Hit | Download | str, *, first: bool) -> None:
    """Count a look of a read: a miss when it downloads the object or streams it uncached; a hit,
    at the read's ``first`` look only, when the cache has it or another reader is downloading it."""
    if isinstance(claim, Download) or claim == _FULL:
        CACHE_MISSES.add(1.0)
    elif first:
        CACHE_HITS.add(1.0)
