"""The read schedule of a worker: which byte segments to fetch, in the order they are first needed.

A worker's windows list runs ``(shard, first, end)`` in the order their samples are needed. Runs of
one shard that continue each other (the next window's part of the same lane, or of the same shard)
form a **chain**: one sequential read of that shard. With one chain open at a time (a plain or
window-shuffled stream) each chain is fetched whole, as one ranged read. With several open at once
(the cross-shard shuffle's lanes, a mixture's sources) each chain is cut into **segments** of about
``segment_bytes``, and the segments are fetched in the order the consumer first needs them, so an
in-order prefetcher serves them all and memory holds about one segment per open chain. A chain's
first segment is small (its first run, or :data:`MIN_SEGMENT`): the first batch of a shuffled
stream draws from many chains at once and should not wait for a full segment of each.

Pure: the sample offsets come in through ``offsets(shard)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from streamio.data.plan import Run, Window

__all__ = ["Schedule", "Segment", "build_schedule", "runs_of", "segment_size"]

MIN_SEGMENT = 256 << 10


@dataclass(frozen=True)
class Segment:
    """Samples ``[first, end)`` of ``shard``, fetched as one ranged read, feeding ``chain``."""

    chain: int
    shard: int
    first: int
    end: int


@dataclass
class Schedule:
    """Each window run's chain, the segments in fetch order, and the most chains open at once.

    Attributes:
        chains: for each window, the chain of each of its runs.
        segments: what to fetch, in the order the consumer first needs it.
        open_at_once: the most chains open (started, not finished) at any point.
    """

    chains: list[list[int]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    open_at_once: int = 0


def _chains(windows: Sequence[Window]) -> tuple[list[list[int]], list[list[int]]]:
    """Each run's chain, and each chain as ``[shard, first, end, first_run, last_run]``.

    Runs are numbered in consumption order (window by window, run by run).
    """
    by_end: dict[tuple[int, int], int] = {}  # (shard, end) of an open chain -> chain id
    chains: list[list[int]] = []
    per_window: list[list[int]] = []
    n = 0
    for win in windows:
        ids = []
        for run in win.runs:
            c = by_end.pop((run.shard, run.first), None)
            if c is None:
                c = len(chains)
                chains.append([run.shard, run.first, run.end, n, n])
            else:
                chains[c][2], chains[c][4] = run.end, n
            by_end[(run.shard, run.end)] = c
            ids.append(c)
            n += 1
        per_window.append(ids)
    return per_window, chains


def build_schedule(
    windows: Sequence[Window], offsets: Callable[[int], Sequence[int] | np.ndarray], *, max_bytes: int, chunk_size: int
) -> Schedule:
    """The read schedule of ``windows`` (see the module docstring).

    Args:
        windows: the worker's windows, in yield order.
        offsets: ``offsets(shard)[i]`` is where sample ``i`` of ``shard`` starts (plus its end).
        max_bytes: the prefetch memory budget the open chains share (see :func:`segment_size`).
        chunk_size: the largest segment.
    """
    per_window, chains = _chains(windows)
    events = sorted([(ch[3], 0) for ch in chains] + [(ch[4], 1) for ch in chains])  # opens before closes
    open_now = peak = 0
    for _, kind in events:
        open_now += 1 if kind == 0 else -1
        peak = max(peak, open_now)
    size = segment_size(peak, max_bytes, chunk_size) if peak > 1 else None
    scheduled = [ch[1] for ch in chains]
    segments: list[Segment] = []
    for win, ids in zip(windows, per_window, strict=True):
        for run, c in zip(win.runs, ids, strict=True):
            shard, _, chain_end = chains[c][:3]
            while scheduled[c] < run.end:
                start = scheduled[c]
                stop = chain_end
                if size is not None:
                    offs = offsets(shard)
                    step = size if start > chains[c][1] else MIN_SEGMENT  # a chain starts small: the first batch
                    want = int(np.searchsorted(offs, int(offs[start]) + step, side="left"))
                    stop = min(chain_end, max(run.end, want, start + 1))
                segments.append(Segment(c, shard, start, stop))
                scheduled[c] = stop
    return Schedule(per_window, segments, peak)


def segment_size(open_at_once: int, max_bytes: int, chunk_size: int) -> int:
    """Bytes per segment when ``open_at_once`` chains share a prefetch budget of ``max_bytes``."""
    return max(MIN_SEGMENT, min(chunk_size, max_bytes // max(1, 2 * open_at_once)))


def runs_of(segments: Sequence[Segment]) -> list[Run]:
    """The segments as plan runs (what a prefetcher turns into byte ranges)."""
    return [Run(s.shard, s.first, s.end) for s in segments]
