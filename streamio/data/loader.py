"""``StreamingDataLoader``: a ``DataLoader`` that counts the batches it hands out, for exact resume.

A plain ``DataLoader`` with workers cannot tell the main process what each worker yielded, so the
dataset's own count is wrong there. This loader counts the batches *it* hands to the training loop
and saves :meth:`StreamingDataset.state_after` of that count: the planner maps batches back to each
worker's exact position (batches come from workers round-robin), on any ``num_workers`` and any
world size. :func:`collate_samples` is its default ``collate_fn``.

It measures, in the main process, how long the training loop waits for each batch (from asking to
holding it, the first batch and its workers' start included): ``streamio_loader_wait_seconds`` and
``streamio_loader_batches_total`` (:mod:`streamio.metrics`), one clock pair per batch; with
``STREAMIO_TRACE`` set, a ``wait`` span around each and a ``collate`` span where each batch is made.

With forked workers (Linux's default), the ``bytes`` of each batch cross from the workers through
shared memory (:mod:`streamio.data.dataloader.transport`) instead of the pickle pipe: same batches, a fraction
of the CPU. So do a packed token batch's arrays (``StreamingDataset(pack=...)``): stacked as numpy
in the worker, made tensors here, instead of one shared-memory segment and descriptor per tensor.

Two things a training loop does not see, so that exact resume holds as the README writes the loop:

* **The workers' base seed does not come from the global torch RNG.** ``DataLoader`` draws it from
  ``generator=`` at every ``iter()``, and without one from the global generator that dropout uses:
  a resumed run draws it at another point of that stream (mid-epoch, not at the epoch's start),
  so every later dropout mask differed from the uninterrupted run's. The loader passes a generator
  of its own, seeded from ``(dataset seed, epoch, rank)`` at each ``iter()`` (:func:`worker_seed`).
  A ``generator=`` the caller passes is used as given.
* **An epoch ends when its last batch is handed out**, not when the loop asks for one more: a loop
  that takes exactly ``len(loader)`` batches (Lightning's fetcher, ``zip(range(len(loader)),
  loader)``) never pulls the ``StopIteration``, and used to replay epoch 0 forever. A state saved
  after that batch says the epoch ended, so a restart and a live ``iter()`` both read the next one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate, get_worker_info

from streamio.data.dataloader.stateful_loader import handed_out
from streamio.data.dataloader.threaded import ThreadedBatches
from streamio.data.dataloader.transport import SharedBatches, forked_workers, ring_bytes
from streamio.data.dataset import StreamingDataset
from streamio.data.select import members_of
from streamio.distributed import rank_and_world
from streamio.errors import ConfigError, MissingMemberError, PlanError
from streamio.metrics.catalog import LOADER_BATCHES, LOADER_WAIT
from streamio.metrics.trace import span
from streamio.state_version import VERSION_KEY, check_version

__all__ = ["StreamingDataLoader", "collate_samples", "worker_seed"]

STATE_VERSION = 1
MAX_THREADS = 256  # StreamingDataLoader(threads=): more would only cost memory and switches on any machine
_K_DATASET = "dataset"
_END = object()  # what next() returns once the DataLoader's iterator is exhausted


def collate_samples(batch: list[Any]) -> Any:
    """``default_collate`` for sample dicts, keeping the ``__meta__`` fields as plain lists.

    Every sample of a batch must have the same members: a batch mixing, say, ``jpg`` and ``png``
    samples raises :class:`~streamio.errors.MissingMemberError` naming both samples and what each
    has (pick one per sample with :func:`streamio.select`).

    ``__shard__``/``__index__`` would otherwise become one small tensor each, and every tensor
    crosses from a worker to the main process through its own shared-memory segment: measured,
    that halves loader throughput at small batches. Non-dict samples go to ``default_collate``.
    """
    if batch and isinstance(batch[0], Mapping):
        keys = list(batch[0])
        first = batch[0].keys()
        if any(s.keys() != first for s in batch):
            raise _inconsistent(batch)
        meta = {k: [s[k] for s in batch] for k in keys if k.startswith("__")}
        data = {}
        for k in keys:
            if not k.startswith("__"):
                column = [s[k] for s in batch]
                # bytes stay a list (what default_collate returns for them), without its dispatch
                data[k] = column if type(column[0]) is bytes else default_collate(column)
        return {**meta, **data}
    return default_collate(batch)


def _inconsistent(batch: list[Any]) -> MissingMemberError:
    """The error for a batch whose samples have different members (some ``jpg``, some ``png``)."""
    one = batch[0]
    two = next(s for s in batch if s.keys() != one.keys())
    lacker, other = (two, one) if one.keys() - two.keys() else (one, two)
    lacks = members_of(dict.fromkeys(other.keys() - lacker.keys()))
    return MissingMemberError(
        f"cannot collate a batch whose samples have different members: sample {lacker.get('__key__')!r} "
        f"({lacker.get('__url__', '?')}) lacks {lacks}, which sample {other.get('__key__')!r} has; it has "
        f"{members_of(lacker)}. collate_samples stacks each member across the batch. If they are alternatives "
        "(an image as jpg or png), pick one per sample: StreamingDataset(..., "
        "transform=streamio.select(image='jpg;png', label='cls')); or pass a collate_fn of your own"
    )


def _stack_arrays(batch: list[Any]) -> Any:
    """:func:`collate_samples`, but numpy columns stacked into one array each (a forked worker with a ring).

    The arrays cross to the main process through the ring, where the loader makes them tensors: a
    tensor collated in a worker would take a shared-memory segment and a file descriptor each.
    """
    if batch and isinstance(batch[0], Mapping) and all(s.keys() == batch[0].keys() for s in batch):
        columns = {k: [s[k] for s in batch] for k in batch[0]}
        arrays = {k: np.stack(c) for k, c in columns.items() if not k.startswith("__") and _stackable(c)}
        if arrays:
            rest = collate_samples([{k: v for k, v in s.items() if k not in arrays} for s in batch])
            return {k: arrays.get(k, rest.get(k)) for k in batch[0]}
    return collate_samples(batch)


def _stackable(column: list[Any]) -> bool:
    first = column[0]
    return type(first) is np.ndarray and first.dtype.kind in "biuf" and all(
        type(x) is np.ndarray and x.shape == first.shape and x.dtype == first.dtype for x in column
    )


def _as_tensors(batch: Any) -> Any:
    """A batch from :func:`_stack_arrays` with its arrays as tensors (what :func:`collate_samples` gives)."""
    if isinstance(batch, dict):
        return {k: torch.from_numpy(v) if type(v) is np.ndarray else v for k, v in batch.items()}
    return batch


class _Collate:
    """The user's ``collate_fn``, then (in a worker) the batch's bytes moved to shared memory."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate
        self.shared: SharedBatches | None = None
        self.stack = False  # collate_samples with numpy columns stacked, for the ring (set per iteration)

    def __call__(self, batch: list[Any]) -> Any:
        info = get_worker_info()
        with span("collate", samples=len(batch)):
            if self.shared is None or info is None:
                return self.collate(batch)
            return self.shared.pack(info.id, _stack_arrays(batch) if self.stack else self.collate(batch))


