"""Interval arithmetic on positions of the global sequence G, vectorised with numpy.

A sequence of positions is kept as ordered intervals ``[start, end)`` (:class:`Seq`), so every
operation costs O(intervals), never O(samples): cutting ranges at piece boundaries
(:func:`split`), merging touching intervals (:func:`merge`) and turning sorted positions back into
ranges (:func:`groups`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Seq", "empty", "groups", "merge", "split"]

_I64 = np.int64


def empty() -> np.ndarray:
    """An empty int64 position array."""
    return np.zeros(0, dtype=_I64)


def split(a: np.ndarray, b: np.ndarray, cum: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut ranges ``[a_i, b_i)`` of a concatenation of pieces at the piece boundaries.

    Piece ``j`` covers ``[cum[j], cum[j+1])``. Returns ``(j, lo, hi)``: for each non-empty cut, the
    piece and the offsets inside it, in range order.
    """
    keep = b > a
    a, b = a[keep], b[keep]
    if a.size == 0:
        return empty(), empty(), empty()
    js = np.searchsorted(cum, a, side="right") - 1
    je = np.searchsorted(cum, b - 1, side="right") - 1
    counts = je - js + 1
    idx = np.repeat(np.arange(a.size), counts)
    within = np.arange(int(counts.sum()), dtype=_I64) - np.repeat(np.cumsum(counts) - counts, counts)
    j = js[idx] + within
    base = cum[j]
    lo = np.maximum(a[idx], base) - base
    hi = np.minimum(b[idx], cum[j + 1]) - base
    m = hi > lo
    return j[m].astype(_I64), lo[m].astype(_I64), hi[m].astype(_I64)


def merge(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals where one ends exactly where the next starts (order kept)."""
    if s.size <= 1:
        return s, e
    brk = np.nonzero(s[1:] != e[:-1])[0] + 1
    first = np.concatenate(([0], brk))
    last = np.concatenate((brk - 1, [s.size - 1]))
    return s[first], e[last]


def groups(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct integers -> maximal ranges ``[lo, hi)`` of consecutive values."""
    if pos.size == 0:
        return pos, pos
    brk = np.nonzero(np.diff(pos) != 1)[0] + 1
    first = np.concatenate(([0], brk))
    last = np.concatenate((brk - 1, [pos.size - 1]))
    return pos[first], pos[last] + 1


@dataclass(frozen=True)
class Seq:
    """An ordered list of intervals ``[starts[i], ends[i])`` of the global sequence G."""

    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def whole(cls, total: int) -> Seq:
        """All of G, ``[0, total)``, as one interval."""
        return cls(np.array([0], dtype=_I64), np.array([total], dtype=_I64))

    @property
    def cum(self) -> np.ndarray:
        """Where each interval starts in this sequence, plus its length at the end."""
        return np.concatenate(([0], np.cumsum(self.ends - self.starts))).astype(_I64)

    def __len__(self) -> int:
        return int((self.ends - self.starts).sum())

    def take(self, a: np.ndarray, b: np.ndarray, cum: np.ndarray | None = None) -> Seq:
        """Positions ``[a_i, b_i)`` of this sequence (in order) as intervals of G."""
        j, lo, hi = split(a, b, self.cum if cum is None else cum)
        return Seq(*merge(self.starts[j] + lo, self.starts[j] + hi))
