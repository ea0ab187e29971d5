"""What a reader sees of a plan: runs of samples, windows, and one worker's stream.

A :class:`WorkerStream` is what one DataLoader worker of one rank reads. It is described as
:class:`Run` values (``shard, first, end``: one sequential ranged read each) grouped in
:class:`Window` values (read the runs, then yield in ``order``). :class:`ShardOrder` is the epoch's
global sequence G (shards in epoch order): it turns intervals of G into runs of shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from streamio.data.plan.intervals import Seq, merge, split
from streamio.data.plan.stage import Stage

__all__ = ["Run", "ShardOrder", "Window", "WorkerStream"]

_I64 = np.int64


class Run(NamedTuple):
    """Samples ``[first, end)`` of shard ``shard`` (index into the data set's shard list)."""

    shard: int
    first: int
    end: int


@dataclass(frozen=True)
class Window:
    """A unit of reading and yielding: read ``runs`` in order, then yield in ``order``.

    Attributes:
        runs: the samples this window yields, in storage order (sequential reads).
        order: indices into the concatenation of ``runs``' samples, in yield order; ``None`` means
            storage order, i.e. stream the runs without buffering.
    """

    runs: tuple[Run, ...]
    order: np.ndarray | None

    @property
    def size(self) -> int:
        """Number of samples in the window."""
        return sum(r.end - r.first for r in self.runs)

    @property
    def spans(self) -> tuple[Run, ...]:
        """Fewer, longer reads covering ``runs``: what a reader should fetch.

        Consecutive runs of one shard (ascending) are merged into one ranged read while the samples
        read but not yielded stay within the window's size (read amplification <= 2x). Only a
        window made of fragments (after a resume with a new topology taken inside a shuffle window)
        has gaps; otherwise ``spans == runs``. Fetch each span, then keep the samples of ``runs``.
        """
        out: list[Run] = []
        waste = 0
        budget = self.size
        for run in self.runs:
            if out and out[-1].shard == run.shard and 0 <= run.first - out[-1].end <= budget - waste:
                waste += run.first - out[-1].end
                out[-1] = Run(run.shard, out[-1].first, run.end)
            else:
                out.append(run)
        return tuple(out)


class ShardOrder:
    """The global sequence G of an epoch: the shards in epoch order, their samples concatenated.

    Args:
        order: shard indices (into the data set's shard list) in epoch order.
        counts: samples per shard, in index order.
    """

    def __init__(self, order: np.ndarray, counts: np.ndarray) -> None:
        self.order = order
        self.cum = np.concatenate(([0], np.cumsum(counts[order]))).astype(_I64)  # where each starts in G
        self.total = int(self.cum[-1])

    def runs(self, g: Seq) -> tuple[Run, ...]:
        """Intervals of G as runs of shards, in order."""
        j, a, b = split(g.starts, g.ends, self.cum)
        shards = self.order[j]
        return tuple(Run(int(s), int(x), int(y)) for s, x, y in zip(shards, a, b, strict=True))

    def index_base(self) -> np.ndarray:
        """Where each shard's samples would start if the shards were in index order (and the total)."""
        counts = np.diff(self.cum)[np.argsort(self.order, kind="stable")]
        return np.concatenate(([0], np.cumsum(counts))).astype(_I64)


class WorkerStream:
    """What one DataLoader worker of one rank reads and yields in this plan.

    Built by :meth:`~streamio.data.plan.EpochPlan.stream`.

    Attributes:
        rank: the rank.
        worker: the DataLoader worker id (0 with ``num_workers=0``).
        skipped: samples of this worker's epoch stream consumed before this plan (resume).
        size: samples this stream yields.
        batches: batches this stream yields (whole batches, except possibly the rank's last one).
    """

    def __init__(
        self, stage: Stage, shards: ShardOrder, *, rank: int, worker: int, plan_worker: int, start: int
    ) -> None:
        self._stage, self._shards = stage, shards
        self.rank, self.worker, self._pw = rank, worker, plan_worker
        self.skipped = start
        total = int(stage.worker_sizes[plan_worker])
        self.size = max(0, total - start)
        b = stage.topo.batch_size
        self.batches = int(stage.worker_batches[plan_worker]) - min(start, total) // b if self.size else 0

    def __repr__(self) -> str:
        return f"WorkerStream(rank={self.rank}, worker={self.worker}, size={self.size}, batches={self.batches})"

    def _runs(self, lo: np.ndarray, hi: np.ndarray) -> tuple[Run, ...]:
        return self._shards.runs(self._stage.to_g(self.rank, self._pw, lo, hi))

    @property
    def runs(self) -> tuple[Run, ...]:
        """Every sample this stream yields, as runs in read order (adjacent runs merged).

        Cheap: O(runs), no window permutation beyond a partially consumed first window.
        """
        lo, hi = self._stage.stream_ranges(self.rank, self._pw, self.skipped)
        return self._runs(*merge(lo, hi))

    def windows(self) -> Iterator[Window]:
        """The stream as windows, lazily (one permutation per window; memory O(window))."""
        for lo, hi, order in self._stage.windows(self.rank, self._pw, self.skipped):
            yield Window(self._runs(lo, hi), order)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """``(shard, sample)`` pairs in yield order."""
        for win in self.windows():
            if win.order is None:
                for run in win.runs:
                    for i in range(run.first, run.end):
                        yield run.shard, i
                continue
            flat = [(run.shard, i) for run in win.runs for i in range(run.first, run.end)]
            for i in win.order:
                yield flat[int(i)]