class _WorkerInit:
    """The user's ``worker_init_fn``, after the worker unmapped the rings of the other workers."""

    def __init__(self, collate: _Collate, user: Callable[[int], None] | None) -> None:
        self.collate, self.user = collate, user

    def __call__(self, worker_id: int) -> None:
        if self.collate.shared is not None:
            self.collate.shared.keep_only(worker_id)
        if self.user is not None:
            self.user(worker_id)


def _check_threads(threads: Any, kwargs: Mapping[str, Any]) -> None:
    """Refuse a ``threads=`` that is not a count, or that comes with worker processes or pinning."""
    if type(threads) is not int or not 0 <= threads <= MAX_THREADS:
        raise ConfigError(
            f"StreamingDataLoader(threads={threads!r}): give the number of threads that make batches in this "
            f"process, an int from 0 (none: the usual DataLoader) to {MAX_THREADS}; about the cores it may use"
        )
    if threads and kwargs.get("num_workers"):
        raise ConfigError(
            f"StreamingDataLoader(threads={threads}, num_workers={kwargs['num_workers']!r}): choose one. threads "
            "make the batches in this process, num_workers in worker processes; pass num_workers=0 with threads"
        )
    if threads and kwargs.get("pin_memory"):
        raise ConfigError(
            f"StreamingDataLoader(threads={threads}, pin_memory=True) is not supported: pin_memory needs "
            "num_workers (or threads=0); or leave pin_memory off and copy batches with .to(device, non_blocking=True)"
        )


def worker_seed(seed: int, epoch: int, rank: int) -> int:
    """The DataLoader workers' base seed for ``epoch`` on ``rank`` (a structured seed, not arithmetic).

    Worker ``i`` seeds ``torch``, ``random`` and NumPy from it plus ``i``, as DataLoader does.
    """
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1, dtype=np.uint64)[0] >> 1)


