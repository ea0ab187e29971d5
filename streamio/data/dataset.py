"""``StreamingDataset``: the drop-in ``IterableDataset`` over an indexed tar dataset in any store.

Composition (each piece is its own module; this one only wires them):

* :mod:`streamio.data.format.index` — the dataset's shards, sample counts and per-sample offsets/CRCs;
* :mod:`streamio.data.plan` — which samples this (epoch, rank, worker) reads, as runs and windows;
* :mod:`streamio.data.read.reader` — the windows' samples, fetched ahead (:mod:`streamio.data.read.prefetch`)
  through the node-local cache (:mod:`streamio.data.cache`), verified (:mod:`streamio.data.format.samples`)
  and decoded (:mod:`streamio.data.decode`), then transformed; or left as read, for a loader that runs
  :meth:`StreamingDataset.prepare` on its own threads (``StreamingDataLoader(threads=N)``);
* :mod:`streamio.data.loader` — :class:`~streamio.data.loader.StreamingDataLoader`, which counts
  the batches it hands out.

Topology comes from torch at iteration time (:func:`streamio.distributed.rank_and_world`: the
process group when initialised, else torchrun's ``RANK``/``WORLD_SIZE``, else one process; the
DataLoader worker from ``get_worker_info()``) and is passed to the pure planner.

Exact resume. The planner's state is "how many batches each rank's consumer took" (plus the
topology); who knows that number depends on the loader (docs/design.md "StreamingDataset and exact
resume" has the table): :class:`~streamio.data.loader.StreamingDataLoader` counts the batches it
hands out (:meth:`StreamingDataset.attach_loader`, :meth:`StreamingDataset.state_after`), exact
with any ``num_workers`` or ``threads`` on any topology; torchdata's ``StatefulDataLoader`` keeps
one state per worker (the same ``num_workers`` only: :mod:`streamio.data.dataloader.stateful_loader`);
without workers the dataset counts what it yielded; a plain ``DataLoader`` with workers cannot be exact.

The state is a small, versioned JSON-safe dict; it records the seed and the index fingerprint (via
the plan) so it is never applied to another dataset silently. :mod:`streamio.data.position` holds
the position and checks a loaded state (untrusted: every claimed size is bounded before it is used).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from streamio import metrics
from streamio.data.cache import ShardCache
from streamio.data.dataloader.allocator import tune_worker_malloc
from streamio.data.dataloader.stateful_loader import LoaderState, install
from streamio.data.decode import DecodeSpec, make_decoder
from streamio.data.mixing import (
    Stream,
    describe_mixture,
    describe_request,
    load_streams,
    packed_documents,
    plan_sources,
)
from streamio.data.options import DatasetOptions
from streamio.data.plan import EpochPlan, Pack, PackPlan, Sampling, Shuffle, Topology, WorkerStream, plan_epoch
from streamio.data.plan.packing import PackStream, plan_packing
from streamio.data.position import (
    Position,
    WorkerPosition,
    check_ended,
    check_loaded_worker,
    check_worker,
    load_loader_state,
    parse_state,
    state_of,
    warn_plain_workers,
)
from streamio.data.read.reader import WindowReader
from streamio.data.read.sequences import TokenPacker
from streamio.data.sharing import OpenGroup, check_agreement
from streamio.deprecation import fold_moved
from streamio.distributed import rank_and_world
from streamio.errors import PlanError
from streamio.metrics import trace

__all__ = ["DatasetOptions", "StreamingDataset"]

log = logging.getLogger(__name__)


class StreamingDataset(IterableDataset):
    """Samples of an indexed WebDataset-style dataset or a mixture, exactly once per epoch on all ranks and workers.

    Args:
        url: dataset prefix holding ``index.json`` (any fsspec URL; without an index the error
            says how to make one: ``streamio index URL``); or a mixture: a list of
            :class:`~streamio.data.mixing.Stream` (each with a weight or samples per epoch, and its
            own storage options), where a plain URL in the list contributes all of itself.
        batch_size: the batch size of the DataLoader that will consume this dataset. Worker streams
            are cut in whole batches so that every rank yields the same number of batches and a
            resume position is exact.
        seed: base seed; must be the same on every rank (checked when a process group exists).
        shuffle: ``True`` (the default :class:`~streamio.data.plan.Shuffle`: shard order reshuffled
            every epoch, each worker reading 32 shards at once interleaved, samples shuffled within
            windows of 256), ``False`` (index order), or a :class:`~streamio.data.plan.Shuffle`
            (``Shuffle(interleave=1)`` reads one shard at a time).
        decode: None (members stay bytes), ``"auto"`` (built-in safe decoders), a mapping of
            extension -> decoder, or a callable on the whole sample.
        transform: applied to each decoded sample (with ``StreamingDataLoader(threads=N)`` on N threads
            at once, so it must be thread-safe: :meth:`prepare`).
        storage_options: fsspec options (endpoint, credentials) for ``url``.
        pack: yield token sequences packed at read time (:class:`~streamio.data.plan.Pack`; design: "Token packing").
        options: tail policy, cache, prefetch, fault handler, samples per epoch (:class:`DatasetOptions`).
        moved: 0.1's ``policy=``, ``cache=``, ``prefetch=``, ``handler=`` (removed in 0.3.0) and 0.2's
            ``epoch_samples=`` (removed in 0.4.0): deprecated (a warning); give them in ``options``.

    Raises:
        ArgumentError: an unknown keyword, or a moved one given together with ``options``.

    Attributes:
        sources: each source's :class:`~streamio.data.mixing.Stream`, store and index.
        store: the (first) source's store; index: its index.
        sampling: the shuffle and tail policy every plan of this dataset uses.
        position: where the dataset stands (:class:`~streamio.data.position.Position`).
    """

    def __init__(  # noqa: PLR0913 - pack= is the one keyword a token job adds (issue 28's API)
        self,
        url: str | Stream | Sequence[str | Stream],
        *,
        batch_size: int = 1,
        seed: int = 0,
        shuffle: bool | Shuffle = True,
        decode: DecodeSpec = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        options: DatasetOptions | None = None,
        pack: Pack | None = None,
        **moved: Any,
    ) -> None:
        super().__init__()
        later = {k: moved.pop(k) for k in ("epoch_samples",) if k in moved}  # moved in 0.3.0, beside options=
        options = fold_moved("StreamingDataset", moved, into="options", given=options, make=DatasetOptions,
                             fields=("policy", "cache", "prefetch", "handler"))
        options = fold_moved("StreamingDataset", later, into="options", given=options, make=DatasetOptions,
                             fields=("epoch_samples",), alongside=True)
        self.options = options if options is not None else DatasetOptions()
        self.epoch_samples = self.options.epoch_samples
        shuffle = shuffle if isinstance(shuffle, Shuffle) else Shuffle() if shuffle else Shuffle.off()
        self.sampling = Sampling(shuffle=shuffle, policy=self.options.policy)
        self.seed, self.batch_size, self.transform = seed, batch_size, transform
        with OpenGroup(self.options.collective_timeout_s, describe_request(url)) as group:
            self.sources = load_streams(url, storage_options, group)  # under a process group: read by rank 0
            indexes = tuple((src.index.fingerprint, src.stream.weight, src.stream.samples) for src in self.sources)
            check_agreement(group, (seed, (indexes, self.epoch_samples), self.options.policy, repr(shuffle)))
        self.store, self.index = self.sources[0].store, self.sources[0].index  # the (first) source's
        self.pack, self._doc_tokens = pack, packed_documents(self.sources, self.epoch_samples, pack)
        self.reader, self.packer = _readers(self, None if pack is not None else decode)
        self.position = Position()
        self._counted_by_loader, self._loader_workers = False, 0
        self._state_taken_in_worker = False  # a stateful loader (torchdata's) asks each worker for it
        install(StreamingDataset)  # torchdata's StatefulDataLoader restores `epoch` here too

    def __repr__(self) -> str:
        if plan_sources(self.sources, self.epoch_samples) is None:
            root, shards, samples = self.store.root_url, len(self.index.shards), self.index.samples
            return f"StreamingDataset({root!r}, shards={shards}, samples={samples})"
        return f"StreamingDataset({describe_mixture(self.sources, self.contributions)})"

    @property
    def epoch(self) -> int:
        """The epoch :meth:`set_epoch` (or :meth:`load_state_dict`) selected; assigning it is :meth:`set_epoch`."""
        return self.position.epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.set_epoch(epoch)

    @property
    def contributions(self) -> tuple[int, ...]:
        """Samples each source contributes to every epoch (one entry for one dataset)."""
        return self.plan().contributions

    @property
    def lost_samples(self) -> int:
        """Samples this process skipped because the fault handler said so (see :class:`DatasetOptions`)."""
        return self.reader.lost_samples

    def attach_loader(self, num_workers: int) -> None:
        """Declare that a loader which counts the batches it hands out reads this dataset.

        :class:`~streamio.data.loader.StreamingDataLoader` calls this when it is built; a loader of
        your own that counts batches and saves :meth:`state_after` should call it too. The dataset
        then plans :meth:`state_after` and :meth:`load_state_dict` for that loader's
        ``num_workers``, and its workers stop warning that a plain DataLoader cannot resume exactly.

        Args:
            num_workers: the loader's DataLoader worker count (0 = main process).
        """
        self._counted_by_loader = True
        self._loader_workers = num_workers

    # ------------------------------------------------------------------ planning
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to iterate (reshuffles); call it on every rank before each epoch.

        A resume state of another epoch is dropped; nothing of the selected epoch has been yielded
        yet, so :meth:`state_dict` taken now is its start, not the end of the epoch before.
        """
        self.position.select(int(epoch))

    def plan(self, num_workers: int = 0) -> EpochPlan | PackPlan:
        """This epoch's plan (of sequences with ``pack=``) for this world size and ``num_workers``, from any state."""
        return _plan(self, num_workers, self.epoch, self.position.resume)

    def __len__(self) -> int:
        """Samples this rank yields in its next (or current) iteration; equal on every rank.

        The rest of the epoch after a resume; the whole next epoch once this one was read to its
        end (the next iteration reads it, see :meth:`begin_iteration`).
        """
        if self.position.ended:
            return _plan(self, 0, self.epoch + 1, None).samples_per_rank
        return self.plan().samples_per_rank

    def begin_iteration(self) -> int:
        """Start an iteration of the consumer that counts batches: a loader's, in the main process.

        After an iteration that ran to its end, and without :meth:`set_epoch` since, the dataset
        moves to the next epoch first (:mod:`streamio.data.position`). Call it before the workers
        fork, and :meth:`end_iteration` after the last batch (StreamingDataLoader and torchdata's
        StatefulDataLoader do; without workers the dataset does it itself).

        Returns:
            a token for :meth:`end_iteration`.
        """
        return self.position.begin()

    def end_iteration(self, token: int) -> None:
        """Record that the iteration :meth:`begin_iteration` returned ``token`` for took the whole epoch.

        Ignored when :meth:`set_epoch` or :meth:`load_state_dict` moved the dataset since.
        """
        self.position.end(token)

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Any]:
        return _iterate(self, prepared=True)

    def iterate(self, *, prepared: bool = True) -> Iterator[Any]:
        """This process's samples of the iteration (``iter(dataset)``); ``prepared=False``: as read, verified,
        not decoded or transformed, for a loader that runs :meth:`prepare` on them (``threads=N``: on its threads)."""
        return _iterate(self, prepared=prepared)

    def prepare(self, sample: Any) -> Any:
        """``decode``, then ``transform``: what :meth:`iterate` does to each sample unless ``prepared=False``.
        ``StreamingDataLoader(threads=N)`` runs it on N threads at once: your decoder and transform must be
        thread-safe then (one that keeps state between samples, or draws a shared RNG, is not)."""
        with trace.span("decode"):
            sample = self.reader.decode(sample)
        return self.transform(sample) if self.transform is not None else sample

    # ------------------------------------------------------------------ state
    def state_after(self, batches: int) -> dict[str, Any]:
        """The resume state after this rank's consumer took ``batches`` batches of this iteration.

        What :class:`~streamio.data.loader.StreamingDataLoader` calls; exact with any number of
        workers (those given to :meth:`attach_loader`).
        """
        plan = self.plan(self._loader_workers)
        ended = self.position.ended and batches >= plan.batches_per_rank
        return state_of(self.epoch, plan.state_dict(batches), ended=ended)

    def state_dict(self) -> dict[str, Any]:
        """The resume state (torchdata ``Stateful`` protocol); see the module docstring for who is exact."""
        info = get_worker_info()
        position = self.position
        if info is not None:
            self._state_taken_in_worker = True
            return state_of(self.epoch, position.resume, WorkerPosition(info.id, position.yielded))
        plan = self.plan(0)
        if position.yielded == plan.samples_per_rank:
            return self.state_after(plan.batches_per_rank)
        if position.yielded % self.batch_size:
            raise PlanError(
                f"state_dict() after {position.yielded} samples, not a whole number of batches of "
                f"{self.batch_size}: take the state between batches"
            )
        return self.state_after(position.yielded // self.batch_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from a state made by :meth:`state_dict` / :meth:`state_after` (any topology).

        The state is untrusted (it may come from a checkpoint file): every field is checked, and
        every size it claims is bounded, before anything is planned for it. A state that is refused
        (another version, dataset, seed or policy, or a field out of its range) leaves the dataset
        as it was; loading the position it already holds changes nothing.

        Raises:
            PlanError: a malformed state or a field out of range, named with its value.
            StateMismatchError: a state of another dataset, seed, policy or shuffle.
        """
        loaded = parse_state(state)
        if self.position.holds(loaded):  # torchdata loads it again when it next iterates: a set_epoch since stays
            return
        previous = replace(self.position)
        self.position.load(loaded)
        try:
            info = get_worker_info()
            plan = self.plan(info.num_workers if info is not None else self._loader_workers)  # checks the plan state
            check_loaded_worker(self.position, plan, rank_and_world()[0], info.id if info is not None else None)
            check_ended(loaded, plan)
        except PlanError:
            self.position = previous
            raise

    def load_loader_state(self, state: LoaderState, *, num_workers: int) -> None:
        """Take the position a torchdata ``StatefulDataLoader`` state restores, in this process now.

        Called by ``StatefulDataLoader.load_state_dict`` (:mod:`streamio.data.dataloader.stateful_loader`):
        afterwards ``epoch`` and ``len()`` here are the resumed ones, so the loop
        ``for epoch in range(ds.epoch, epochs)`` neither replays nor skips an epoch.

        Args:
            state: the parsed loader state.
            num_workers: the restoring loader's worker count.

        Raises:
            PlanError: the state was saved with another ``num_workers`` (torchdata restores each
                worker's own position, so only the same count is exact), its workers disagree on
                the epoch or its start, or it is not a state of this dataset.
        """
        load_loader_state(self, state, num_workers)


def _iterate(ds: StreamingDataset, *, prepared: bool) -> Iterator[Any]:
    """:meth:`StreamingDataset.iterate`: this process's stream of the plan, counted in the dataset's position."""
    rank, _ = rank_and_world()
    info = get_worker_info()
    worker, num_workers = (0, 0) if info is None else (info.id, info.num_workers)
    counts_itself = info is None and not ds._counted_by_loader  # else a loader says when an epoch ended
    position = ds.position
    token = position.begin() if counts_itself else None
    if info is not None:
        if worker == 0 and not ds._counted_by_loader and not ds._state_taken_in_worker:
            warn_plain_workers(num_workers, position.chosen)  # worker 0 only: once per epoch
        tune_worker_malloc()
    plan = ds.plan(num_workers)
    stream = plan.stream(rank, worker)
    check_worker(position, stream)
    position.rewind()
    for sample in _samples(ds, plan, stream, position.yielded, decoded=prepared):
        position.count(token, stream.size)  # the last sample ends the epoch as it goes out
        yield ds.transform(sample) if prepared and ds.transform is not None else sample
    if token is not None:
        position.end(token)


def _readers(ds: StreamingDataset, decode: DecodeSpec) -> tuple[WindowReader, TokenPacker | None]:
    """The dataset's reader over its sources, and with ``pack=`` the packer over it."""
    cache = ShardCache(ds.options.cache) if ds.options.cache is not None else None
    reader = WindowReader([(src.store, src.index) for src in ds.sources], cache=cache, prefetch=ds.options.prefetch,
                          decode=make_decoder(decode), handler=ds.options.handler)
    return reader, TokenPacker(reader, ds.pack.member) if ds.pack is not None else None


def _samples(
    ds: StreamingDataset, plan: EpochPlan | PackPlan, stream: WorkerStream | PackStream, skip: int, *, decoded: bool
) -> Iterator[Any]:
    """The samples (or packed sequences) of ``stream``, after its first ``skip``; at their end (or
    when the iteration is closed) this process's metrics go to its parent: a forked worker's counts
    reach the main process before the worker's iterator ends (:func:`streamio.metrics.report`)."""
    if isinstance(plan, PackPlan) and isinstance(stream, PackStream) and ds.packer is not None:
        samples = ds.packer.read(plan, stream, skip)
    else:
        samples = ds.reader.read(stream.windows(), skip, decoded=decoded)  # type: ignore[union-attr]
    try:
        yield from samples
    finally:
        metrics.report()


def _plan(
    ds: StreamingDataset, num_workers: int, epoch: int, resume: Mapping[str, Any] | None
) -> EpochPlan | PackPlan:
    """The plan of ``epoch`` from ``resume`` for this process's world size and ``num_workers``."""
    _, world = rank_and_world()
    if ds.pack is not None and ds._doc_tokens is not None:
        return plan_packing(
            ds._doc_tokens, pack=ds.pack, seed=ds.seed, epoch=epoch,
            topology=Topology(world, num_workers, ds.batch_size), shuffle=ds.sampling.shuffle.shards,
            resume=resume, index_fingerprint=ds.index.fingerprint, epoch_sequences=ds.epoch_samples,
        )
    mixture = plan_sources(ds.sources, ds.epoch_samples)
    return plan_epoch(
        ds.index.sample_counts() if mixture is None else mixture,
        seed=ds.seed,
        epoch=epoch,
        topology=Topology(world, num_workers, ds.batch_size),
        sampling=ds.sampling,
        resume=resume,
        index_fingerprint=ds.index.fingerprint if mixture is None else None,
        epoch_samples=ds.epoch_samples,
    )
