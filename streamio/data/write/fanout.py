"""All cores of one machine for ``streamio shard`` and ``streamio index``: worker processes, results in order.

Both verbs keep one process in charge of the order and the commit, and hand the work that costs
CPU to ``workers`` processes (started with ``spawn``: a storage client made in a parent is not
fork-safe, so each process makes its own):

* **shard** (:func:`pack_in_processes`), uncompressed: the parent checks each sample and sizes it
  from its members' sizes (a local file is not read), cuts the stream into shards by the rule one
  writer follows, and hands each shard's samples to a worker, which reads the files, packs the shard
  under the name the writer gives it, stores it and returns its size, checksums and offsets; the
  parent adopts the shards in order and commits as one writer does. ``--compress zstd``: the cut
  depends on compressed sizes, known only after compressing, so the workers check and encode the
  samples in batches (:func:`encoded`: files read, tar records built, each sample's frame
  compressed) and the parent packs them in order (:meth:`~streamio.data.write.packer.ShardPacker.add`).
  Either way the cut, the names and the bytes depend on the samples only: the dataset is the same
  for every number of workers (and, with ``--shuffle --seed S``, the same shuffled dataset: the
  order is decided by the source, in the parent).
* **index** (:func:`scan_in_processes`): the shards are dealt to the workers in contiguous runs of
  about ``concurrency / workers`` (each run scanned with that many threads), so about
  ``concurrency`` shards are read at once in all; results come back in path order, into the same
  index as :func:`~streamio.data.write.indexer.build_index`.

At most ``2 x workers`` batches or runs are in flight, so memory stays bounded whatever the source.
Workers ignore SIGINT: Ctrl-C reaches the parent, which stops handing out work and leaves as one
process does (no index; what was stored is claimed by the write's marker).

Workers end with their parent, however it ends (:func:`_end_with`). A parent killed with ``-9``
runs no cleanup, and a pool's workers would wait on their task queue for ever (each holds a
write end of it, so it never reports end-of-file). So each worker asks the kernel for SIGKILL when
its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``; the kernel sends it when the parent's thread
that started the worker ends, and the pool starts its workers from the thread that submits to it,
which holds the pool until it closes), and a thread of its own also watches its parent's pid
(other systems, and the instant between the worker's start and the ``prctl``).
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from itertools import islice
from typing import Any, TypeVar

from streamio.data.format.layout import MAX_SAMPLE_BYTES, SampleLayout, ShardInfo
from streamio.data.format.tar import END_OF_ARCHIVE
from streamio.data.write.indexer import ShardScan, scan_shards
from streamio.data.write.packer import EncodedSample, ShardPacker, ShardSpec, compressor, encode_sample
from streamio.data.write.writer import DatasetWriter
from streamio.errors import DatasetError
from streamio.storage import Store

__all__ = ["BATCH", "encoded", "pack_in_processes", "scan_in_processes"]

#: Samples a shard worker encodes per batch.
BATCH = 64

T = TypeVar("T")
Scan = ShardScan
Packed = tuple[ShardInfo, SampleLayout, set[str], dict[str, list[int]]]  # and its documents' token counts


log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
#: How often a worker's watchdog looks for its parent.
PARENT_POLL_S = 0.5


def _worker_start(parent: int) -> None:
    """A worker's initializer: Ctrl-C is the parent's to handle, and the worker ends with ``parent``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with(parent)


def _end_with(parent: int, *, poll_s: float = PARENT_POLL_S) -> None:
    """End this process (SIGKILL) as soon as ``parent`` is no longer its parent (see the module docstring)."""
    if sys.platform == "linux":
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed (errno %d): the watchdog alone ends this worker",
                          ctypes.get_errno())
        except (OSError, AttributeError):  # no libc to load: the watchdog alone
            log.debug("no prctl: the watchdog alone ends this worker with its parent")
    if os.getppid() != parent:  # the parent died before the prctl: it can no longer fire
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch, args=(parent, poll_s), name="streamio-parent-watch", daemon=True).start()


