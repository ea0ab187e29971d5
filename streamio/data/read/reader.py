"""A worker's windows -> verified, decoded samples, in the plan's yield order.

:class:`WindowReader` is the I/O half of :class:`~streamio.data.dataset.StreamingDataset`: it turns
the planner's windows (:class:`~streamio.data.plan.Window`) into byte runs through the index,
fetches them ahead (:mod:`streamio.data.read.prefetch`, through the node cache when there is one),
parses and verifies each sample (:mod:`streamio.data.format.samples`) and yields them decoded, each
window in its permuted order.

* **Long reads.** Runs that continue each other (across windows) form one chain: a sequential or
  window-shuffled stream is one ranged read per shard run, whatever the window size. Where several
  chains are open at once (the cross-shard shuffle's lanes, a mixture's sources), each is read in
  segments of about 1 MiB, fetched in the order they are first needed (:mod:`streamio.data.read.schedule`):
  memory holds about one segment per open chain, and the prefetcher keeps up to 8 in flight.
* **Mixtures.** Sources may live in different stores; the plan numbers shards globally and the
  reader maps them back (:class:`SourceShards`); samples of a mixture carry ``__source__``.
* **Exact skip.** ``read(windows, skip)`` drops the first ``skip`` samples of the yield order
  (a worker resuming inside its stream): whole skipped windows are never read, a sequential one is
  trimmed, and only a partly skipped shuffled window is read and discarded in part.
* **Bit rot in the cache** (a cached shard that kept its size and mtime but fails a checksum) is
  discarded and fetched again once; a second failure is the data's.
* **Faults the user chose to skip** (``handler(exc)`` returns True for a missing, truncated or
  corrupt shard) drop the rest of that run, counted in :attr:`WindowReader.lost_samples` and
  logged; a missing sample still occupies its window slot (as ``None``), so windows stay aligned.
  The rest of the run is the rest of the segment being read.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from streamio.data.cache import ShardCache
from streamio.data.format.index import DatasetIndex
from streamio.data.format.samples import Handler, SampleSpan, iter_sample_batches
from streamio.data.plan import Run, Window
from streamio.data.read.prefetch import ByteRun, PrefetchConfig, Prefetcher
from streamio.data.read.schedule import Schedule, Segment, build_schedule
from streamio.errors import CorruptDataError, StorageError, StreamioError
from streamio.metrics import trace
from streamio.storage import Store

if TYPE_CHECKING:
    from streamio.data.format.layout import SampleLayout

__all__ = ["SourceShards", "WindowReader"]

_MAX_LANE_DEPTH = 8  # segments in flight at most when many chains are open (cache: whole shards each)

log = logging.getLogger(__name__)

Sample = dict[str, Any]


class SourceShards(NamedTuple):
    """One source of a reader: its store and index (its shards are numbered from ``offset`` on)."""

    store: Store
    index: DatasetIndex
    offset: int


class WindowReader:
    """Reads a worker's windows from one dataset or a mixture and yields its decoded samples.

    Args:
        sources: each source's store and index, in plan order (the plan numbers shards globally:
            source ``i``'s shard ``s`` is ``offset_i + s``).
        cache: the node-local cache, or None to stream without one.
        prefetch: read-ahead settings.
        decode: applied to each raw sample (``make_decoder``'s result).
        handler: ``handler(exc) -> bool`` for a shard that is missing, truncated or corrupt: True
            skips the rest of that segment, False or None raises.

    Attributes:
        lost_samples: samples this process skipped because ``handler`` said so.
    """

    def __init__(
        self, sources: Sequence[tuple[Store, DatasetIndex]], *, cache: ShardCache | None, prefetch: PrefetchConfig,
        decode: Callable[[Sample], Any], handler: Handler | None,
    ) -> None:
        offsets = np.cumsum([0] + [len(ix.shards) for _, ix in sources])
        self.sources = [SourceShards(st, ix, int(o)) for (st, ix), o in zip(sources, offsets, strict=False)]
        self._starts = offsets[:-1]
        self.cache, self.prefetch = cache, prefetch
        self.decode, self.handler = decode, handler
        self.lost_samples = 0

    def _locate(self, shard: int) -> tuple[SourceShards, int]:
        if len(self.sources) == 1:
            return self.sources[0], shard
        src = self.sources[int(np.searchsorted(self._starts, shard, side="right")) - 1]
        return src, shard - src.offset

    def _layout(self, shard: int) -> SampleLayout:
        src, local = self._locate(shard)
        return src.index.layout(local, src.store)

    def read(self, windows: Iterable[Window], skip: int = 0, *, decoded: bool = True) -> Iterator[Any]:
        """Decoded samples of ``windows`` in yield order, after the first ``skip`` (``decoded=False``:
        as read, for a caller that decodes them elsewhere: ``StreamingDataLoader(threads=N)``).

        Whole skipped windows are never read; a partly skipped sequential one is trimmed, a partly
        skipped permuted one is read and the skipped part dropped. Runs that continue each other
        are read as one chain; several open chains are read in segments (:mod:`streamio.data.read.schedule`).
        """
        kept, skip = _skipped(windows, skip)
        kept = [_by_need(win) for win in kept]
        layouts = _Layouts(self._layout)
        cfg = self.prefetch
        schedule = build_schedule(kept, layouts.offsets, max_bytes=cfg.max_bytes, chunk_size=cfg.chunk_size)
        feed = _Feed(self, schedule, layouts.layout, cfg)
        decode = _traced(self.decode) if trace.enabled() else self.decode  # no span call per sample unless traced
        decode = decode if decoded else _as_read
        try:
            for win, chains in zip(kept, schedule.chains, strict=True):
                if win.order is None:
                    for run, c in zip(win.runs, chains, strict=True):
                        for batch in feed.take(c, run.end - run.first):
                            for sample in batch:
                                if sample is not None:
                                    yield decode(sample)
                    continue
                buffered: list[Sample | None] = []
                pending = zip(win.runs, chains, strict=True)
                for i in win.order.tolist():
                    while i >= len(buffered):  # runs come in the order they are first needed
                        run, c = next(pending)
                        for batch in feed.take(c, run.end - run.first):
                            buffered.extend(batch)
                    sample = buffered[i]
                    if skip:
                        skip -= 1
                    elif sample is not None:
                        yield decode(sample)
        finally:
            feed.close()

    def samples_of(
        self, segment: Segment, byte_run: ByteRun, chunks: Iterator[bytes]
    ) -> Iterator[list[Sample | None]]:
        """Raw samples of one segment in batches, verified, with ``__url__``/``__shard__``/``__index__``; None if lost.

        Batches (non-empty lists, :func:`~streamio.data.format.samples.iter_sample_batches`) so that
        the layers above take a few hundred samples per step, not one.
        """
        src, local = self._locate(segment.shard)
        layout = src.index.layout(local, src.store)
        batches = self._run(Run(local, segment.first, segment.end), src.store, byte_run, chunks, layout)
        if len(self.sources) == 1:
            return batches
        which = self.sources.index(src)
        return ([s if s is None else {**s, "__source__": which} for s in batch] for batch in batches)

    def _run(
        self, run: Run, store: Store, byte_run: ByteRun, chunks: Iterator[bytes], layout: SampleLayout
    ) -> Iterator[list[Sample | None]]:
        """The samples of one run (local shard numbers) in batches; ``None`` for each sample a skipped fault lost."""
        shard = byte_run.shard
        url = store.url(shard.path)
        shard_id, index = run.shard, run.first
        refetched = False
        while True:
            try:
                for batch in iter_sample_batches(
                    chunks,
                    url=url,
                    span=SampleSpan(layout.offsets[index], index, run.end - index),
                    layout=layout,
                    compression=shard.compression,
                ):
                    for sample in batch:
                        sample["__url__"] = url
                        sample["__shard__"] = shard_id
                        sample["__index__"] = index
                        index += 1
                    yield batch  # type: ignore[misc]
                return
            except CorruptDataError as exc:
                if self.cache is None or refetched:
                    if self._skip(exc, run, index, url):
                        yield from _lost(run, index)  # keeps the windows aligned; read() drops them
                        return
                    raise
                # bit rot in a cached file that kept its size and mtime: drop it and fetch again
                log.warning(
                    "sample %d of %s failed its checksum; discarding the cached shard and fetching it again: %s",
                    index, url, exc,
                )
                self.cache.invalidate(store, shard)
                refetched = True
                chunks = self.cache.open_range(store, shard, *layout.byte_range(index, run.end))
            except (StorageError, StreamioError) as exc:
                if not self._skip(exc, run, index, url):
                    raise
                yield from _lost(run, index)
                return

    def _skip(self, exc: Exception, run: Run, index: int, url: str) -> bool:
        """Ask the user's handler whether to skip the rest of ``run``; count and log what is lost."""
        if self.handler is None or not self.handler(exc):
            return False
        lost = run.end - index
        self.lost_samples += lost
        log.warning(
            "skipping %d samples [%d, %d) of %s (this rank now yields %d fewer): %s",
            lost, index, run.end, url, lost, exc,
        )
        return True


def _as_read(sample: Sample) -> Sample:
    return sample


def _lost(run: Run, index: int) -> list[list[None]]:
    """The batches that stand for the samples of ``run`` a skipped fault lost from ``index`` on (none if none)."""
    return [[None] * (run.end - index)] if index < run.end else []


def _traced(decode: Callable[[Sample], Any]) -> Callable[[Sample], Any]:
    """``decode`` inside a ``decode`` span (``STREAMIO_TRACE``)."""
    def traced(sample: Sample) -> Any:
        with trace.span("decode"):
            return decode(sample)

    return traced


class _Layouts:
    """Each shard's sample layout, loaded once per read, and its offsets as an array (the schedule searches them)."""

    def __init__(self, load: Callable[[int], SampleLayout]) -> None:
        self._load = load
        self._layouts: dict[int, SampleLayout] = {}
        self._offsets: dict[int, np.ndarray] = {}

    def layout(self, shard: int) -> SampleLayout:
        if shard not in self._layouts:
            self._layouts[shard] = self._load(shard)
        return self._layouts[shard]

    def offsets(self, shard: int) -> np.ndarray:
        if shard not in self._offsets:
            self._offsets[shard] = np.asarray(self.layout(shard).offsets, dtype=np.int64)
        return self._offsets[shard]


def _by_need(win: Window) -> Window:
    """``win`` with its runs in the order their first sample is yielded (and ``order`` to match).

    So a shuffled window's reads are scheduled and taken in the order its samples are needed: the
    first batch waits for the few runs it draws from, not for every run of the window.
    """
    if win.order is None or len(win.runs) <= 1:
        return win
    sizes = np.array([r.end - r.first for r in win.runs], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    run_of = np.repeat(np.arange(sizes.size), sizes)
    seen = run_of[win.order]
    _, first = np.unique(seen, return_index=True)
    need = seen[np.sort(first)]
    if (need == np.arange(need.size)).all():
        return win
    new_start = np.empty_like(starts)
    new_start[need] = np.cumsum(sizes[need]) - sizes[need]
    moved = new_start[run_of] + np.arange(run_of.size) - starts[run_of]
    return Window(tuple(win.runs[k] for k in need.tolist()), moved[win.order])


def _skipped(windows: Iterable[Window], skip: int) -> tuple[list[Window], int]:
    """The windows left after skipping ``skip`` samples, and how many of the first one's yield to drop.

    Whole skipped windows go; a partly skipped sequential one is trimmed (its runs start later).
    """
    kept: list[Window] = []
    for win in windows:
        if not kept and skip >= win.size:
            skip -= win.size
            continue
        if not kept and skip and win.order is None:
            win, skip = Window(_drop_first(win.runs, skip), None), 0
        kept.append(win)
    return kept, skip


def _drop_first(runs: tuple[Run, ...], n: int) -> tuple[Run, ...]:
    """``runs`` without their first ``n`` samples."""
    out = []
    for run in runs:
        size = run.end - run.first
        if n >= size:
            n -= size
            continue
        out.append(Run(run.shard, run.first + n, run.end))
        n = 0
    return tuple(out)


class _Feed:
    """Samples of each chain on demand, from segments fetched in schedule order (one live at a time)."""

    def __init__(
        self, reader: WindowReader, schedule: Schedule, layout: Callable[[int], SampleLayout], cfg: PrefetchConfig
    ) -> None:
        self._reader = reader
        self._segments = iter(schedule.segments)
        byte_runs = []
        for seg in schedule.segments:
            src, local = reader._locate(seg.shard)
            byte_range = layout(seg.shard).byte_range(seg.first, seg.end)
            byte_runs.append(ByteRun(src.index.shards[local], *byte_range, store=src.store))
        depth = max(cfg.workers, min(schedule.open_at_once, _MAX_LANE_DEPTH))
        config = replace(cfg, workers=depth) if depth != cfg.workers else cfg
        store = reader.sources[0].store
        self._fetched = iter(Prefetcher(store, byte_runs, cache=reader.cache, config=config))
        self._bufs: dict[int, deque[list[Sample | None]]] = {}  # each chain's batches parsed before they were needed
        self._live: Iterator[list[Sample | None]] | None = None
        self._live_chain, self._live_left = -1, 0

    def take(self, chain: int, n: int) -> Iterator[list[Sample | None]]:
        """The next ``n`` samples of ``chain``, in batches (non-empty lists)."""
        while n:
            buf = self._bufs.get(chain)
            if buf:
                batch = buf.popleft()
            elif self._live is not None and self._live_chain == chain and self._live_left:
                batch = next(self._live)
                self._live_left -= len(batch)
            else:
                self._advance(chain)
                continue
            k = len(batch)
            if k > n:  # the rest is the chain's next run's
                self._bufs.setdefault(chain, deque()).appendleft(batch[n:])
                batch, k = batch[:n], n
            n -= k
            yield batch

    def _advance(self, chain: int) -> None:
        if self._live is not None and self._live_left:  # another chain's segment: keep the rest of it
            keep = self._bufs.setdefault(self._live_chain, deque())
            while self._live_left:
                batch = next(self._live)
                self._live_left -= len(batch)
                keep.append(batch)
        seg = next(self._segments)
        if seg.chain != chain:
            raise AssertionError(f"read schedule out of order: chain {chain} needed, segment of chain {seg.chain} next")
        byte_run, chunks = next(self._fetched)
        self._live = self._reader.samples_of(seg, byte_run, chunks)
        self._live_chain, self._live_left = seg.chain, seg.end - seg.first

    def close(self) -> None:
        """Stop the prefetch threads and release cache leases."""
        self._fetched.close()  # type: ignore[attr-defined]