def _batch_bytes(ds: StreamingDataset) -> int:
    """About the bytes of one batch: the batch size x the largest mean sample of any shard (a packed
    sequence: its int64 tokens and int32 document ids and positions)."""
    if ds.pack is not None:
        return ds.batch_size * ds.pack.width * 16
    mean = max((sh.bytes // max(sh.samples, 1) for src in ds.sources for sh in src.index.shards), default=0)
    return ds.batch_size * mean


class StreamingDataLoader(DataLoader):
    """A ``DataLoader`` that counts the batches it hands out, so the dataset's state is exact.

    Same arguments as ``torch.utils.data.DataLoader``, except that the batch size is given once,
    to the dataset: leave ``batch_size`` out (or ``None``) and the loader uses
    ``dataset.batch_size``, which the dataset needs to cut every worker's stream in whole batches.
    ``collate_fn`` defaults to :func:`collate_samples`. ``state_dict()`` / ``load_state_dict()``
    save and restore the exact position, with any ``num_workers``, and resume on another world
    size or worker count.

    Epochs: the epoch ends when its last batch is handed out (``len(loader)`` batches from the
    epoch's start, or from the resume point), whether or not the loop then asks for one more. An
    iteration that starts after that reads the next epoch unless ``dataset.set_epoch()`` was called
    since (which wins), so a loop that never calls ``set_epoch``, or takes exactly ``len(loader)``
    batches, still sees a new order every epoch; an iteration abandoned earlier restarts its epoch.
    The state records the epoch and whether it ended: restored, it continues as the live loader
    would (after the last batch: ``len(loader)`` is the next epoch's, and the next iteration reads it).

    Threads instead of processes: ``threads=N`` (with ``num_workers=0``) runs the whole pipeline in
    this process. The dataset's prefetch threads fetch as always; a feeder thread reads, verifies and
    cuts the samples into batches, and N threads make each batch: :meth:`StreamingDataset.prepare`
    (decode, transform) on each sample, then ``collate_fn``; batches are handed out in order, at most
    ``2 * N`` in flight (:mod:`streamio.data.dataloader.threaded`). The batches are exactly those of
    ``num_workers=0``, and so is the state: it resumes with any ``threads`` or ``num_workers``, and a
    state of any of them resumes here. Decoding (PIL, numpy, zstd, CRC32C) releases the GIL, so it
    scales across cores without pickling batches between processes. Your ``decode``, ``transform``
    and ``collate_fn`` then run on several threads at once: they must be thread-safe, and random
    augmentations drawn from a shared RNG (``random``, torch's global generator) come out in thread
    order, not sample order: seed them from the sample (its ``__key__``) to be reproducible. An
    error of a batch is raised by ``next()`` at that batch's place, with the thread's traceback.

    Random numbers: each ``iter()`` draws the workers' base seed from ``generator``; left out, the
    loader's own generator, seeded from ``(dataset.seed, epoch, rank)`` (:func:`worker_seed`), so
    iterating never draws from the global torch RNG (the one dropout uses) and a resumed run's
    RNG stream stays the uninterrupted run's.

    Example::

        ds = StreamingDataset(url, batch_size=32)
        loader = StreamingDataLoader(ds, num_workers=4)   # batches of 32
        loader = StreamingDataLoader(ds, threads=4)       # the same batches as num_workers=0, on 4 threads

    Raises:
        ConfigError: ``dataset`` is not a :class:`~streamio.data.dataset.StreamingDataset`, or
            ``threads`` is not an int >= 0, or is given with ``num_workers`` or ``pin_memory``.
        PlanError: ``batch_size`` is given and differs from the dataset's, or
            ``persistent_workers=True`` (the workers would keep their copy of the dataset, which
            ``set_epoch`` in this process does not reach: every epoch would repeat the first one's
            order).
    """

    def __init__(
        self, dataset: StreamingDataset, batch_size: int | None = None, *, threads: int = 0, **kwargs: Any
    ) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise ConfigError(f"StreamingDataLoader needs a StreamingDataset, got {type(dataset).__name__}")
        _check_threads(threads, kwargs)
        self.threads = threads
        batch_size = dataset.batch_size if batch_size is None else batch_size
        if batch_size != dataset.batch_size:
            raise PlanError(
                f"StreamingDataLoader(batch_size={batch_size}) differs from the batch_size={dataset.batch_size} of "
                f"{dataset!r}, which cuts its streams in whole batches of its own size: "
                f"leave batch_size out (the loader takes the dataset's), or build the dataset with "
                f"StreamingDataset(..., batch_size={batch_size})"
            )
        if kwargs.get("persistent_workers"):
            raise PlanError(
                f"StreamingDataLoader(persistent_workers=True) over {dataset.store.root_url!r}: persistent workers "
                "keep their copy of the dataset, so set_epoch() would not reach them and every epoch would repeat "
                "the first one's order; leave persistent_workers off"
            )
        self._collate = _Collate(kwargs.pop("collate_fn", None) or collate_samples)
        kwargs["worker_init_fn"] = _WorkerInit(self._collate, kwargs.get("worker_init_fn"))
        # the workers' base seed; never the global RNG (seeded per iteration in __iter__)
        self._seeds = torch.Generator() if kwargs.get("generator") is None else None
        if self._seeds is not None:
            kwargs["generator"] = self._seeds
        super().__init__(dataset, batch_size=batch_size, collate_fn=self._collate, **kwargs)
        dataset.attach_loader(self.num_workers)
        self._streaming = dataset  # typed: DataLoader.dataset is a plain Dataset
        self._batches = 0
        self._batches_epoch: int | None = None  # the dataset epoch `_batches` counts batches of

    def __iter__(self) -> Iterator[Any]:
        waited = time.perf_counter()  # the first batch's wait includes planning and starting the workers
        ds = self._streaming
        token = ds.begin_iteration()  # the next epoch when the last one was read whole and set_epoch was not called
        self._batches, self._batches_epoch = 0, ds.epoch
        if self._seeds is not None:  # super().__iter__() draws the base seed from it, below
            self._seeds.manual_seed(worker_seed(ds.seed, ds.epoch, rank_and_world()[0]))
        last = handed_out(ds.plan(self.num_workers), self.batch_size or 1, drop_last=self.drop_last)
        # made before super().__iter__() forks the workers, which inherit it; held by this generator
        # while its iteration lives (a batch still in flight can be unpacked), replaced by the next
        self._collate.shared = None  # the last iteration's rings go now unless it is still alive
        forked = self.num_workers and forked_workers(self.multiprocessing_context)
        rings = SharedBatches(self.num_workers, ring_bytes(_batch_bytes(ds))) if forked else None
        self._collate.shared = rings
        # packed token batches: arrays through the ring (the sample arrays of other datasets keep collate_samples)
        stack = rings is not None and ds.pack is not None and self._collate.collate is collate_samples
        stack = self._collate.stack = stack and not self.pin_memory
        threaded = self._threaded(ds) if self.threads else None
        batches = threaded if threaded is not None else super().__iter__()
        try:
            while True:
                with span("wait"):  # the loop's wait for this batch: one clock pair per batch
                    batch = next(batches, _END)
                    if batch is _END:
                        break
                    batch = _as_tensors(batch) if stack else batch
                LOADER_WAIT.observe(time.perf_counter() - waited)
                LOADER_BATCHES.add(1.0)
                self._batches += 1
                if self._batches == last:  # handed out now: a loop that takes len(loader) batches never asks for more
                    ds.end_iteration(token)
                yield batch
                waited = time.perf_counter()
        finally:  # the iteration ended, raised, was broken out of, collected or interrupted: stop the threads
            if threaded is not None:  # a Ctrl-C while the loop waited for a batch: the process ends, join nothing
                threaded.close(wait=not isinstance(sys.exc_info()[1], KeyboardInterrupt))
        if rings is not None:
            rings.close()  # every batch arrived: unmap them now, not at the next iteration
        ds.end_iteration(token)

    def _threaded(self, ds: StreamingDataset) -> ThreadedBatches:
        """This iteration's batches made on ``self.threads`` threads (the dataset's samples as read)."""
        return ThreadedBatches(ds.iterate(prepared=False), prepare=ds.prepare, collate=self._collate,
                               batch_size=self.batch_size or 1, drop_last=self.drop_last, threads=self.threads)

    def state_dict(self) -> dict[str, Any]:
        """The exact position: the dataset's state after the batches handed out so far.

        After ``set_epoch`` selected another epoch and before its first batch, that is the new
        epoch's start (not the end of the one before, which would skip the new epoch on resume).
        """
        batches = self._batches if self._batches_epoch == self._streaming.epoch else 0
        return {VERSION_KEY: STATE_VERSION, _K_DATASET: self._streaming.state_after(batches)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the position of ``state`` (on any world size / worker count).

        Raises:
            PlanError: a malformed state or a field out of range (see
                :meth:`StreamingDataset.load_state_dict`); the loader is left as it was.
            StateMismatchError: a state of another dataset, seed, policy or shuffle.
        """
        state = check_version(state, STATE_VERSION, what="StreamingDataLoader state", error=PlanError)
        if _K_DATASET not in state:
            raise PlanError(
                f"StreamingDataLoader state has no {_K_DATASET!r} entry (keys: {sorted(map(str, state))[:8]}); "
                "pass a dict made by StreamingDataLoader.state_dict()"
            )
        self._streaming.load_state_dict(state[_K_DATASET])
        self._batches, self._batches_epoch = 0, None
