"""Background fetching of a worker's next runs, bounded in bytes, delivered in order.

A DataLoader worker reads its plan as a list of byte runs (one shard, ``[start, end)``, computed
from the sample offsets of the index). :class:`Prefetcher` keeps up to ``workers`` of the next
runs in flight on a small thread pool while the consumer parses the current one::

    runs = [ByteRun(index.shards[r.shard], *index.layout(r.shard, store).byte_range(r.first, r.end))
            for r in plan_runs]                      # planner runs (shard, first, end) -> bytes
    for run, chunks in Prefetcher(store, runs, cache=cache):
        for sample in iter_samples(chunks, url=store.url(run.shard.path), span=SampleSpan(run.start, ...), ...):
            ...

Moving on to the next run drops whatever is left of the current one (its bytes are not read).

Design:

* **In order.** Run ``i`` is yielded before run ``i + 1``; each run's chunks arrive in byte order.
  Threads only decide *when* bytes arrive, never their order.
* **Bounded in bytes.** Fetched chunks wait in per-run queues whose total is capped by
  ``PrefetchConfig.max_bytes``, so a plan of 2 GB shards holds no more memory than one of 16 MB
  shards. To never deadlock, the run the consumer is reading may always add one chunk to an empty
  queue: memory is at most ``max_bytes + (workers + 2) x chunk_size`` (that chunk, one per thread
  between the store and its queue, and the one the consumer holds).
* **Cache first.** With a :class:`~streamio.data.cache.ShardCache`, the threads do not hold
  bytes at all: each one makes sure its run's shard is cached or being cached
  (``ShardCache.fetch``: download range-first into the cache, or nothing if it is cached or another
  process on the node is downloading it), and the consumer reads the run with ``open_range``,
  from the committed file or following the download in flight. The prefetch then costs no memory
  (the bytes are in the page cache anyway), the download never waits for a slow consumer (other
  processes following it are not throttled), and cached shards are read without touching the
  network. The bound in bytes is then the cache's (``workers x`` the largest shard, checked at
  start). Only runs that do not fit the cache (or all runs, without a cache) are streamed into
  memory, under ``max_bytes``.
* **Errors at the consumer.** An exception in a fetching thread is raised by the consumer's
  iterator at the point of the stream where it happened (after the bytes that arrived before it),
  with its original traceback.
* **Clean shutdown.** Closing the iterator (``break``, generator ``close()``, garbage collection,
  or :meth:`Prefetcher.close`) stops the threads after their current chunk: downloads into the
  cache stop uncommitted and resumable, streams are closed, every cache lock is released.
* **Fork/spawn safe.** Nothing live exists until iteration starts: build the prefetcher in the
  worker process, or pickle its configuration into it.

Depth: ``streamio_prefetch_depth`` (:mod:`streamio.metrics`) counts the runs whose fetch started
before the consumer reached them (each run is one shard's range), moved under the lock the threads
already take when a run starts or the consumer moves on; it is back to 0 once the iterator ends or
is closed (:meth:`Prefetcher.close`), and a DataLoader worker's depth is summed with the others'.

Stats: :attr:`Prefetcher.stats` (a :class:`~streamio.data.cache.ReadStats`) counts bytes from the
network and from the cache, hits/misses, and the seconds the consumer waited (``stall_s``); they
are logged at debug level when iteration ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from streamio import threads
from streamio.data.cache import ReadStats, ShardCache
from streamio.data.format.layout import ShardInfo
from streamio.errors import ConfigError, CorruptDataError
from streamio.metrics.catalog import PREFETCH_DEPTH
from streamio.storage import Store

log = logging.getLogger(__name__)

__all__ = ["ByteRun", "PrefetchConfig", "Prefetcher"]


@dataclass(frozen=True)
class ByteRun:
    """Bytes ``[start, end)`` of one shard: a run of whole samples, as the dataset computes it.

    Attributes:
        shard: the shard as the index records it.
        start: byte offset of the run's first sample.
        end: byte offset just past its last sample.
        store: the store the shard path is relative to, when not the prefetcher's (a mixture's
            sources may live in different stores).
    """

    shard: ShardInfo
    start: int = 0
    end: int | None = None
    store: Store | None = field(default=None, compare=False)

    @property
    def stop(self) -> int:
        """``end``, or the shard's size when ``end`` is None."""
        return self.shard.bytes if self.end is None else self.end