def _watch(parent: int, poll_s: float) -> None:
    """Until the parent is gone (the worker is then adopted by another process), then SIGKILL itself."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGKILL)


def _pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start,
                               initargs=(os.getpid(),))


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


_BUFFERS: collections.deque[bytearray] = collections.deque(maxlen=2)  # a worker's shard buffers, kept between tasks


def _write_shard(root: str, storage_options: Mapping[str, Any] | None, spec: ShardSpec, path: str,
                 samples: list[Mapping[str, Any]]) -> Packed:
    """One worker: pack a planned shard's samples (files read here) and store it at ``path``."""
    store = Store(root, storage_options)

    def name(i: int) -> str:
        if i:
            raise RuntimeError(f"the samples planned for {path} made more than one shard: a planning bug")
        return path

    packer = ShardPacker(store, spec, name, max_pending=1, buffers=_BUFFERS)
    packer.write_all(samples)
    return packer.shards[0], packer.layouts[0], packer.keys, packer.tokens[0]


def _planned(samples: Iterable[Mapping[str, Any]], spec: ShardSpec) -> Iterator[list[Mapping[str, Any]]]:
    """``samples`` cut into the shards one uncompressed writer would make: the cut depends on each
    sample's tar records' size, known from its members' sizes before any file is read."""
    shard: list[Mapping[str, Any]] = []
    size, last = 0, None
    for number, sample in enumerate(samples):
        enc = encode_sample(sample, number, spec, stream=True)  # checked and sized; nothing read yet
        if enc.key == last:
            raise DatasetError(
                f"sample {number}: key {enc.key!r} repeats the previous sample's key; readers would merge the two. "
                f"Give every sample a distinct '__key__'."
            )
        if shard and (size + enc.size + len(END_OF_ARCHIVE) > spec.max_bytes
                      or (spec.max_count is not None and len(shard) >= spec.max_count)):
            yield shard
            shard, size = [], 0
        shard.append({**sample, "__key__": enc.key})  # a default key is the sample's number in the whole source
        size += enc.size
        last = enc.key
    if shard:
        yield shard


def pack_in_processes(
    writer: DatasetWriter, samples: Iterable[Mapping[str, Any]], *, workers: int,
    storage_options: Mapping[str, Any] | None = None, progress: Callable[[int, int], None] | None = None,
) -> None:
    """Write ``samples`` into ``writer``'s dataset with ``workers`` processes (see the module docstring).

    Uncompressed: this process plans the shards (:func:`_planned`) and each worker packs and stores
    whole shards under the writer's names, adopted in order. zstd (the cut needs the compressed
    sizes): the workers encode the samples and this process packs them (:func:`encoded`).
    ``progress(samples, nbytes)`` as samples are stored.

    Raises:
        DatasetError: an invalid sample (named), at its place in the order.
    """
    report = progress or (lambda n, nbytes: None)
    spec = writer.spec
    if spec.compression is not None:
        it = iter(samples)
        head = list(islice(it, BATCH + 1))
        if len(head) <= BATCH:  # one batch: not worth starting processes for
            for sample in head:
                before = writer.bytes_written
                writer.write(sample)
                report(1, writer.bytes_written - before)
            return
        for enc in encoded(itertools.chain(head, it), spec, workers):
            before = writer.bytes_written
            writer.add(enc)
            report(1, writer.bytes_written - before)
        return
    planned = _planned(samples, spec)
    first = next(planned, None)
    second = next(planned, None) if first is not None else None
    if second is None:  # one shard or none: not worth starting processes for; the same shard here
        for sample in first or ():
            before = writer.bytes_written
            writer.write(sample)
            report(1, writer.bytes_written - before)
        return
    root = writer.store.root_url
    shards = itertools.chain((first, second), planned)
    calls = ((_write_shard, (root, storage_options, spec, writer.shard_path(i), shard))
             for i, shard in enumerate(shards))
    with _pool(workers) as pool:
        try:
            for info, layout, keys, tokens in _ordered(pool, calls, workers + 1):
                writer.adopt(info, layout, keys, tokens)
                report(info.samples, info.bytes)
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
    run = max(1, -(-concurrency // workers))
    if len(paths) <= run:  # one run: not worth starting processes for; the same scans here
        return scan_shards(store, paths, concurrency=concurrency, max_sample_bytes=max_sample_bytes, progress=progress)
    report = progress or (lambda done, total, nbytes: None)
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
