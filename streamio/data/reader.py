"""A worker's windows -> verified, decoded samples, in the plan's yield order.

:class:`WindowReader` is the I/O half of :class:`~streamio.data.dataset.StreamingDataset`: it turns
the planner's windows (:class:`~streamio.data.plan.Window`) into byte runs through the index,
fetches them ahead (:mod:`streamio.data.prefetch`, through the node cache when there is one),
parses and verifies each sample (:mod:`streamio.data.samples`) and yields them decoded, each
window in its permuted order.

* **Long reads.** The runs of consecutive windows are merged where they touch, so a sequential
  stream is one ranged read per shard run, whatever the window size.
* **Exact skip.** ``read(windows, skip)`` drops the first ``skip`` samples of the yield order
  (a worker resuming inside its stream): whole skipped windows are never read, a sequential one is
  trimmed, and only a partly skipped shuffled window is read and discarded in part.
* **Bit rot in the cache** (a cached shard that kept its size and mtime but fails a checksum) is
  discarded and fetched again once; a second failure is the data's.
* **Faults the user chose to skip** (``handler(exc)`` returns True for a missing, truncated or
  corrupt shard) drop the rest of that run, counted in :attr:`WindowReader.lost_samples` and
  logged; a missing sample still occupies its window slot (as ``None``), so windows stay aligned.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from streamio.data.cache import ShardCache
from streamio.data.index import DatasetIndex
from streamio.data.plan import Run, Window
from streamio.data.prefetch import ByteRun, PrefetchConfig, Prefetcher
from streamio.data.samples import Handler, iter_samples
from streamio.errors import CorruptDataError, StorageError, StreamioError
from streamio.storage import Store

if TYPE_CHECKING:
    from streamio.data.format import SampleLayout

__all__ = ["WindowReader"]

log = logging.getLogger(__name__)

Sample = dict[str, Any]


class WindowReader:
    """Reads a worker's windows from one dataset and yields its decoded samples.

    Args:
        store: the dataset's store (root of ``index.json``).
        index: the dataset's index.
        cache: the node-local cache, or None to stream without one.
        prefetch: read-ahead settings.
        decode: applied to each raw sample (``make_decoder``'s result).
        handler: ``handler(exc) -> bool`` for a shard that is missing, truncated or corrupt: True
            skips the rest of that run, False or None raises.

    Attributes:
        lost_samples: samples this process skipped because ``handler`` said so.
    """

    def __init__(
        self, store: Store, index: DatasetIndex, *, cache: ShardCache | None, prefetch: PrefetchConfig,
        decode: Callable[[Sample], Any], handler: Handler | None,
    ) -> None:
        self.store, self.index, self.cache, self.prefetch = store, index, cache, prefetch
        self.decode, self.handler = decode, handler
        self.lost_samples = 0

    def read(self, windows: Iterable[Window], skip: int = 0) -> Iterator[Any]:
        """Decoded samples of ``windows`` in yield order, after the first ``skip``.

        Runs are read sequentially, each window permuted. Whole skipped windows are never read; a
        partly skipped one is.
        """
        kept: list[Window] = []
        for win in windows:
            if not kept and skip >= win.size:
                skip -= win.size
                continue
            if not kept and skip and win.order is None:  # sequential: skip by trimming the runs
                win, skip = Window(_drop_first(win.runs, skip), None), 0
            kept.append(win)
        samples = self._samples(_merged_runs(kept))
        for win in kept:
            if win.order is None:
                for _ in range(win.size):
                    sample = next(samples)
                    if sample is not None:
                        yield self.decode(sample)
                continue
            buffered = [next(samples) for _ in range(win.size)]
            for i in win.order:
                sample = buffered[int(i)]
                if skip:
                    skip -= 1
                elif sample is not None:
                    yield self.decode(sample)

    def _samples(self, runs: list[Run]) -> Iterator[Sample | None]:
        """Raw samples of ``runs`` in storage order, verified, with ``__url__``/``__shard__``/``__index__``."""
        layouts = {run.shard: self.index.layout(run.shard, self.store) for run in runs}
        byte_runs = [ByteRun(self.index.shards[r.shard], *layouts[r.shard].byte_range(r.first, r.end)) for r in runs]
        fetched = iter(Prefetcher(self.store, byte_runs, cache=self.cache, config=self.prefetch))
        try:
            for run, (byte_run, chunks) in zip(runs, fetched, strict=False):  # one fetched entry per run
                yield from self._run(run, byte_run, chunks, layouts[run.shard])
        finally:
            fetched.close()  # type: ignore[attr-defined]  # stops the threads, releases cache leases

    def _run(
        self, run: Run, byte_run: ByteRun, chunks: Iterator[bytes], layout: SampleLayout
    ) -> Iterator[Sample | None]:
        """The samples of one run; ``None`` for each sample a skipped fault lost."""
        shard = byte_run.shard
        url = self.store.url(shard.path)
        index = run.first
        refetched = False
        while True:
            try:
                for sample in iter_samples(
                    chunks,
                    url=url,
                    start_offset=layout.offsets[index],
                    first_sample=index,
                    layout=layout,
                    compression=shard.compression,
                    num_samples=run.end - index,
                ):
                    sample["__url__"], sample["__shard__"], sample["__index__"] = url, run.shard, index
                    index += 1
                    yield sample
                return
            except CorruptDataError as exc:
                if self.cache is None or refetched:
                    if self._skip(exc, run, index, url):
                        yield from [None] * (run.end - index)  # keeps the windows aligned; read() drops them
                        return
                    raise
                # bit rot in a cached file that kept its size and mtime: drop it and fetch again
                log.warning(
                    "sample %d of %s failed its checksum; discarding the cached shard and fetching it again: %s",
                    index, url, exc,
                )
                self.cache.invalidate(self.store, shard)
                refetched = True
                chunks = self.cache.open_range(self.store, shard, *layout.byte_range(index, run.end))
            except (StorageError, StreamioError) as exc:
                if not self._skip(exc, run, index, url):
                    raise
                yield from [None] * (run.end - index)
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


def _merged_runs(windows: list[Window]) -> list[Run]:
    """The runs of ``windows`` in order, touching runs of one shard merged into one read."""
    runs: list[Run] = []
    for win in windows:
        for run in win.runs:
            if runs and runs[-1].shard == run.shard and runs[-1].end == run.first:
                runs[-1] = Run(run.shard, runs[-1].first, run.end)
            else:
                runs.append(run)
    return runs


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
