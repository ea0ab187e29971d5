"""The public plan of one epoch: :func:`plan_epoch` and :class:`EpochPlan` (see :mod:`streamio.data.plan`).

:func:`plan_epoch` builds the global sequence G from the keyed shard order, replays the stages of a
resume state (each consumed stage's remainder becomes the next stage's sequence) and returns the
plan of the current stage; :class:`EpochPlan` hands out worker streams, checks the invariants and
writes the resume state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from streamio.data.plan.config import MAX_EPOCH, Sampling, Topology, check_int
from streamio.data.plan.intervals import Seq
from streamio.data.plan.mixture import PlanSource, contributions
from streamio.data.plan.resume import (
    check_stage_fits,
    check_state,
    fingerprint,
    make_state,
    parse_stages,
    per_rank_counts,
    stage_record,
)
from streamio.data.plan.sequence import EpochSequence, Run, SourceLayout
from streamio.data.plan.stage import Stage
from streamio.data.plan.stream import WorkerStream
from streamio.errors import PlanError

__all__ = ["DEFAULT_SAMPLING", "EpochPlan", "plan_epoch"]

_I64 = np.int64

DEFAULT_SAMPLING = Sampling()
"""The default :class:`~streamio.data.plan.Shuffle` (across shards, windows of 256), ``"pad"`` tail policy."""


class EpochPlan:
    """The plan of one epoch (or of its rest, after a resume) for one topology.

    Build it with :func:`plan_epoch`. All ranks compute the same plan independently.

    Attributes:
        epoch: the epoch.
        world_size: ranks.
        num_workers: DataLoader workers per rank, as given (0 = in the main process).
        batch_size: the DataLoader batch size the worker split is aligned to.
        total_samples: samples in one epoch, before the tail policy (the data set's size, or the
            sum of a mixture's contributions).
        contributions: samples each source contributes to the epoch (one entry for one source).
        samples_per_rank: samples each rank yields from this plan (after a resume: the rest).
        batches_per_rank: batches each rank's DataLoader yields from this plan (``drop_last=False``;
            with ``drop_last=True`` one fewer when ``stage_samples_per_rank % batch_size``).
        stage_samples_per_rank: samples per rank of the current stage (the whole epoch unless the
            topology changed mid-epoch), including any already consumed.
        policy: the tail policy, ``"pad"`` or ``"drop"``.
        padding: samples the ``"pad"`` policy repeats in this stage (total over ranks).
        dropped: samples the ``"drop"`` policy leaves out in this stage (total over ranks).
        stage: how many topology changes this epoch has seen.
    """

    def __init__(
        self, *, stage: Stage, sequence: EpochSequence, topology: Topology, fingerprint: dict[str, Any],
        epoch: int, history: list[dict[str, Any]], start_batches: int,
    ) -> None:
        self._stage, self._seq = stage, sequence
        self._fp, self._history, self._start = fingerprint, history, start_batches
        self.epoch = epoch
        self.world_size = stage.topo.world_size
        self.num_workers = topology.num_workers
        self.batch_size = stage.topo.batch_size
        self.total_samples = sequence.total
        self.contributions = tuple(int(c) for c in sequence.contributions)
        self.stage = stage.index
        self.stage_samples_per_rank = stage.per_rank
        self.samples_per_rank = max(0, stage.per_rank - min(start_batches * self.batch_size, stage.per_rank))
        self.batches_per_rank = max(0, stage.batches - start_batches)
        self.padding = stage.padding
        self.dropped = stage.dropped
        self.policy = stage.policy

    def __repr__(self) -> str:
        return (
            f"EpochPlan(epoch={self.epoch}, stage={self.stage}, world_size={self.world_size}, "
            f"num_workers={self.num_workers}, batch_size={self.batch_size}, "
            f"samples_per_rank={self.samples_per_rank}, padding={self.padding}, dropped={self.dropped})"
        )

    @property
    def shard_order(self) -> tuple[int, ...]:
        """This epoch's shard order (of the first source's first pass, for a mixture)."""
        return tuple(int(s) for s in self._seq.cycle(0, "pass", 0).order)

    @property
    def sequence(self) -> EpochSequence:
        """The epoch's global sequence G (what each position holds)."""
        return self._seq

    def _check(self, rank: int, worker: int) -> None:
        if not 0 <= rank < self.world_size:
            raise PlanError(f"rank {rank} is outside world_size={self.world_size}; pass 0 <= rank < world_size.")
        if not 0 <= worker < self._stage.topo.workers:
            raise PlanError(
                f"worker {worker} is outside num_workers={self.num_workers}; pass 0 <= worker < max(num_workers, 1)."
            )

    def stream(self, rank: int, worker: int = 0) -> WorkerStream:
        """The stream of DataLoader worker ``worker`` on ``rank`` (``worker=0`` without workers).

        Args:
            rank: this process's rank.
            worker: ``torch.utils.data.get_worker_info().id``, or 0 in the main process.

        Raises:
            PlanError: ``rank`` or ``worker`` is out of range.
        """
        self._check(rank, worker)
        w = self._stage.topo.workers
        plan_worker = (self._start + worker) % w  # a fresh DataLoader asks worker 0 first
        start = self._stage.consumed(plan_worker, self._start)
        return WorkerStream(self._stage, self._seq, rank=rank, worker=worker, plan_worker=plan_worker, start=start)

    def streams(self, rank: int) -> list[WorkerStream]:
        """Every worker's stream of ``rank``, by DataLoader worker id."""
        return [self.stream(rank, w) for w in range(self._stage.topo.workers)]

    def rank_order(self, rank: int) -> Iterator[tuple[int, int]]:
        """``(shard, sample)`` in the order the rank's DataLoader delivers them (batches round-robin)."""
        its = [iter(s) for s in self.streams(rank)]
        sizes = [s.size for s in self.streams(rank)]
        b, w = self.batch_size, len(its)
        t = 0
        while any(sizes):
            k = t % w
            take = min(b, sizes[k])
            sizes[k] -= take
            for _ in range(take):
                yield next(its[k])
            t += 1

    def positions(self, batches: int) -> list[int]:
        """Exact per-worker positions after the rank's consumer took ``batches`` from this plan.

        Batch ``b`` of the stage comes from plan worker ``b % W``, so after ``C`` batches worker
        ``w`` has yielded its first ``ceil((C - w) / W)`` batches; this is that mapping, in samples
        of each worker's stage stream, indexed by DataLoader worker id (rotation included). The
        same numbers are what :meth:`state_dict` records implicitly.

        Args:
            batches: batches taken from this plan's DataLoader on this rank (0..batches_per_rank).
        """
        w = self._stage.topo.workers
        total = self._start + min(max(batches, 0), self.batches_per_rank)
        return [self._stage.consumed((self._start + k) % w, total) for k in range(w)]

    def check(self) -> list[str]:
        """Verify invariants 1 and 2 for this topology from the runs alone (O(runs log runs)).

        Equal work: every rank yields :attr:`samples_per_rank` samples in :attr:`batches_per_rank`
        batches. Exactly once (a fresh epoch only, where the whole data set is owed): the runs of
        all (rank, worker) streams cover every sample once, except exactly :attr:`dropped` samples
        never covered and :attr:`padding` extra coverings. Nothing is materialised per sample.

        Returns:
            One line per violated invariant; empty when both hold.
        """
        problems: list[str] = []
        b = self.batch_size
        actual: list[Run] = []
        for rank in range(self.world_size):
            streams = self.streams(rank)
            n = sum(s.size for s in streams)
            nb = sum(-(-s.size // b) for s in streams)
            if n != self.samples_per_rank or nb != self.batches_per_rank:
                problems.append(
                    f"equal work: rank {rank} yields {n} samples in {nb} batches, "
                    f"not {self.samples_per_rank} in {self.batches_per_rank}"
                )
            for s in streams:
                actual.extend(s.runs)
        if self.stage or self._start:
            return problems  # a resumed plan owes only the rest; the property tests cover it
        missing, extra = coverage_difference(self._seq, actual, self._seq.expected_runs())
        if missing != self.dropped or extra != self.padding:
            problems.append(
                f"exactly once: {missing} samples never yielded and {extra} yielded again; "
                f"the {self.policy!r} policy states {self.dropped} dropped and {self.padding} padded"
            )
        return problems

    def state_dict(self, batches: int | Sequence[int]) -> dict[str, Any]:
        """The resume state after each rank's consumer received ``batches`` from this plan.

        Args:
            batches: batches (of ``batch_size``; samples when it is 1) the training loop has taken
                from this plan's DataLoader: one int when every rank took the same number (DDP), or
                one per rank.

        Returns:
            A small JSON-safe dict (see :mod:`streamio.data.plan`); pass it as ``resume=`` to
            :func:`plan_epoch`, with any topology.

        Raises:
            PlanError: a count is negative or above :attr:`batches_per_rank`, or the list length
                differs from the world size.
        """
        per = per_rank_counts(batches, self.world_size, f"EpochPlan.state_dict(batches={batches!r})")
        for r, c in enumerate(per):
            if c > self.batches_per_rank:
                raise PlanError(
                    f"rank {r} cannot have consumed {c} batches of epoch {self.epoch}: this plan yields "
                    f"{self.batches_per_rank} per rank; pass the batches taken since this plan started."
                )
        stage = stage_record(self._stage.topo, [self._start + c for c in per])
        return make_state(self._fp, self.epoch, [*self._history, stage])


def coverage_difference(seq: EpochSequence, actual: Sequence[Run], expected: Sequence[Run]) -> tuple[int, int]:
    """``(missing, extra)``: samples ``expected`` holds more often than ``actual``, and the reverse.

    Both are multisets of runs (a sample may be owed more than once by a repeated source); the sweep
    is over global shard positions, O(runs log runs).
    """
    counts = np.concatenate([s.counts for s in seq.sources])
    base = np.concatenate(([0], np.cumsum(counts))).astype(_I64)

    def edges(runs: Sequence[Run], sign: int) -> tuple[np.ndarray, np.ndarray]:
        if not runs:
            return np.zeros(0, _I64), np.zeros(0, _I64)
        arr = np.asarray(runs, dtype=_I64).reshape(-1, 3)
        lo, hi = base[arr[:, 0]] + arr[:, 1], base[arr[:, 0]] + arr[:, 2]
        return np.concatenate((lo, hi)), np.concatenate((np.full(lo.size, sign, _I64), np.full(hi.size, -sign, _I64)))

    pa, da = edges(actual, 1)
    pe, de = edges(expected, -1)
    pos = np.concatenate((pa, pe, [0, int(base[-1])]))
    delta = np.concatenate((da, de, [0, 0]))
    order = np.argsort(pos, kind="stable")
    pos, level = pos[order], np.cumsum(delta[order])
    seg, level = np.diff(pos), level[:-1]
    return int((seg * np.maximum(-level, 0)).sum()), int((seg * np.maximum(level, 0)).sum())


def _sources(sample_counts: Sequence[int] | np.ndarray | Sequence[PlanSource]) -> list[PlanSource]:
    if isinstance(sample_counts, Sequence) and sample_counts and all(isinstance(x, PlanSource) for x in sample_counts):
        return list(sample_counts)  # type: ignore[arg-type]
    counts = np.asarray(sample_counts)
    if counts.ndim != 1 or (counts.size and (counts.dtype.kind not in "iu" or int(counts.min()) < 0)):
        raise PlanError(
            "sample_counts must be a 1-D sequence of ints >= 0 (samples per shard, in index order), "
            "or a list of PlanSource."
        )
    if int(counts.sum()) == 0:
        raise PlanError(
            f"the data set has no samples ({counts.size} shards, all empty); nothing to plan. Check the index."
        )
    return [PlanSource(counts.astype(_I64))]


def plan_epoch(
    sample_counts: Sequence[int] | np.ndarray | Sequence[PlanSource],
    *,
    seed: int,
    epoch: int,
    topology: Topology,
    sampling: Sampling = DEFAULT_SAMPLING,
    resume: Mapping[str, Any] | None = None,
    index_fingerprint: str | None = None,
    epoch_samples: int | None = None,
) -> EpochPlan:
    """Plan one epoch (or the rest of it, from ``resume``) for one topology.

    Args:
        sample_counts: samples per shard of one data set, in index order (zeros allowed); or the
            sources of a mixture, as :class:`~streamio.data.plan.PlanSource` values (their counts,
            weight or samples per epoch, and index fingerprints).
        seed: base seed (int >= 0); persisted in the state fingerprint.
        epoch: epoch number (int >= 0); with ``seed`` it keys the shard order.
        topology: ranks, DataLoader workers per rank and batch size of the readers.
        sampling: shard and sample-level shuffle, and the tail policy.
        resume: a state from :meth:`EpochPlan.state_dict` of this epoch, or ``None`` for a fresh
            epoch. Any topology may resume any state.
        index_fingerprint: the index's own fingerprint (one data set), recorded in and checked
            against the state.
        epoch_samples: samples per epoch of a mixture (weights are scaled to it); None = the sum of
            the sources' contributions.

    Returns:
        The plan; ``plan.stream(rank, worker)`` is what each DataLoader worker reads.

    Raises:
        PlanError: invalid arguments, an empty data set or source, ``"drop"`` with fewer samples
            than ranks, or a malformed state.
        StateMismatchError: the state belongs to another data set, mixture, seed, policy, shuffle
            or epoch.
    """
    sources = _sources(sample_counts)
    if index_fingerprint is not None and len(sources) == 1 and sources[0].fingerprint is None:
        sources = [PlanSource(sources[0].counts, sources[0].weight, sources[0].samples, index_fingerprint)]
    seed = check_int("seed", seed, 0)
    epoch = check_int("epoch", epoch, 0, MAX_EPOCH)
    if not isinstance(topology, Topology):
        raise PlanError(f"topology={topology!r} must be a streamio.data.plan.Topology.")
    if not isinstance(sampling, Sampling):
        raise PlanError(f"sampling={sampling!r} must be a streamio.data.plan.Sampling.")
    shares = contributions(sources, epoch_samples)
    fp = fingerprint(sources, shares, seed, sampling)
    offsets = np.concatenate(([0], np.cumsum([s.counts.size for s in sources]))).astype(_I64)
    layouts = [SourceLayout(s.counts, c, int(o)) for s, c, o in zip(sources, shares, offsets, strict=False)]
    seq_g = EpochSequence(layouts, seed=seed, epoch=epoch, shuffle_shards=sampling.shuffle.shards)
    streams = topology.streams()  # num_workers=0 reads one stream, the same as 1
    key = (seed, epoch)

    def new_plan(index: int, seq: Seq, history: list[dict[str, Any]], start: int) -> EpochPlan:
        stage = Stage(index, seq, streams, sampling, key)
        return EpochPlan(
            stage=stage, sequence=seq_g, topology=topology, fingerprint=fp,
            epoch=epoch, history=history, start_batches=start,
        )

    seq = Seq.whole(seq_g.total)
    if resume is None:
        if sampling.policy == "drop" and seq_g.total < topology.world_size:
            raise PlanError(
                f"world_size={topology.world_size} exceeds the {seq_g.total} samples of the epoch: "
                "with policy='drop' every rank would get 0. Use policy='pad' or fewer ranks."
            )
        return new_plan(0, seq, [], 0)

    names = [s.name if s.name != "source" else f"source {i}" for i, s in enumerate(sources)]
    stages = parse_stages(check_state(resume, fp, epoch, names))
    history: list[dict[str, Any]] = []
    for i, (topo, per, raw) in enumerate(stages):
        check_stage_fits(i, topo, len(seq))
        stage = Stage(i, seq, topo, sampling, key)
        for r, c in enumerate(per):
            if c > stage.batches:
                raise PlanError(
                    f"resume state stage {i}: rank {r} consumed {c} batches but the stage has {stage.batches}; "
                    "the state does not belong to this data set."
                )
        if i == len(stages) - 1 and topo == streams and len(set(per)) == 1:
            return new_plan(i, seq, history, per[0])  # the same topology: the last stage continues
        history.append(raw)
        seq = stage.remaining(per)
    return new_plan(len(stages), seq, history, 0)
