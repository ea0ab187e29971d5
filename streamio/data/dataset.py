"""``StreamingDataset``: the drop-in ``IterableDataset`` over an indexed tar dataset in any store.

Composition (each piece is its own module; this one only wires them):

* :mod:`streamio.data.index` — the dataset's shards, sample counts and per-sample offsets/CRCs;
* :mod:`streamio.data.plan` — which samples this (epoch, rank, worker) reads, as runs and windows;
* :mod:`streamio.data.prefetch` + :mod:`streamio.data.cache` — the runs' bytes, fetched ahead,
  through the node-local cache;
* :mod:`streamio.data.samples` — bytes -> verified samples; :mod:`streamio.data.decode` — values.

Topology comes from torch at iteration time (``torch.distributed`` when initialised, else torchrun's
``RANK``/``WORLD_SIZE``, else one process; the DataLoader worker from ``get_worker_info()``) and is
passed to the pure planner.

Exact resume. The planner's state is "how many batches each rank's consumer took" (plus the
topology). Who knows that number depends on the loader:

* :class:`StreamingDataLoader` (this module) counts the batches it hands out and asks the dataset for
  :meth:`StreamingDataset.state_after`; exact with any ``num_workers``, resumable on any topology.
* torchdata's ``StatefulDataLoader`` calls :meth:`StreamingDataset.state_dict` inside each worker and
  gives each worker its own state back: exact with the same ``num_workers`` (its own restriction).
* ``num_workers=0`` with a plain ``DataLoader``: the dataset counts what it yielded itself.
* A plain ``DataLoader`` with workers cannot tell the main process what the workers yielded; the
  dataset says so (a warning in the worker) instead of saving a wrong position.

The state is a small, versioned JSON-safe dict; it records the seed and the index fingerprint (via
the plan) so it is never applied to another dataset silently.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from streamio.data.cache import CacheConfig, ShardCache
from streamio.data.decode import DecodeSpec, make_decoder
from streamio.data.index import DatasetIndex, load_index
from streamio.data.plan import EpochPlan, Run, Shuffle, TailPolicy, Window, plan_epoch
from streamio.data.prefetch import ByteRun, PrefetchConfig, Prefetcher
from streamio.data.samples import Handler, iter_samples
from streamio.errors import CorruptDataError, PlanError, StorageError, StreamioError
from streamio.storage import Store

log = logging.getLogger(__name__)

STATE_VERSION = 1
_K_VERSION, _K_EPOCH, _K_PLAN, _K_WORKER, _K_YIELDED = "version", "epoch", "plan", "worker", "yielded"
DEFAULT_WINDOW = 256


def topology() -> tuple[int, int]:
    """``(rank, world_size)`` of this process: torch.distributed, else torchrun's env, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as exc:
        raise PlanError(f"RANK={os.environ.get('RANK')!r} / WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} are not integers") from exc