@dataclass(frozen=True)
class PrefetchConfig:
    """How far ahead to fetch.

    Attributes:
        workers: runs fetched at once (threads), i.e. the prefetch depth in runs. With a cache,
            each holds up to one whole shard of cache space: the cache must hold ``workers x``
            the largest shard, checked at start.
        max_bytes: cap on the bytes fetched but not yet consumed held in memory (runs streamed
            without the cache; cached runs are prefetched to disk, bounded by the cache).
        chunk_size: bytes per network piece when no cache is used.
    """

    workers: int = 4
    max_bytes: int = 256 << 20
    chunk_size: int = 4 << 20

    def __post_init__(self) -> None:
        if self.workers < 1 or self.max_bytes < 1 or self.chunk_size < 1:
            raise ConfigError(f"PrefetchConfig{(self.workers, self.max_bytes, self.chunk_size)}: all must be positive")


@dataclass
class _Slot:
    chunks: deque[bytes] = field(default_factory=deque)
    done: bool = False
    local: bool = False  # committed in the cache: the consumer reads it itself
    abandoned: bool = False
    error: BaseException | None = None


class Prefetcher:
    """Iterate ``(run, chunks)`` over ``runs`` in order, fetching ahead in background threads.

    Args:
        store: the dataset store the shard paths are relative to.
        runs: this worker's runs, in reading order.
        cache: the node-local cache, or None to stream without caching.
        config: depth and memory bound.

    Raises:
        CacheTooSmallError: at construction, if the cache cannot hold ``config.workers`` of the
            largest shard in ``runs``.
    """

    def __init__(
        self,
        store: Store,
        runs: Iterable[ByteRun],
        *,
        cache: ShardCache | None = None,
        config: PrefetchConfig | None = None,
    ) -> None:
        self.store = store
        self.runs = list(runs)
        self.cache = cache
        self.config = config or PrefetchConfig()
        self.stats = ReadStats()
        for run in self.runs:
            if not 0 <= run.start <= run.stop <= run.shard.bytes:
                raise ConfigError(
                    f"run [{run.start}, {run.stop}) is outside shard {self._store(run).url(run.shard.path)!r} "
                    f"of {run.shard.bytes} bytes"
                )
        if cache is not None and self.runs:
            largest = max(r.shard.bytes for r in self.runs)
            depth = min(self.config.workers, len({r.shard for r in self.runs}))
            cache.require(depth * largest + 4096, why=f"prefetching {depth} shards of up to {largest} bytes at once")
        # one lock, three conditions: the consumer waits for data, a run's thread for room, an idle
        # thread for its turn; each event wakes only those who wait for it (not 8 threads per chunk)
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # data: a slot appeared, got a chunk, finished or failed
        self._room = threading.Condition(lock)  # for a run's thread: buffer space freed, head moved, run abandoned
        self._turn = threading.Condition(lock)  # for an idle thread: the head moved, a new run may start
        self._slots: dict[int, _Slot] = {}
        self._head = 0
        self._next = 0
        self._buffered = 0
        self._stop = False
        self._depth = 0  # runs fetched ahead of the consumer, as last added to PREFETCH_DEPTH
        self._threads: list[threading.Thread] = []
        self._started = False

    def _store(self, run: ByteRun) -> Store:
        return run.store if run.store is not None else self.store

    def __iter__(self) -> Iterator[tuple[ByteRun, Iterator[bytes]]]:
        if self._started:
            raise ConfigError("a Prefetcher is iterated once; build a new one for another pass")
        self._started = True
        return self._iterate()

    def close(self) -> None:
        """Stop the fetching threads (after their current chunk) and drop buffered bytes."""
        with self._cond:
            self._stop = True
            for slot in self._slots.values():
                slot.chunks.clear()
            self._buffered = 0
            self._ahead()
            self._cond.notify_all()
            self._room.notify_all()
            self._turn.notify_all()
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:
                t.join(timeout=10)
        self._threads = []

    # ------------------------------------------------------------------ consumer side
    def _iterate(self) -> Iterator[tuple[ByteRun, Iterator[bytes]]]:
        started = time.perf_counter()
        try:
            n = min(self.config.workers, len(self.runs))
            for i in range(n):
                self._threads.append(threads.start(self._work, name=f"streamio-prefetch-{i}"))
            for index, run in enumerate(self.runs):
                with self._cond:
                    self._head = index
                    self._ahead()
                    self._room.notify_all()
                    self._turn.notify()  # the head moved by one: one more run may start
                chunks = self._chunks(index)
                try:
                    yield run, chunks
                finally:
                    chunks.close()
                    self._abandon(index)
        finally:
            self.close()
            log.debug(
                "prefetch of %d runs from %s done in %.3fs: %s",
                len(self.runs), self.store, time.perf_counter() - started, self.stats.as_dict(),
            )

    def _chunks(self, index: int) -> Iterator[bytes]:
        cond = self._cond
        while True:
            with cond:
                slot = self._slots.get(index)
                if slot is None or not (slot.chunks or slot.done):
                    waited = time.perf_counter()
                    while not self._stop:
                        slot = self._slots.get(index)
                        if slot is not None and (slot.chunks or slot.done):
                            break
                        cond.wait()
                    self.stats.add(stall_s=time.perf_counter() - waited)
                    if self._stop or slot is None:
                        return
                if slot.local:
                    break
                if slot.chunks:
                    chunk = slot.chunks.popleft()
                    self._buffered -= len(chunk)
                    self._room.notify_all()
                elif slot.error is not None:
                    error, slot.error = slot.error, None
                    raise error
                else:
                    return
            yield chunk
        # a cached run: read straight from disk in this thread (no queue, no copy, no read-ahead)
        run = self.runs[index]
        if self.cache is not None:
            yield from self.cache.open_range(
                self._store(run), run.shard, run.start, run.stop, stats=self.stats, prefetched=True
            )

    def _ahead(self) -> None:
        """Publish how many runs are fetched ahead of the consumer (under the lock; 0 once stopped).

        Runs start in order, so those ahead are the ones started past the head: ``_next - _head - 1``.
        """
        depth = 0 if self._stop else max(0, self._next - self._head - 1)
        if depth != self._depth:
            PREFETCH_DEPTH.add(depth - self._depth)
            self._depth = depth

    def _abandon(self, index: int) -> None:
        with self._cond:
            slot = self._slots.pop(index, None)
            if slot is not None:
                slot.abandoned = True
                self._buffered -= sum(len(c) for c in slot.chunks)
                slot.chunks.clear()
            self._room.notify_all()

    # ------------------------------------------------------------------ producer side
    def _work(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._stop and self._next < len(self.runs) and self._next >= self._head + self.config.workers:
                    self._turn.wait()
                if self._stop or self._next >= len(self.runs):
                    return
                index = self._next
                self._next += 1
                slot = self._slots[index] = _Slot()
                self._ahead()
                cond.notify_all()
            self._produce(index, slot)

    def _produce(self, index: int, slot: _Slot) -> None:
        run = self.runs[index]
        cond = self._cond
        if self.cache is not None:
            # download into the cache ahead of the consumer, who reads the file (or follows the
            # download) itself: no prefetched byte in memory, and the download never waits for it
            def started() -> None:
                with cond:
                    slot.local = slot.done = True
                    cond.notify_all()

            def cancelled() -> bool:
                return self._stop

            try:
                if self.cache.fetch(
                    self._store(run), run.shard, run.start, stats=self.stats, on_started=started, cancelled=cancelled
                ):
                    return
            except Exception as exc:  # noqa: BLE001 - the consumer's own read retries and raises it
                if slot.local:
                    url = self._store(run).url(run.shard.path)
                    log.debug("prefetch of %s failed (%s); the consumer reads it itself", url, exc)
                    return
                with cond:
                    slot.error, slot.done = exc, True
                    cond.notify_all()
                return
        # no cache, or no room in it: stream into memory, bounded by max_bytes
        source = self._stream(run)
        try:
            for chunk in source:
                with cond:
                    while not (self._stop or slot.abandoned) and not (
                        self._buffered + len(chunk) <= self.config.max_bytes
                        or (index == self._head and not slot.chunks)
                    ):
                        self._room.wait()
                    if self._stop or slot.abandoned:
                        return
                    slot.chunks.append(chunk)
                    self._buffered += len(chunk)
                    cond.notify_all()
        except BaseException as exc:  # re-raised at the consumer, in stream order
            with cond:
                slot.error = exc
        finally:
            source.close()
            with cond:
                slot.done = True
                cond.notify_all()

    def _stream(self, run: ByteRun) -> Iterator[bytes]:
        self.stats.add(bypasses=1)  # streamed without the cache
        got = run.start
        store = self._store(run)
        for chunk in store.iter_bytes(run.shard.path, run.start, run.stop, chunk_size=self.config.chunk_size):
            got += len(chunk)
            self.stats.add(bytes_from_network=len(chunk))
            yield chunk
        if got != run.stop:
            raise CorruptDataError(
                f"shard {store.url(run.shard.path)!r} ended after {got} bytes, before byte {run.stop} of the run; "
                f"the index says {run.shard.bytes} bytes. Re-run `streamio verify` on the dataset."
            )
