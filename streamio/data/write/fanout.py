"""All cores of one machine for ``streamio shard`` and ``streamio index``: worker processes, results in order.

Both verbs keep one process in charge of the order and the commit, and hand the work that costs
CPU to ``workers`` processes (started with ``spawn``: a storage client made in a parent is not
fork-safe, so each process makes its own):

* **shard** (:func:`encoded`): the workers check and encode samples (read their files, build the
  tar records, compress each sample's zstd frame), in batches; the parent receives them in the
  source's order and packs them into shards exactly as one process would
  (:meth:`~streamio.data.write.packer.ShardPacker.add`). The cut, the names and the bytes depend on
  the samples only, so the dataset is the same for every number of workers (and, with
  ``--shuffle --seed S``, the same shuffled dataset: the order is decided by the source, here).
* **index** (:func:`scan_in_processes`): the shards are dealt to the workers in contiguous runs of
  about ``concurrency / workers`` (each run scanned with that many threads), so about
  ``concurrency`` shards are read at once in all; results come back in path order, into the same
  index as :func:`~streamio.data.write.indexer.build_index`.

At most ``2 x workers`` batches or runs are in flight, so memory stays bounded whatever the source.
Workers ignore SIGINT: Ctrl-C reaches the parent, which stops handing out work and leaves as one
process does (no index; what was stored is claimed by the write's marker).
"""

from __future__ import annotations

import collections
import multiprocessing
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import islice
from typing import Any, TypeVar

from streamio.data.format.layout import MAX_SAMPLE_BYTES, SampleLayout, ShardInfo
from streamio.data.write.indexer import scan_shards
from streamio.data.write.packer import EncodedSample, ShardSpec, compressor, encode_sample
from streamio.storage import Store

__all__ = ["BATCH", "encoded", "scan_in_processes"]

#: Samples a shard worker encodes per batch.
BATCH = 64

T = TypeVar("T")
Scan = tuple[ShardInfo, SampleLayout, set[str]]


def _quiet() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_quiet)


def _ordered(pool: ProcessPoolExecutor, calls: Iterator[tuple[Callable[..., T], tuple[Any, ...]]],
             window: int) -> Iterator[T]:
    """Results of ``calls`` submitted to ``pool``, in order, at most ``window`` in flight."""
    pending: collections.deque[Future[T]] = collections.deque()
    try:
        for fn, args in calls:
            pending.append(pool.submit(fn, *args))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


def _encode_batch(samples: list[Mapping[str, Any]], first: int, spec: ShardSpec) -> list[EncodedSample]:
    cctx = compressor(spec)
    out = []
    for i, sample in enumerate(samples):
        enc = encode_sample(sample, first + i, spec, cctx)
        out.append(enc._replace(pieces=tuple(enc.pieces)))  # bytes, to travel back to the parent
    return out


def encoded(samples: Iterable[Mapping[str, Any]], spec: ShardSpec, workers: int) -> Iterator[EncodedSample]:
    """``samples`` checked and encoded by ``workers`` processes, in order (see the module docstring).

    An invalid sample raises its DatasetError here, at its place in the order.
    """
    it = iter(samples)

    def batches() -> Iterator[tuple[Callable[..., list[EncodedSample]], tuple[Any, ...]]]:
        first = 0
        while batch := list(islice(it, BATCH)):
            yield _encode_batch, (batch, first, spec)
            first += len(batch)

    with _pool(workers) as pool:
        try:
            for batch in _ordered(pool, batches(), 2 * workers):
                yield from batch
        finally:
            pool.shutdown(wait=False, cancel_futures=True)


def _scan_run(root: str, storage_options: Mapping[str, Any] | None, paths: list[str], max_sample_bytes: int,
              ) -> list[Scan]:
    return scan_shards(Store(root, storage_options), paths, concurrency=len(paths), max_sample_bytes=max_sample_bytes)


def scan_in_processes(
    store: Store, paths: Sequence[str], *, workers: int, storage_options: Mapping[str, Any] | None = None,
    concurrency: int = 8, max_sample_bytes: int = MAX_SAMPLE_BYTES,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[Scan]:
    """:func:`~streamio.data.write.indexer.scan_shards` over ``workers`` processes (at most one per
    shard); results in path order. ``store`` is remade in each worker from its root URL and
    ``storage_options``. Pass it as ``build_index(..., scan=partial(scan_in_processes, workers=N, ...))``.
    """
    workers = max(1, min(workers, len(paths)))
    report = progress or (lambda done, total, nbytes: None)
    run = max(1, -(-concurrency // workers))
    calls = ((_scan_run, (store.root_url, storage_options, list(paths[i : i + run]), max_sample_bytes))
             for i in range(0, len(paths), run))
    results: list[Scan] = []
    nbytes = 0
    report(0, len(paths), 0)
    with _pool(workers) as pool:
        try:
            for scans in _ordered(pool, calls, 2 * workers):
                results += scans
                nbytes += sum(s[0].bytes for s in scans)
                report(len(results), len(paths), nbytes)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    return results