class StreamingDataset(IterableDataset):
    """Samples of an indexed WebDataset-style dataset, exactly once per epoch across ranks and workers.

    Args:
        url: dataset prefix holding ``index.json`` (any fsspec URL). Without an index the error
            says how to make one (``streamio index URL``).
        shuffle: ``True`` (shard order reshuffled every epoch and samples shuffled within windows
            of 256), ``False`` (index order), or a :class:`~streamio.data.plan.Shuffle`.
        seed: base seed; must be the same on every rank (checked when a process group exists).
        batch_size: the batch size of the DataLoader that will consume this dataset. Worker streams
            are cut in whole batches so that every rank yields the same number of batches and a
            resume position is exact.
        policy: ``"pad"`` (wrap around so every sample is seen) or ``"drop"``: what happens to the
            samples that do not divide evenly across ranks (stated in :attr:`last_plan`).
        cache: node-local cache settings, or None to stream without caching.
        prefetch: read-ahead settings (depth in runs, memory bound).
        decode: None (members stay bytes), ``"auto"`` (built-in safe decoders), a mapping of
            extension -> decoder, or a callable on the whole sample.
        transform: applied to each decoded sample.
        handler: ``handler(exc) -> bool`` for a shard that is missing, truncated or corrupt: True
            skips the rest of that run (logged, counted in :attr:`lost_samples`; this rank then
            yields that many fewer samples, so equal work no longer holds), False or None raises.
        storage_options: fsspec options (endpoint, credentials) for ``url``.
    """

    def __init__(
        self,
        url: str,
        *,
        shuffle: bool | Shuffle = True,
        seed: int = 0,
        batch_size: int = 1,
        policy: TailPolicy = "pad",
        cache: CacheConfig | None = None,
        prefetch: PrefetchConfig | None = None,
        decode: DecodeSpec = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        handler: Handler | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.store = Store(url, storage_options)
        self.index: DatasetIndex = load_index(self.store)
        self.shuffle = shuffle if isinstance(shuffle, Shuffle) else Shuffle(shards=True, window=DEFAULT_WINDOW) if shuffle else Shuffle(shards=False, window=0)
        self.seed = seed
        self.batch_size = batch_size
        self.policy: TailPolicy = policy
        self.cache = ShardCache(cache) if cache is not None else None
        self.prefetch = prefetch or PrefetchConfig()
        self.decode = make_decoder(decode)
        self.transform = transform
        self.handler = handler
        self.epoch = 0
        self.lost_samples = 0
        self._resume: dict[str, Any] | None = None
        self._worker_resume: dict[str, Any] | None = None
        self._yielded = 0  # samples yielded by this process's current iteration
        self._counted_by_loader = False
        self._base_plan_state: dict[str, Any] | None = None
        self._check_seed_across_ranks()

    def __repr__(self) -> str:
        return f"StreamingDataset({self.store.root_url!r}, shards={len(self.index.shards)}, samples={self.index.samples})"

    # ------------------------------------------------------------------ planning
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate (reshuffles); call it on every rank before each epoch."""
        self.epoch = int(epoch)
        if self._resume is not None and self._resume[_K_EPOCH] != self.epoch:
            self._resume = None
        if self._worker_resume is not None and self._worker_resume[_K_EPOCH] != self.epoch:
            self._worker_resume = None

    def plan(self, num_workers: int = 0) -> EpochPlan:
        """This epoch's plan for this process's world size and ``num_workers``, from any resume state."""
        _, world = topology()
        plan_state = self._resume[_K_PLAN] if self._resume is not None else None
        return plan_epoch(
            self.index.sample_counts(),
            seed=self.seed,
            epoch=self.epoch,
            world_size=world,
            num_workers=num_workers,
            batch_size=self.batch_size,
            policy=self.policy,
            shuffle=self.shuffle,
            resume=plan_state,
            index_fingerprint=self.index.fingerprint,
        )

    def __len__(self) -> int:
        """Samples this rank yields this epoch (the rest of it after a resume); equal on every rank."""
        return self.plan().samples_per_rank

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        rank, _ = topology()
        info = get_worker_info()
        worker, num_workers = (0, 0) if info is None else (info.id, info.num_workers)
        if info is not None and not self._counted_by_loader and "torchdata.stateful_dataloader" not in sys.modules:
            log.warning(
                "StreamingDataset is read by DataLoader worker %d of %d: a plain DataLoader cannot tell the "
                "main process what its workers yielded, so state_dict() there cannot be exact. Use "
                "streamio.StreamingDataLoader or torchdata's StatefulDataLoader for exact resume.",
                worker,
                num_workers,
            )
        plan = self.plan(num_workers)
        skip = 0
        if self._worker_resume is not None:
            if self._worker_resume[_K_WORKER] != worker:
                raise PlanError(f"worker state of worker {self._worker_resume[_K_WORKER]} was given to worker {worker}")
            skip = int(self._worker_resume[_K_YIELDED])
        self._yielded = skip
        self._base_plan_state = self._resume[_K_PLAN] if self._resume is not None else None
        self._worker_id = worker
        stream = plan.stream(rank, worker)
        for sample in self._read(stream.windows(), skip):
            self._yielded += 1
            yield self.transform(sample) if self.transform is not None else sample

    def _read(self, windows: Iterator[Any], skip: int = 0) -> Iterator[dict[str, Any]]:
        """Samples of ``windows`` in yield order, after the first ``skip``: runs read sequentially,
        each window permuted. Whole skipped windows are never read; a partly skipped one is."""
        kept: list[Window] = []
        for win in windows:
            if not kept and skip >= win.size:
                skip -= win.size
                continue
            if not kept and skip and win.order is None:  # sequential: skip by trimming the runs
                win, skip = Window(_drop_first(win.runs, skip), None), 0
            kept.append(win)
        windows = kept
        runs: list[Run] = []
        for win in windows:
            for run in win.runs:
                if runs and runs[-1].shard == run.shard and runs[-1].end == run.first:
                    runs[-1] = Run(run.shard, runs[-1].first, run.end)
                else:
                    runs.append(run)
        samples = self._samples(runs)
        for win in windows:
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

    def _samples(self, runs: list[Run]) -> Iterator[dict[str, Any] | None]:
        """Raw samples of ``runs`` in storage order, verified, with ``__url__``/``__shard__``/``__index__``."""
        layouts = {run.shard: self.index.layout(run.shard, self.store) for run in runs}
        byte_runs = [ByteRun(self.index.shards[r.shard], *layouts[r.shard].byte_range(r.first, r.end)) for r in runs]
        fetched = iter(Prefetcher(self.store, byte_runs, cache=self.cache, config=self.prefetch))
        try:
            yield from self._parse(runs, layouts, fetched)
        finally:
            fetched.close()  # type: ignore[attr-defined]  # stops the threads, releases cache leases

    def _parse(self, runs: list[Run], layouts: dict[int, Any], fetched: Iterator[tuple[ByteRun, Iterator[bytes]]]) -> Iterator[dict[str, Any] | None]:
        for run, (byte_run, chunks) in zip(runs, fetched):
            shard = byte_run.shard
            url = self.store.url(shard.path)
            index = run.first
            refetched = False
            while True:
                try:
                    for sample in iter_samples(
                        chunks,
                        url=url,
                        start_offset=layouts[run.shard].offsets[index],
                        first_sample=index,
                        layout=layouts[run.shard],
                        compression=shard.compression,
                        num_samples=run.end - index,
                    ):
                        sample["__url__"], sample["__shard__"], sample["__index__"] = url, run.shard, index
                        index += 1
                        yield sample
                    break
                except CorruptDataError as exc:
                    if self.cache is None or refetched:
                        if self._skip(exc, run, index, url):
                            yield from [None] * (run.end - index)  # keeps the windows aligned; _read drops them
                            break
                        raise
                    # bit rot in a cached file that kept its size and mtime: drop it and fetch again
                    log.warning("sample %d of %s failed its checksum; discarding the cached shard and fetching it again: %s", index, url, exc)
                    self.cache.invalidate(self.store, shard)
                    refetched = True
                    start, end = layouts[run.shard].byte_range(index, run.end)
                    chunks = self.cache.open_range(self.store, shard, start, end)
                except (StorageError, StreamioError) as exc:
                    if not self._skip(exc, run, index, url):
                        raise
                    yield from [None] * (run.end - index)
                    break

    def _skip(self, exc: Exception, run: Run, index: int, url: str) -> bool:
        """Ask the user's handler whether to skip the rest of ``run``; count and log what is lost."""
        if self.handler is None or not self.handler(exc):
            return False
        lost = run.end - index
        self.lost_samples += lost
        log.warning("skipping %d samples [%d, %d) of %s (this rank now yields %d fewer): %s", lost, index, run.end, url, lost, exc)
        return True

    # ------------------------------------------------------------------ state
    def state_after(self, batches: int) -> dict[str, Any]:
        """The resume state after this rank's consumer took ``batches`` batches of this iteration.

        What :class:`StreamingDataLoader` calls; exact with any number of workers.
        """
        plan = self.plan(self._loader_workers)
        return {_K_VERSION: STATE_VERSION, _K_EPOCH: self.epoch, _K_PLAN: plan.state_dict(batches)}

    _loader_workers = 0

    def state_dict(self) -> dict[str, Any]:
        """The resume state (torchdata ``Stateful`` protocol); see the module docstring for who is exact."""
        info = get_worker_info()
        if info is not None:
            return {_K_VERSION: STATE_VERSION, _K_EPOCH: self.epoch, _K_PLAN: self._base_plan_state, _K_WORKER: info.id, _K_YIELDED: self._yielded}
        plan = self.plan(0)
        if self._yielded == plan.samples_per_rank:
            return self.state_after(plan.batches_per_rank)
        if self._yielded % self.batch_size:
            raise PlanError(
                f"state_dict() after {self._yielded} samples, not a whole number of batches of {self.batch_size}: "
                "take the state between batches"
            )
        return self.state_after(self._yielded // self.batch_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state made by :meth:`state_dict` / :meth:`state_after` (any topology)."""
        if not isinstance(state, Mapping) or state.get(_K_VERSION) != STATE_VERSION:
            raise PlanError(f"dataset state version {state.get(_K_VERSION) if isinstance(state, Mapping) else state!r} is not {STATE_VERSION}; it was written by another streamio version")
        self.epoch = int(state[_K_EPOCH])
        plan_state = state.get(_K_PLAN)
        self._resume = {_K_EPOCH: self.epoch, _K_PLAN: plan_state} if plan_state is not None else None
        self._worker_resume = dict(state) if _K_WORKER in state else None
        self.plan(self._loader_workers) if self._worker_resume is None else None  # validate now: fingerprint, epoch

    # ------------------------------------------------------------------ checks
    def _check_seed_across_ranks(self) -> None:
        """Raise if ranks disagree on seed or index (silent duplication in other libraries)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        mine = (self.seed, self.index.fingerprint, self.policy, repr(self.shuffle))
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        bad = [r for r, v in enumerate(everyone) if tuple(v) != mine]
        if bad:
            raise PlanError(
                f"StreamingDataset({self.store.root_url!r}): ranks disagree on (seed, index, policy, shuffle): "
                f"rank {dist.get_rank()} has {mine[:1] + mine[2:]}, ranks {bad} differ ({everyone[bad[0]][:1]}...). "
                "Pass the same seed and settings on every rank, or data is duplicated silently."
            )


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


def collate_samples(batch: list[Any]) -> Any:
    """``default_collate`` for sample dicts, keeping the ``__meta__`` fields as plain lists.

    ``__shard__``/``__index__`` would otherwise become one small tensor each, and every tensor
    crosses from a worker to the main process through its own shared-memory segment: measured,
    that halves loader throughput at small batches. Non-dict samples go to ``default_collate``.
    """
    if batch and isinstance(batch[0], Mapping):
        meta = {k: [s[k] for s in batch] for k in batch[0] if k.startswith("__")}
        data = default_collate([{k: v for k, v in s.items() if not k.startswith("__")} for s in batch])
        return {**meta, **data}
    return default_collate(batch)


class StreamingDataLoader(DataLoader):
    """A ``DataLoader`` that counts the batches it hands out, so the dataset's state is exact.

    Same arguments as ``torch.utils.data.DataLoader``; ``batch_size`` defaults to (and must equal)
    the dataset's, and ``collate_fn`` to :func:`collate_samples`. ``state_dict()`` /
    ``load_state_dict()`` save and restore the exact position, with any ``num_workers``, and resume
    on another world size or worker count.
    """

    def __init__(self, dataset: StreamingDataset, batch_size: int | None = None, **kwargs: Any) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise TypeError(f"StreamingDataLoader needs a StreamingDataset, got {type(dataset).__name__}")
        batch_size = dataset.batch_size if batch_size is None else batch_size
        if batch_size != dataset.batch_size:
            raise PlanError(
                f"StreamingDataLoader(batch_size={batch_size}) differs from StreamingDataset(batch_size={dataset.batch_size}); "
                "give the dataset the loader's batch size so streams are cut in whole batches"
            )
        kwargs.setdefault("collate_fn", collate_samples)
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        dataset._counted_by_loader = True
        dataset._loader_workers = self.num_workers
        self._batches = 0

    def __iter__(self) -> Iterator[Any]:
        self._batches = 0
        for batch in super().__iter__():
            self._batches += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The exact position: the dataset's state after the batches handed out so far."""
        return {"version": STATE_VERSION, "dataset": self.dataset.state_after(self._batches)}  # type: ignore[attr-defined]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the position of ``state`` (on any world size / worker count)."""
        if state.get("version") != STATE_VERSION:
            raise PlanError(f"StreamingDataLoader state version {state.get('version')!r} is not {STATE_VERSION}")
        self.dataset.load_state_dict(state["dataset"])  # type: ignore[attr-defined]
        self._batches = 0

