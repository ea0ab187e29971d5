"""Proportional interleaving of several lanes into one sequence, computed in closed form.

Lanes of sizes ``c_0 .. c_{L-1}`` (a mixture's sources, or the parts of a worker's block) are merged
into one sequence of ``T = sum(c)`` positions: item ``k`` of lane ``j`` sits at its *key*
``(k + (j + 1/2) / L) / c_j`` (ties broken by lane number), and the sequence is every item in key
order. So each lane is spread evenly over the whole sequence, in its own order, and lanes of equal
size take turns (round robin); the lane-dependent offset keeps small lanes from bunching up (with
the offset 1/2 for every lane, four single items would all sit at key 1/2, side by side).

The bound the property tests check (``tests/data/test_interleave.py``): any window of ``w``
consecutive positions holds ``w * c_j / T`` items of lane ``j`` within ``1 + (L' - 2) c_j / T``
(``L'`` non-empty lanes): within 1 for two lanes, under 2 for three, and within 2 whenever lanes
have near-equal sizes, as a worker's lanes do (see :func:`max_deviation`).

Nothing is materialised per position of the sequence: :meth:`Interleave.counts` (how many items of
each lane lie before position ``n``) is a vectorised binary search, O(L^2 log T); a window of ``w``
positions costs O(w L). All arithmetic is exact: int64 while ``2 L max(c)^2 < 2^62``, Python
integers beyond (slower; lanes of billions of samples).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamio.errors import PlanError

__all__ = ["MAX_LANE", "Interleave"]

_I64 = np.int64
MAX_LANE = 1 << 30
"""Lane size from which keys may be compared in Python integers instead of int64 (see the module docstring)."""


class Interleave:
    """The proportional merge of lanes of the given sizes (see the module docstring).

    Args:
        sizes: items per lane (ints >= 0).

    Raises:
        PlanError: a size is negative.
    """

    def __init__(self, sizes: Sequence[int] | np.ndarray) -> None:
        c = np.asarray(sizes, dtype=_I64)
        if c.ndim != 1 or (c.size and int(c.min()) < 0):
            raise PlanError(f"interleave lane sizes must be ints >= 0, got {list(sizes)[:8]}")
        if c.size and 2 * c.size * int(c.max()) ** 2 >= 1 << 62:
            c = c.astype(object)  # exact beyond int64's reach
        self.sizes = c
        self.total = int(c.sum())
        self._lanes = np.arange(c.size, dtype=_I64)

    def rank(self, lane: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Position in the sequence of item ``k[x]`` of lane ``lane[x]`` (vectorised)."""
        c, two_l = self.sizes, 2 * self.sizes.size
        cj = c[lane][:, None]  # (items, 1)
        lanes = self._lanes.astype(c.dtype)
        # item (j, k) has key (2Lk + 2j + 1) / (2L c_j); lane i's item k' comes first when
        # 2L k' c_j < (2Lk + 2j + 1) c_i - (2i + 1) c_j = num
        mine = two_l * k.astype(c.dtype)[:, None] + 2 * lane.astype(c.dtype)[:, None] + 1
        num = mine * c[None, :] - (2 * lanes[None, :] + 1) * cj
        step = two_l * cj
        strict = np.where(num > 0, (num - 1) // step + 1, 0)  # items of lane i with a smaller key
        tied = np.where(num >= 0, num // step + 1, 0)  # ... or an equal key (lane i < lane j)
        before = np.where(self._lanes[None, :] < lane[:, None], tied, strict)
        before = np.minimum(before, c[None, :])
        before[np.arange(lane.size), lane] = k  # its own lane: the k items before it
        out: np.ndarray = before.astype(_I64).sum(axis=1).astype(_I64)
        return out

    def counts(self, n: int) -> np.ndarray:
        """Items of each lane among the first ``n`` positions (``0 <= n <= total``).

        The search starts from the proportional share ``n * c_j / T`` and the mixing bound around it
        (a few items for near-equal lanes: 3 steps instead of ``log2(c_j)``); an answer on the edge
        of that bracket is checked and, if the bound did not hold, searched again over the whole lane.
        """
        c = self.sizes.astype(_I64)
        if not self.total:
            return np.zeros(c.size, dtype=_I64)
        lanes = max(1, int(np.count_nonzero(c)))
        guess = (n * c) // self.total if self.sizes.dtype != object else np.array([n * int(x) // self.total for x in c])
        margin = 2 + (lanes * c) // self.total  # > 1 + (L' - 2) c_j / T, the bound, for every lane
        lo = np.maximum(0, guess - margin)
        hi = np.minimum(c, guess + margin + 1)
        got = self._search(n, lo, hi)
        edge = ((got == lo) & (lo > 0)) | ((got == hi) & (hi < c))
        if edge.any():
            full = self._search(n, np.where(edge, 0, got), np.where(edge, c, got))
            got = np.where(edge, full, got)
        return got

    def _search(self, n: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """For each lane, the first item in ``[lo, hi]`` at position >= ``n`` (``hi`` if none)."""
        lo, hi = lo.astype(_I64), hi.astype(_I64)
        while True:
            open_ = lo < hi
            if not open_.any():
                return lo
            lanes = self._lanes[open_]
            mid = (lo[open_] + hi[open_]) // 2
            below = self.rank(lanes, mid) < n
            lo[lanes[below]] = mid[below] + 1
            hi[lanes[~below]] = mid[~below]

    def items(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions ``[a, b)`` as items: ``(first, stop, order)``.

        Lane ``j`` contributes its items ``[first[j], stop[j])``; ``order`` lists, for each position
        ``a .. b-1`` in turn, the item's index in the concatenation of those lane ranges (lane 0's
        range, then lane 1's, ...).
        """
        first, stop = self.counts(a), self.counts(b)
        n = stop - first
        lane = np.repeat(self._lanes, n)
        k = np.arange(int(n.sum()), dtype=_I64) - np.repeat(np.cumsum(n) - n, n) + first[lane]
        order: np.ndarray = np.argsort(self.rank(lane, k), kind="stable").astype(_I64)
        return first, stop, order


def max_deviation(sizes: Sequence[int], lane_of_position: np.ndarray, window: int) -> float:
    """Largest ``|count_j - window * c_j / T|`` over every window of ``window`` positions (tests)."""
    c = np.asarray(sizes, dtype=np.float64)
    total = c.sum()
    worst = 0.0
    for j in range(c.size):
        hits = np.concatenate(([0], np.cumsum(lane_of_position == j)))
        got = hits[window:] - hits[:-window]
        worst = max(worst, float(np.abs(got - window * c[j] / total).max()))
    return worst
