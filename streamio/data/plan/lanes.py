"""A worker reading several parts of its block at once: the cross-shard shuffle's read order.

A worker's block is ``n`` consecutive positions of the stage sequence (whole shards, mostly). With
``width`` lanes it is cut into ``L = min(width, n)`` contiguous parts of near-equal length and the
worker yields them interleaved (:class:`~.interleave.Interleave`: lane ``j``'s item ``k`` at key
``(k + 1/2) / size_j``): every few consecutive samples come from ``L`` places of the block, i.e.
from ``L`` different shards, while each lane is still read front to back. The worker reads only its
own block, so ranks and workers share no more shards than without lanes (nothing is downloaded
twice into per-node caches), and the reader keeps ``L`` read streams open.

Positions here are relative: *stream positions* ``0 .. n-1`` (the order the worker yields before
the window shuffle) and *block positions* ``0 .. n-1`` (where the sample sits in the block).
"""

from __future__ import annotations

import numpy as np

from streamio.data.plan.interleave import Interleave

__all__ = ["Lanes"]

_I64 = np.int64


class Lanes:
    """The interleaved read order of one worker block of ``n`` positions over ``width`` lanes.

    Args:
        n: positions in the block.
        width: lanes wanted (at most ``n`` are used).
    """

    def __init__(self, n: int, width: int) -> None:
        self.n = n
        count = max(1, min(width, n))
        self.bounds = (np.arange(count + 1, dtype=_I64) * n) // count  # lane j is [bounds[j], bounds[j+1])
        self._il = Interleave(np.diff(self.bounds))
        self._memo: dict[tuple[str, int, int], tuple[np.ndarray, ...]] = {}  # re-planning asks the same again

    def _remember(self, key: tuple[str, int, int], value: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        if len(self._memo) >= 256:
            self._memo.clear()
        self._memo[key] = value
        return value

    @property
    def count(self) -> int:
        """Lanes in use."""
        return int(self.bounds.size - 1)

    def block_positions(self, a: int, b: int) -> np.ndarray:
        """Block positions of stream positions ``a .. b-1``, in stream order (do not modify the array)."""
        return self.window(a, b)[0]

    def window(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stream positions ``a .. b-1`` as ``(block positions, lane of each, slots grouped by lane)``.

        The third array lists the indices ``0 .. b-a-1`` lane by lane, each lane's in order (what a
        stratified window shuffle needs). Remembered: re-planning asks for the same windows of many
        workers. Do not modify the arrays.
        """
        found = self._memo.get(("win", a, b))
        if found is not None:
            return found  # type: ignore[return-value]
        first, stop, order = self._il.items(a, b)
        n = stop - first
        lane = np.repeat(np.arange(first.size, dtype=_I64), n)
        k = np.arange(int(n.sum()), dtype=_I64) - np.repeat(np.cumsum(n) - n, n) + first[lane]
        pos, lane = (self.bounds[lane] + k)[order], lane[order]
        slots = np.argsort(lane, kind="stable")
        return self._remember(("win", a, b), (pos, lane, slots))  # type: ignore[return-value]

    def tail_ranges(self, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Block positions of stream positions ``start .. n-1``, as sorted ranges ``(lo, hi)``."""
        found = self._memo.get(("tail", start, 0))
        if found is None:
            lo = self.bounds[:-1] + self._il.counts(start)
            hi = self.bounds[1:]
            keep = hi > lo
            found = self._remember(("tail", start, 0), (lo[keep], hi[keep]))
        return found[0], found[1]
