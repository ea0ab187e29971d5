"""One stage of an epoch: a topology applied to a stage sequence S (steps 3-6 of the algorithm).

A :class:`Stage` cuts S into rank blocks under the tail policy, each rank block into worker
blocks of whole batches, and each worker block into shuffle windows; it maps block positions back
to intervals of G and, for a resume on a new topology, computes every position not yet consumed
(:meth:`Stage.remaining`). Everything is O(ranks x workers + intervals); only a window being read
(or a partially consumed one, when re-planning) is materialised as a permutation.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from streamio.data.plan.config import Sampling, Topology
from streamio.data.plan.intervals import Seq, empty, groups, merge
from streamio.data.plan.lanes import Lanes
from streamio.data.plan.permutation import TAG_ROUNDS, TAG_WINDOW, permutation, permutations

__all__ = ["Stage"]

_I64 = np.int64
_RESIDUAL_CHUNK = 1 << 20  # permutation elements re-planned at a time (~40 MB of temporaries)
CHUNK = 4096
"""Stream positions per window of an interleaved stream without a sample shuffle."""

Ranges = tuple[np.ndarray, np.ndarray]
"""Sorted block-position ranges ``(lo, hi)`` of one (rank, worker) stream."""


class Stage:
    """One topology applied to one stage sequence: the blocks, workers and windows of an epoch.

    Args:
        index: the stage's number in the epoch (0 until the topology first changes).
        seq: the stage sequence S, as intervals of G.
        topo: the stage's topology (``workers`` streams per rank).
        sampling: the tail policy and the shuffle window.
        key: ``(seed, epoch)``, the prefix of every window permutation's key.
    """

    def __init__(self, index: int, seq: Seq, topo: Topology, sampling: Sampling, key: tuple[int, int]) -> None:
        self.index, self.seq, self.topo, self.key = index, seq, topo, key
        self.policy, self.window, self.width = sampling.policy, sampling.shuffle.window, sampling.shuffle.interleave
        self._lanes: dict[int, Lanes] = {}
        self.cum = seq.cum
        self.length = int(self.cum[-1])
        r, b, w = topo.world_size, topo.batch_size, topo.workers
        self.per_rank = -(-self.length // r) if self.policy == "pad" else self.length // r
        total = r * self.per_rank
        self.padding = max(0, total - self.length)
        self.dropped = max(0, self.length - total)
        self.batches = -(-self.per_rank // b)
        ks = (self.batches - np.arange(w, dtype=_I64) + w - 1) // w  # whole batches per worker
        sizes = ks * b
        rem = self.per_rank % b
        if rem and self.batches:
            sizes[(self.batches - 1) % w] -= b - rem
        self.worker_batches = ks
        self.worker_sizes = sizes
        self.worker_offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(_I64)

    def consumed(self, worker: int, batches: int) -> int:
        """Samples of ``worker``'s stream consumed after the rank's consumer got ``batches``."""
        w = self.topo.workers
        n = (min(batches, self.batches) - worker + w - 1) // w
        return int(min(max(n, 0) * self.topo.batch_size, int(self.worker_sizes[worker])))

    def lanes(self, worker: int) -> Lanes | None:
        """The interleaved read order of ``worker``'s block, or None when it reads one lane."""
        n = int(self.worker_sizes[worker])
        if self.width <= 1 or n <= 1:
            return None
        found = self._lanes.get(n)
        if found is None:
            found = self._lanes[n] = Lanes(n, self.width)
        return found

    def window_perm(self, rank: int, worker: int, j: int, size: int) -> np.ndarray:
        """The yield order of window ``j`` of (rank, worker), ``size`` samples long."""
        return permutation((*self.key, TAG_WINDOW, self.index, rank, worker, j), size)

    def residual(self, rank: int, worker: int, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The unconsumed part of the window that ``start`` falls inside (``start % window != 0``).

        Returns ``(lo, hi, order)``: block-position ranges (sorted) holding the window's samples
        not yet yielded, and their yield order as indices into those ranges' samples.
        """
        k = self.window
        lo = start - start % k
        perm = self.window_perm(rank, worker, start // k, min(k, int(self.worker_sizes[worker]) - lo))
        rest = perm[start % k :]
        left = np.sort(rest)
        glo, ghi = groups(left)
        return glo + lo, ghi + lo, np.searchsorted(left, rest).astype(_I64)

    def windows(self, rank: int, worker: int, start: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """Block-position ranges and yield order of each window from ``start`` on, lazily."""
        n, k = int(self.worker_sizes[worker]), self.window
        if start >= n:
            return
        lanes = self.lanes(worker)
        if lanes is not None:
            yield from self._lane_windows(rank, worker, start, lanes)
            return
        if k <= 1:
            yield np.array([start], dtype=_I64), np.array([n], dtype=_I64), None
            return
        if start % k:
            yield self.residual(rank, worker, start)
            start += k - start % k
        for j in range(start // k, -(-n // k)):
            size = min(k, n - j * k)
            order = self.window_perm(rank, worker, j, size)
            yield np.array([j * k], dtype=_I64), np.array([j * k + size], dtype=_I64), order

    def _window_positions(self, rank: int, worker: int, lanes: Lanes, j: int, chunk: int) -> np.ndarray:
        """Block positions of window ``j`` (``chunk`` stream positions) of a laned stream, in yield order.

        The window shuffle is stratified: each lane's samples are permuted among that lane's slots
        of the window, then the slots of every round (``lanes.count`` consecutive slots, one per
        lane) are permuted. So every round still holds one sample of each lane and a batch of ``B``
        samples draws from ``min(B, lanes)`` places of the block, in a random order.
        """
        a = j * chunk
        size = min(int(self.worker_sizes[worker]), a + chunk) - a
        pos, lane, slots = lanes.window(a, a + size)
        if self.window <= 1:
            return pos
        within = self.window_perm(rank, worker, j, size)
        out = np.empty_like(pos)
        out[slots] = pos[np.argsort(lane * size + within)]  # keys are distinct: any sort is stable
        rounds = np.arange(size, dtype=_I64) // lanes.count
        spread = permutation((*self.key, TAG_ROUNDS, self.index, rank, worker, j), size)
        return out[np.argsort(rounds * size + spread)]

    def _lane_windows(
        self, rank: int, worker: int, start: int, lanes: Lanes
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        n = int(self.worker_sizes[worker])
        chunk = self.window if self.window > 1 else CHUNK
        j0 = start // chunk
        for j in range(j0, -(-n // chunk)):
            pos = self._window_positions(rank, worker, lanes, j, chunk)
            if j == j0:
                pos = pos[start - j * chunk :]
            srt = np.sort(pos)
            lo, hi = groups(srt)
            yield lo, hi, np.searchsorted(srt, pos).astype(_I64)

    def _lane_ranges(self, rank: int, worker: int, start: int, lanes: Lanes) -> Ranges:
        k = self.window
        if k > 1 and start % k:
            rest = np.sort(self._window_positions(rank, worker, lanes, start // k, k)[start % k :])
            rlo, rhi = groups(rest)
            tlo, thi = lanes.tail_ranges(start + k - start % k)
            lo, hi = np.concatenate((rlo, tlo)), np.concatenate((rhi, thi))
            order = np.argsort(lo, kind="stable")
            return merge(lo[order], hi[order])
        return lanes.tail_ranges(start)

    def stream_ranges(self, rank: int, worker: int, start: int) -> Ranges:
        """Every block position yielded from ``start`` on, as sorted ranges (no full-window perms)."""
        n, k = int(self.worker_sizes[worker]), self.window
        if start >= n:
            return empty(), empty()
        lanes = self.lanes(worker)
        if lanes is not None:
            return self._lane_ranges(rank, worker, start, lanes)
        if k > 1 and start % k:
            lo, hi, _ = self.residual(rank, worker, start)
            nxt = start + k - start % k
            if nxt < n:
                lo, hi = np.append(lo, nxt), np.append(hi, n)
            return lo, hi
        return np.array([start], dtype=_I64), np.array([n], dtype=_I64)

    def to_g(self, rank: int, worker: int, lo: np.ndarray, hi: np.ndarray) -> Seq:
        """Block positions of (rank, worker) -> intervals of G (through the tail policy)."""
        base = rank * self.per_rank + int(self.worker_offsets[worker])
        return self._virtual_to_g(lo + base, hi + base)

    def _virtual_to_g(self, a: np.ndarray, b: np.ndarray) -> Seq:
        """Positions ``[a_i, b_i)`` of the padded/truncated sequence -> intervals of G."""
        keep = b > a
        a, b = a[keep].astype(_I64), b[keep].astype(_I64)
        if self.policy == "pad" and a.size:
            length = self.length
            qa, qb = a // length, (b - 1) // length
            wrap = qb > qa  # a range is never longer than a rank block <= L: wraps at most once
            idx = np.repeat(np.arange(a.size), 1 + wrap)
            second = np.zeros(idx.size, dtype=bool)
            second[np.cumsum(1 + wrap)[wrap] - 1] = True
            sa = np.where(second, 0, a[idx] - qa[idx] * length)
            sb = np.where(second | ~wrap[idx], b[idx] - qb[idx] * length, length)
            a, b = sa, sb
        return self.seq.take(a, b, self.cum)

    def remaining(self, batches: Sequence[int]) -> Seq:
        """The sequence of every position not consumed after rank r's consumer got batches[r].

        Vectorised over all (rank, worker) streams: per-worker positions from the round-robin
        mapping, then each partially consumed window's unconsumed samples as ranges (one batch of
        permutations per window size). Order: by (rank, worker), then block position.
        """
        r_, w_, b_, k = self.topo.world_size, self.topo.workers, self.topo.batch_size, self.window
        ranks = np.repeat(np.arange(r_, dtype=_I64), w_)
        workers = np.tile(np.arange(w_, dtype=_I64), r_)
        took = np.minimum(np.asarray(batches, dtype=_I64), self.batches)[ranks]
        n = self.worker_sizes[workers]
        start = np.minimum(np.maximum((took - workers + w_ - 1) // w_, 0) * b_, n)
        base = ranks * self.per_rank + self.worker_offsets[workers]
        rows = np.arange(ranks.size, dtype=_I64)
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (row, lo, hi) in block positions
        if self.width > 1:  # laned streams: each row's rest is a few ranges per lane
            for row in rows[start < n].tolist():
                lo, hi = self.stream_ranges(int(ranks[row]), int(workers[row]), int(start[row]))
                parts.append((np.full(lo.size, row, dtype=_I64), lo, hi))
            parts.append((empty(), empty(), empty()))
            row_, lo_, hi_ = (np.concatenate([p[i] for p in parts]) for i in range(3))
            return self._virtual_to_g(lo_ + base[row_], hi_ + base[row_])
        partial = (start < n) & (start % k != 0) if k > 1 else np.zeros(rows.size, dtype=bool)
        rest = start.copy()
        if partial.any():
            wlo = start - start % k
            size = np.minimum(k, n - wlo)
            rest = np.where(partial, wlo + size, start)
            for sz in np.unique(size[partial]):
                sel = rows[partial & (size == sz)]
                for chunk in np.array_split(sel, -(-sel.size * int(sz) // _RESIDUAL_CHUNK)):
                    parts.append(self._residuals(chunk, ranks, workers, start, wlo, int(sz)))
        full = rest < n
        parts.append((rows[full], rest[full], n[full]))
        row = np.concatenate([p[0] for p in parts])
        lo = np.concatenate([p[1] for p in parts])
        hi = np.concatenate([p[2] for p in parts])
        order = np.lexsort((lo, row))
        row, lo, hi = row[order], lo[order], hi[order]
        return self._virtual_to_g(lo + base[row], hi + base[row])

    def _residuals(
        self, sel: np.ndarray, ranks: np.ndarray, workers: np.ndarray, start: np.ndarray, wlo: np.ndarray, size: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unconsumed samples of the partial windows of rows ``sel`` (all ``size`` long) as ranges."""
        k = self.window
        keys = [(*self.key, TAG_WINDOW, self.index, int(ranks[i]), int(workers[i]), int(start[i] // k)) for i in sel]
        perms = permutations(keys, size)
        inv = np.empty_like(perms)
        np.put_along_axis(inv, perms, np.broadcast_to(np.arange(size, dtype=_I64), perms.shape), axis=1)
        keep = np.zeros((sel.size, size + 2), dtype=np.int8)
        keep[:, 1:-1] = inv >= (start[sel] - wlo[sel])[:, None]  # yielded at or after the stop
        edge = np.diff(keep, axis=1)
        r0, c0 = np.nonzero(edge == 1)
        _, c1 = np.nonzero(edge == -1)
        return sel[r0], wlo[sel][r0] + c0, wlo[sel][r0] + c1
