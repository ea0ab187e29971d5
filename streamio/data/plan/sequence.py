"""The global sequence G of an epoch: which sample of which source sits at each position.

The planner cuts G into rank, worker and window blocks by position only (:mod:`.stage`); this
module is the one place that knows what a position *is*. It answers two questions about any
interval of G: which samples (as :class:`Run` values, one sequential read each), and in which order
(:meth:`EpochSequence.window`).

Three layers, each a pure function of (source sizes, seed, epoch, settings):

1. **A cycle** (:class:`CycleOrder`): a source's shards in a keyed order (index order without
   shard shuffle), their samples concatenated.
2. **A source's epoch slice** (``c`` samples, its contribution): ``c // size`` full passes, each
   in its own shard order, then ``c % size`` samples of the source's *remainder walk* (one shard
   order walked cyclically across epochs; see :meth:`EpochSequence._source_runs`). So a source
   smaller than its share is repeated, every sample ``floor`` or ``ceil(c / size)`` times per
   epoch, and one larger sees the next part each epoch (every sample before any repeats). A lone
   source contributing its size reads one pass, keyed ``(seed, epoch)`` as before mixtures existed.
3. **The mixture.** The sources' epoch slices interleaved proportionally to their contributions
   (:class:`~.interleave.Interleave`): any window of ``w`` positions holds ``w * c_i / sum(c)`` of
   source ``i`` within 2, and each source's slice keeps its own order.

The cross-shard shuffle is not here: it reorders each worker's block (:mod:`.lanes`), so a rank
reads the same shards with or without it.

Shards are numbered globally: source ``i``'s shard ``s`` is ``offsets[i] + s``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from streamio.data.plan.interleave import Interleave
from streamio.data.plan.intervals import Seq, split
from streamio.data.plan.permutation import TAG_REST, TAG_SHARDS, permutation

__all__ = ["CycleOrder", "EpochSequence", "Run", "SourceLayout"]

_I64 = np.int64


class Run(NamedTuple):
    """Samples ``[first, end)`` of shard ``shard`` (a global shard number: see the module docstring)."""

    shard: int
    first: int
    end: int


Window = tuple[list[Run], "np.ndarray | None"]
"""Runs in storage order, and the order of their samples in G (None: storage order)."""


class CycleOrder:
    """One cycle of one source: its shards in cycle order, their samples concatenated.

    Args:
        order: local shard numbers in cycle order.
        counts: samples per local shard (index order).
        offset: the source's first global shard number.
    """

    def __init__(self, order: np.ndarray, counts: np.ndarray, offset: int) -> None:
        self.order, self.offset = order, offset
        self.cum = np.concatenate(([0], np.cumsum(counts[order]))).astype(_I64)
        self.size = int(self.cum[-1])

    def runs(self, a: int, b: int) -> list[Run]:
        """Runs covering positions ``[a, b)`` of the cycle, in order."""
        return self.runs_of(np.array([a], _I64), np.array([b], _I64))

    def runs_of(self, a: np.ndarray, b: np.ndarray) -> list[Run]:
        """Runs covering the ranges ``[a_i, b_i)`` of the cycle, range by range, in order (one numpy pass)."""
        j, lo, hi = split(a, b, self.cum)
        shards = (self.order[j] + self.offset).tolist()
        return [Run(x, y, z) for x, y, z in zip(shards, lo.tolist(), hi.tolist(), strict=True)]


@dataclass(frozen=True)
class SourceLayout:
    """What the sequence needs of one source.

    Attributes:
        counts: samples per shard, in index order.
        contribution: samples this source contributes to each epoch.
        offset: the source's first global shard number.
    """

    counts: np.ndarray
    contribution: int
    offset: int

    @cached_property
    def size(self) -> int:
        """Samples in the source (one cycle)."""
        return int(self.counts.sum())


class EpochSequence:
    """The global sequence G of one epoch (see the module docstring).

    Args:
        sources: the sources, in mixture order.
        seed: base seed; epoch: the epoch.
        shuffle_shards: permute each cycle's shard order (else index order).
    """

    def __init__(self, sources: Sequence[SourceLayout], *, seed: int, epoch: int, shuffle_shards: bool) -> None:
        self.sources, self.seed, self.epoch = list(sources), seed, epoch
        self.shuffle_shards = shuffle_shards
        self.contributions = np.array([s.contribution for s in self.sources], dtype=_I64)
        self.total = int(self.contributions.sum())
        self.mixed = len(self.sources) > 1
        self._mix = Interleave(self.contributions) if self.mixed else None
        self._cycles: dict[tuple[int, str, int], CycleOrder] = {}

    def cycle(self, source: int, kind: str, n: int) -> CycleOrder:
        """Pass ``n`` of this epoch (``kind="pass"``) or remainder cycle ``n`` (``"rest"``) of a source."""
        found = self._cycles.get((source, kind, n))
        if found is None:
            src = self.sources[source]
            shards = src.counts.size
            if not self.shuffle_shards:
                order = np.arange(shards, dtype=_I64)
            elif kind == "pass" and n == 0 and not self.mixed:
                order = permutation((self.seed, self.epoch, TAG_SHARDS), shards)  # one data set, as ever
            elif kind == "pass":
                order = permutation((self.seed, self.epoch, TAG_SHARDS, source, n), shards)
            else:
                order = permutation((self.seed, n, TAG_REST, source), shards)
            if len(self._cycles) > 64:
                self._cycles.clear()
            found = self._cycles[(source, kind, n)] = CycleOrder(order, src.counts, src.offset)
        return found

    def _source_runs(self, source: int, a: int, b: int) -> list[Run]:
        """Runs of positions ``[a, b)`` of the source's epoch slice, in order.

        The slice is ``m = c // size`` full passes (each its own shard order) and then ``r = c % size``
        samples of the remainder walk: one shard order walked cyclically, ``r`` samples per epoch,
        from offset ``(e * r) % size`` (wrapping to its start), reshuffled whenever the walk is back
        at offset 0 (every ``lcm(size, r) / r`` epochs). So every sample is in an epoch ``m`` or
        ``m + 1`` times, and the remainders of consecutive epochs see every sample before any repeats.
        """
        src = self.sources[source]
        size, c = src.size, src.contribution
        passes, rest = divmod(c, size)
        runs: list[Run] = []
        for p in range(a // size, min(passes, -(-b // size))):
            lo, hi = max(a, p * size) - p * size, min(b, (p + 1) * size) - p * size
            runs.extend(self.cycle(source, "pass", p).runs(lo, hi))
        lo, hi = max(a, passes * size) - passes * size, b - passes * size
        if hi <= lo:
            return runs
        walked = self.epoch * rest
        walk = self.cycle(source, "rest", walked // math.lcm(size, rest))
        first = walked % size
        for x, y in ((first + lo, min(first + hi, size)), (max(first + lo, size) - size, first + hi - size)):
            if y > x:
                runs.extend(walk.runs(x, y))
        return runs

    def window(self, g: Seq, ordered: bool = True) -> Window:
        """The samples of the intervals ``g`` of G: runs, and their order in ``g`` (None: run order).

        One source: the runs are in G's order (None). A mixture: each interval's runs are listed
        source by source, and the order (computed only when ``ordered``) interleaves them.
        """
        if self._mix is None and self.sources[0].contribution == self.sources[0].size:
            return self.cycle(0, "pass", 0).runs_of(g.starts, g.ends), None  # one pass: every range at once
        runs: list[Run] = []
        orders: list[np.ndarray] = []
        for a, b in zip(g.starts.tolist(), g.ends.tolist(), strict=True):
            if b <= a:
                continue
            base = sum(x.end - x.first for x in runs)
            if self._mix is None:
                runs.extend(self._source_runs(0, a, b))
                continue
            if not ordered:
                first, stop = self._mix.counts(a), self._mix.counts(b)
                mix_order = None
            else:
                first, stop, mix_order = self._mix.items(a, b)
            for i, (x, y) in enumerate(zip(first.tolist(), stop.tolist(), strict=True)):
                runs.extend(self._source_runs(i, x, y))
            if mix_order is not None:
                orders.append(mix_order + base)
        if self._mix is None or not ordered:
            return runs, None
        return runs, np.concatenate(orders) if orders else np.zeros(0, _I64)

    def expected_runs(self) -> list[Run]:
        """Every sample the epoch holds, as runs (with repeats): what exactly-once is checked against."""
        return self.window(Seq.whole(self.total), ordered=False)[0]
