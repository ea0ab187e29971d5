"""What a reader sees of a plan: runs of samples, windows, and one worker's stream.

A :class:`WorkerStream` is what one DataLoader worker of one rank reads. It is described as
:class:`Run` values (``shard, first, end``: one sequential ranged read each) grouped in
:class:`Window` values (read the runs, then yield in ``order``). The epoch's global sequence G
(:class:`~streamio.data.plan.sequence.EpochSequence`) turns intervals of G into runs and orders.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from streamio.data.plan.intervals import Seq, merge
from streamio.data.plan.sequence import EpochSequence, Run
from streamio.data.plan.stage import CHUNK, Stage

__all__ = ["CHUNK", "Run", "Window", "WorkerStream"]

_I64 = np.int64


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
        self, stage: Stage, sequence: EpochSequence, *, rank: int, worker: int, plan_worker: int, start: int
    ) -> None:
        self._stage, self._seq = stage, sequence
        self.rank, self.worker, self._pw = rank, worker, plan_worker
        self.skipped = start
        total = int(stage.worker_sizes[plan_worker])
        self.size = max(0, total - start)
        b = stage.topo.batch_size
        self.batches = int(stage.worker_batches[plan_worker]) - min(start, total) // b if self.size else 0

    def __repr__(self) -> str:
        return f"WorkerStream(rank={self.rank}, worker={self.worker}, size={self.size}, batches={self.batches})"

    def _g(self, lo: np.ndarray, hi: np.ndarray) -> Seq:
        return self._stage.to_g(self.rank, self._pw, lo, hi)

    @property
    def runs(self) -> tuple[Run, ...]:
        """Every sample this stream yields, as runs in read order (touching runs merged).

        Cheap: O(runs), no window permutation beyond a partially consumed first window. Over an
        interleaved sequence the runs of one interval are listed shard by shard.
        """
        lo, hi = self._stage.stream_ranges(self.rank, self._pw, self.skipped)
        runs, _ = self._seq.window(self._g(*merge(lo, hi)), ordered=False)
        out: list[Run] = []
        for run in runs:
            if out and out[-1].shard == run.shard and out[-1].end == run.first:
                out[-1] = Run(run.shard, out[-1].first, run.end)
            else:
                out.append(run)
        return tuple(out)

    def windows(self) -> Iterator[Window]:
        """The stream as windows, lazily (one permutation per window; memory O(window))."""
        for lo, hi, order in self._stage.windows(self.rank, self._pw, self.skipped):
            if not self._seq.mixed:
                yield Window(tuple(self._seq.window(self._g(lo, hi), ordered=False)[0]), order)
            elif order is not None:
                runs, g_order = self._seq.window(self._g(lo, hi))
                yield Window(tuple(runs), order if g_order is None else g_order[order])
            else:  # a mixture's storage order is not G's order: cut the stream into windows of CHUNK
                for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
                    for x in range(a, b, CHUNK):
                        piece = (np.array([x], _I64), np.array([min(b, x + CHUNK)], _I64))
                        runs, g_order = self._seq.window(self._g(*piece))
                        yield Window(tuple(runs), g_order)

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
