"""Deterministic, elastic sample assignment: which samples each (epoch, rank, worker) reads.

This module is PURE: it does no I/O, imports neither torch nor fsspec, reads no environment, clock
or process state. Everything is an argument (per-shard sample counts, seed, epoch, world size,
DataLoader workers, batch size, tail policy, shuffle, resume state); the data set gathers rank and
worker ids from torch and passes them down. Memory and time are O(shards + ranks x workers), never
O(samples): every assignment is a list of **runs** ``Run(shard, first, end)`` that a reader turns
into one sequential ranged read each.

Algorithm (one epoch)
---------------------
1. **Global sequence G.** Shards are permuted with a generator keyed by the tuple
   ``(seed, epoch)`` (``Shuffle(shards=False)`` keeps index order). G is the concatenation of the
   shards' samples in that order; a position ``p`` of G names one sample. Every rank computes the
   same G without communicating.
2. **Stage sequence S.** A fresh epoch plans ``S = G``. A resumed epoch whose topology changed plans
   S = the not-yet-consumed positions of the previous stage, in their original order (see below).
   S is kept as a list of intervals of G, so it stays O(shards) (plus fragments, see Resume).
3. **Tail policy, in samples, identical on every rank.** With ``L = len(S)`` and ``R`` ranks:
   ``"drop"``: each rank gets ``P = L // R`` and the last ``L - R*P`` positions of S are dropped;
   ``"pad"``: ``P = ceil(L / R)`` and the ``R*P - L`` extra positions wrap to the start of S
   (again and again if ``R > L``, so a world larger than the data set still works). The plan
   states both numbers (:attr:`EpochPlan.dropped`, :attr:`EpochPlan.padding`); never more than
   ``R - 1``.
4. **Ranks get contiguous blocks** ``[r*P, (r+1)*P)`` of the padded/truncated sequence: long runs,
   and a rank's shard set changes every epoch because G does (no fixed shard-to-rank mapping).
5. **Workers get contiguous sub-blocks, in whole batches.** The rank's ``P`` samples form
   ``NB = ceil(P / B)`` batches of the batch size ``B`` (1 = plain samples); batch ``b`` belongs to
   worker ``b % W``, exactly the round-robin order in which ``torch.utils.data.DataLoader`` takes
   batches from ``W`` workers. Worker ``w`` owns ``ceil((NB - w) / W)`` whole batches, as one
   contiguous block; only the rank's single last batch can be partial (``P % B`` samples). So
   every rank yields the same number of samples and of batches, with or without ``drop_last``
   (which then drops the same ``P % B`` samples on every rank), and a worker's partial batch never
   appears mid-epoch. ``num_workers=0`` is one stream, identical to ``num_workers=1``.
6. **Sample-level shuffle (optional, ``Shuffle(window=K)``).** Each worker block is cut into
   windows of ``K`` consecutive samples; window ``j`` is yielded in a permutation keyed by
   ``(seed, epoch, stage, rank, worker, j)``. The reader reads a window's runs sequentially (long
   reads are kept), buffers ``K`` samples and yields them permuted. The order is a pure function of
   the plan, not of the reader, so a resume recomputes it: no shuffle-buffer state to save. Cost:
   one ``K``-element permutation per window, generated lazily; memory ``K`` samples. Quality is
   local by design (a sample moves at most ``K - 1`` places; neighbours come from the same
   one or two shards when ``K`` is below the shard size); the shard order supplies the global
   mixing. ``benchmarks/bench_plan.py`` measures both.

Permutations are keyed by int tuples through BLAKE2b and SplitMix64 in our own numpy arithmetic
(sort random keys made distinct by the index in their low bits): the same on every machine and
numpy version, unlike ``Generator.permutation`` whose stream numpy may change between releases
(which would silently break saved states); no ``hash()`` is involved, and a 4,096-sample window
costs ~0.1 ms.

Resume state
------------
A small, JSON-safe dict (:meth:`EpochPlan.state_dict`)::

    {"version": 1,
     "fingerprint": {"samples": "sha256:...", "index": str | None, "seed": int,
                     "policy": "pad", "shuffle": {"shards": true, "window": 0}},
     "epoch": 3,
     "stages": [{"world_size": 8, "num_workers": 4, "batch_size": 32, "batches": 1200}, ...]}

Each stage records a topology and how many batches each rank's consumer received (one int when
all ranks agree, as under DDP, else one per rank). Nothing else is needed because the plan is a
pure function of the state: resuming replays the stages.

* **Same topology** (same world size, workers, batch size as the last stage, and equal consumption
  on all ranks): the last stage continues. Worker ``w`` resumes at its exact position (the number of
  its batches among the first ``C`` of the round-robin), inside its shuffle window if needed, so the
  remainder is exactly the uninterrupted order. A fresh DataLoader starts its round-robin at worker
  0, so loader worker ``w`` is given the stream of plan worker ``(C + w) % W``: the next batch comes
  from the worker the uninterrupted run would have asked.
* **New topology** (or unequal consumption): the remaining positions of every old (rank, worker)
  stream, in old sequence order, become the sequence S of a new stage, planned from step 2 with the
  new topology. Nothing consumed is repeated, nothing unconsumed is lost (beyond the new stage's
  stated tail policy), and it composes over any number of changes. A partially consumed shuffle
  window leaves its unconsumed samples as fragments of S (up to ``K`` runs per old worker, about
  ``K / 5`` on average); they are exact, and :attr:`Window.spans` coalesces them into few ranged reads (read
  amplification <= 2x). Re-planning permutes each old worker's partial window once, vectorised
  (512 x 8 workers with window 4096: 16 M keys, under a second on a loaded 2-core VM) and holds
  O(fragments) memory; without a window it is O(old ranks x workers) and no fragments arise.

The dataset's side, in call order: ``plan = plan_epoch(index.sample_counts(), ..., resume=state)``
on every rank; in each DataLoader worker ``for win in plan.stream(rank, worker_id).windows()``:
fetch ``win.spans``, keep the samples of ``win.runs``, yield them in ``win.order``; the training
loop counts the batches it took, ``C``, and checkpoints ``plan.state_dict(C)``
(:meth:`EpochPlan.positions` gives the exact per-worker positions behind it). A new epoch starts
with ``resume=None``. :meth:`EpochPlan.check` verifies invariants 1-2 from the runs alone.

A state whose fingerprint or epoch differs from the plan's raises
:class:`~streamio.errors.StateMismatchError` naming each difference.

Why it is exact: every sample of S is at one position of the padded/truncated sequence, each
position belongs to exactly one rank block, each block position to exactly one worker block and to
exactly one window slot; all maps are bijections except the two stated tail maps. Consumption
``C`` batches per rank maps to a prefix of each worker's stream (round-robin), so "consumed" and
"remaining" partition every stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np

from streamio.errors import PlanError, StateMismatchError

__all__ = [
    "STATE_VERSION",
    "EpochPlan",
    "Run",
    "Shuffle",
    "TailPolicy",
    "Window",
    "WorkerStream",
    "plan_epoch",
]

STATE_VERSION = 1
"""Version of the resume-state dict; a state of another version is rejected."""

TailPolicy = Literal["drop", "pad"]
"""What happens to the samples that do not divide evenly across ranks (see module docstring)."""

_POLICIES = ("drop", "pad")
_TAG_SHARDS = 1  # domain-separation tags inside permutation keys
_TAG_WINDOW = 2

# State keys (constants so the dataset and tests never spell them differently).
K_VERSION, K_FINGERPRINT, K_EPOCH, K_STAGES = "version", "fingerprint", "epoch", "stages"
K_WORLD, K_WORKERS, K_BATCH, K_BATCHES = "world_size", "num_workers", "batch_size", "batches"

_I64 = np.int64


@dataclass(frozen=True)
class Shuffle:
    """How an epoch's order is randomised.

    Attributes:
        shards: permute the shard order every epoch (keyed by ``(seed, epoch)``). ``False`` keeps
            index order (evaluation).
        window: sample-level shuffle: permute every ``window`` consecutive samples of a worker's
            stream. 0 or 1 = sequential within runs. The reader buffers this many samples.
    """

    shards: bool = True
    window: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 0:
            raise PlanError(f"Shuffle(window={self.window!r}) must be an int >= 0 (0 = no sample shuffle).")

    def _as_json(self) -> dict[str, Any]:
        return {"shards": bool(self.shards), "window": int(self.window)}


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
            if out and out[-1].shard == run.shard and out[-1].end <= run.first and waste + run.first - out[-1].end <= budget:
                waste += run.first - out[-1].end
                out[-1] = Run(run.shard, out[-1].first, run.end)
            else:
                out.append(run)
        return tuple(out)


# --------------------------------------------------------------------------- numpy helpers


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _permutations(keys: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """One uniform permutation of ``range(n)`` per int tuple in ``keys`` (rows); stable everywhere.

    Sort keys are SplitMix64 outputs of a counter seeded by BLAKE2b of the key tuple (our own
    arithmetic, so no numpy version can change them); the low bits carry the index, which makes
    every sort key distinct, so any sort algorithm gives the same order. Vectorised over rows so
    re-planning thousands of workers' windows costs a few array operations.
    """
    rows = len(keys)
    if n <= 1:
        return np.zeros((rows, n), dtype=_I64)
    bases = np.array(
        [int.from_bytes(hashlib.blake2b(repr(tuple(int(k) for k in key)).encode(), digest_size=8).digest(), "little") for key in keys],
        dtype=np.uint64,
    )
    x = np.arange(1, n + 1, dtype=np.uint64)[None, :] * _GOLDEN + bases[:, None]  # uint64 arrays wrap silently
    x ^= x >> np.uint64(30)
    x *= _MIX1
    x ^= x >> np.uint64(27)
    x *= _MIX2
    x ^= x >> np.uint64(31)
    shift = np.uint64((n - 1).bit_length())
    x = ((x >> shift) << shift) | np.arange(n, dtype=np.uint64)[None, :]
    x.sort(axis=1)
    return (x & ((np.uint64(1) << shift) - np.uint64(1))).astype(_I64)


def _permutation(key: Sequence[int], n: int) -> np.ndarray:
    """A uniform permutation of ``range(n)`` keyed by the int tuple ``key`` (see ``_permutations``)."""
    if n <= 1:
        return np.arange(n, dtype=_I64)
    perm: np.ndarray = _permutations([key], n)[0]
    return perm


def _split(a: np.ndarray, b: np.ndarray, cum: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut ranges ``[a_i, b_i)`` of a concatenation of pieces at the piece boundaries.

    Piece ``j`` covers ``[cum[j], cum[j+1])``. Returns ``(j, lo, hi)``: for each non-empty cut, the
    piece and the offsets inside it, in range order.
    """
    keep = b > a
    a, b = a[keep], b[keep]
    if a.size == 0:
        e = np.zeros(0, dtype=_I64)
        return e, e, e
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


def _merge(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals where one ends exactly where the next starts (order kept)."""
    if s.size <= 1:
        return s, e
    brk = np.nonzero(s[1:] != e[:-1])[0] + 1
    first = np.concatenate(([0], brk))
    last = np.concatenate((brk - 1, [s.size - 1]))
    return s[first], e[last]


def _groups(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct integers -> maximal ranges ``[lo, hi)`` of consecutive values."""
    if pos.size == 0:
        return pos, pos
    brk = np.nonzero(np.diff(pos) != 1)[0] + 1
    first = np.concatenate(([0], brk))
    last = np.concatenate((brk - 1, [pos.size - 1]))
    return pos[first], pos[last] + 1


@dataclass(frozen=True)
class _Seq:
    """An ordered list of intervals ``[starts[i], ends[i])`` of the global sequence G."""

    starts: np.ndarray
    ends: np.ndarray

    @property
    def cum(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.ends - self.starts))).astype(_I64)

    def __len__(self) -> int:
        return int((self.ends - self.starts).sum())

    def take(self, a: np.ndarray, b: np.ndarray, cum: np.ndarray | None = None) -> _Seq:
        """Positions ``[a_i, b_i)`` of this sequence (in order) as intervals of G."""
        j, lo, hi = _split(a, b, self.cum if cum is None else cum)
        return _Seq(*_merge(self.starts[j] + lo, self.starts[j] + hi))


# --------------------------------------------------------------------------- one stage


@dataclass(frozen=True)
class _Topology:
    world_size: int
    workers: int  # >= 1: num_workers=0 is one stream, the same as 1
    batch_size: int


class _Stage:
    """One topology applied to one stage sequence: the blocks, workers and windows of an epoch."""

    def __init__(self, index: int, seq: _Seq, topo: _Topology, policy: str, window: int, key: tuple[int, int]):
        self.index, self.seq, self.topo, self.policy, self.window, self.key = index, seq, topo, policy, window, key
        self.cum = seq.cum
        self.length = int(self.cum[-1])
        r, b, w = topo.world_size, topo.batch_size, topo.workers
        self.per_rank = -(-self.length // r) if policy == "pad" else self.length // r
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

    def window_perm(self, rank: int, worker: int, j: int, size: int) -> np.ndarray:
        return _permutation((*self.key, _TAG_WINDOW, self.index, rank, worker, j), size)

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
        glo, ghi = _groups(left)
        return glo + lo, ghi + lo, np.searchsorted(left, rest).astype(_I64)

    def windows(self, rank: int, worker: int, start: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """Block-position ranges and yield order of each window from ``start`` on, lazily."""
        n, k = int(self.worker_sizes[worker]), self.window
        if start >= n:
            return
        if k <= 1:
            yield np.array([start], dtype=_I64), np.array([n], dtype=_I64), None
            return
        if start % k:
            yield self.residual(rank, worker, start)
            start += k - start % k
        for j in range(start // k, -(-n // k)):
            size = min(k, n - j * k)
            yield np.array([j * k], dtype=_I64), np.array([j * k + size], dtype=_I64), self.window_perm(rank, worker, j, size)

    def stream_ranges(self, rank: int, worker: int, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Every block position yielded from ``start`` on, as sorted ranges (no full-window perms)."""
        n, k = int(self.worker_sizes[worker]), self.window
        if start >= n:
            e = np.zeros(0, dtype=_I64)
            return e, e
        if k > 1 and start % k:
            lo, hi, _ = self.residual(rank, worker, start)
            nxt = start + k - start % k
            if nxt < n:
                lo, hi = np.append(lo, nxt), np.append(hi, n)
            return lo, hi
        return np.array([start], dtype=_I64), np.array([n], dtype=_I64)

    def to_g(self, rank: int, worker: int, lo: np.ndarray, hi: np.ndarray) -> _Seq:
        """Block positions of (rank, worker) -> intervals of G (through the tail policy)."""
        base = rank * self.per_rank + int(self.worker_offsets[worker])
        return self._virtual_to_g(lo + base, hi + base)

    def _virtual_to_g(self, a: np.ndarray, b: np.ndarray) -> _Seq:
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

    def remaining(self, batches: Sequence[int]) -> _Seq:
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
        partial = (start < n) & (start % k != 0) if k > 1 else np.zeros(rows.size, dtype=bool)
        rest = start.copy()
        if partial.any():
            wlo = start - start % k
            size = np.minimum(k, n - wlo)
            rest = np.where(partial, wlo + size, start)
            for sz in np.unique(size[partial]):
                sel = rows[partial & (size == sz)]
                for chunk in np.array_split(sel, -(-sel.size * int(sz) // (1 << 20))):  # ~40 MB at a time
                    parts.append(self._residuals(chunk, ranks, workers, start, wlo, int(sz)))
        full = rest < n
        parts.append((rows[full], rest[full], n[full]))
        row = np.concatenate([p[0] for p in parts])
        lo = np.concatenate([p[1] for p in parts])
        hi = np.concatenate([p[2] for p in parts])
        order = np.lexsort((lo, row))
        row, lo, hi = row[order], lo[order], hi[order]
        return self._virtual_to_g(lo + base[row], hi + base[row])

    def _residuals(self, sel: np.ndarray, ranks: np.ndarray, workers: np.ndarray, start: np.ndarray, wlo: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unconsumed samples of the partial windows of rows ``sel`` (all ``size`` long) as ranges."""
        keys = [(*self.key, _TAG_WINDOW, self.index, int(ranks[i]), int(workers[i]), int(start[i] // self.window)) for i in sel]
        perms = _permutations(keys, size)
        inv = np.empty_like(perms)
        np.put_along_axis(inv, perms, np.broadcast_to(np.arange(size, dtype=_I64), perms.shape), axis=1)
        keep = np.zeros((sel.size, size + 2), dtype=np.int8)
        keep[:, 1:-1] = inv >= (start[sel] - wlo[sel])[:, None]  # yielded at or after the stop
        edge = np.diff(keep, axis=1)
        r0, c0 = np.nonzero(edge == 1)
        _, c1 = np.nonzero(edge == -1)
        return sel[r0], wlo[sel][r0] + c0, wlo[sel][r0] + c1


# --------------------------------------------------------------------------- public plan


class WorkerStream:
    """What one DataLoader worker of one rank reads and yields in this plan.

    Attributes:
        rank: the rank.
        worker: the DataLoader worker id (0 with ``num_workers=0``).
        skipped: samples of this worker's epoch stream consumed before this plan (resume).
        size: samples this stream yields.
        batches: batches this stream yields (whole batches, except possibly the rank's last one).
    """

    def __init__(self, stage: _Stage, shard_order: np.ndarray, shard_cum: np.ndarray, rank: int, worker: int, plan_worker: int, start: int):
        self._stage, self._order, self._scum = stage, shard_order, shard_cum
        self.rank, self.worker, self._pw = rank, worker, plan_worker
        self.skipped = start
        total = int(stage.worker_sizes[plan_worker])
        self.size = max(0, total - start)
        b = stage.topo.batch_size
        self.batches = int(stage.worker_batches[plan_worker]) - min(start, total) // b if self.size else 0

    def __repr__(self) -> str:
        return f"WorkerStream(rank={self.rank}, worker={self.worker}, size={self.size}, batches={self.batches})"

    def _runs(self, lo: np.ndarray, hi: np.ndarray) -> tuple[Run, ...]:
        g = self._stage.to_g(self.rank, self._pw, lo, hi)
        j, a, b = _split(g.starts, g.ends, self._scum)
        shards = self._order[j]
        return tuple(Run(int(s), int(x), int(y)) for s, x, y in zip(shards, a, b))

    @property
    def runs(self) -> tuple[Run, ...]:
        """Every sample this stream yields, as runs in read order (adjacent runs merged).

        Cheap: O(runs), no window permutation beyond a partially consumed first window.
        """
        lo, hi = self._stage.stream_ranges(self.rank, self._pw, self.skipped)
        return self._runs(*_merge(lo, hi))

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


class EpochPlan:
    """The plan of one epoch (or of its rest, after a resume) for one topology.

    Build it with :func:`plan_epoch`. All ranks compute the same plan independently.

    Attributes:
        epoch: the epoch.
        world_size: ranks.
        num_workers: DataLoader workers per rank, as given (0 = in the main process).
        batch_size: the DataLoader batch size the worker split is aligned to.
        total_samples: samples in the data set (one epoch without tail policy).
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

    def __init__(self, *, stage: _Stage, shard_order: np.ndarray, shard_cum: np.ndarray, num_workers: int, fingerprint: dict[str, Any], epoch: int, history: list[dict[str, Any]], start_batches: int):
        self._stage, self._order, self._scum = stage, shard_order, shard_cum
        self._fp, self._history, self._start = fingerprint, history, start_batches
        self.epoch = epoch
        self.world_size = stage.topo.world_size
        self.num_workers = num_workers
        self.batch_size = stage.topo.batch_size
        self.total_samples = int(shard_cum[-1])
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
        """This epoch's shard order (the global sequence G is their samples in this order)."""
        return tuple(int(s) for s in self._order)

    def _check(self, rank: int, worker: int) -> None:
        if not 0 <= rank < self.world_size:
            raise PlanError(f"rank {rank} is outside world_size={self.world_size}; pass 0 <= rank < world_size.")
        if not 0 <= worker < self._stage.topo.workers:
            raise PlanError(f"worker {worker} is outside num_workers={self.num_workers}; pass 0 <= worker < max(num_workers, 1).")

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
        return WorkerStream(self._stage, self._order, self._scum, rank, worker, plan_worker, self._stage.consumed(plan_worker, self._start))

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
        firsts, ends, shards = [], [], []
        for rank in range(self.world_size):
            streams = self.streams(rank)
            n = sum(s.size for s in streams)
            nb = sum(-(-s.size // b) for s in streams)
            if n != self.samples_per_rank or nb != self.batches_per_rank:
                problems.append(f"equal work: rank {rank} yields {n} samples in {nb} batches, not {self.samples_per_rank} in {self.batches_per_rank}")
            for s in streams:
                for run in s.runs:
                    shards.append(run.shard)
                    firsts.append(run.first)
                    ends.append(run.end)
        if self.stage or self._start:
            return problems  # a resumed plan owes only the rest; the property tests cover it
        counts = np.diff(self._scum)[np.argsort(self._order, kind="stable")]  # index order
        base = np.concatenate(([0], np.cumsum(counts))).astype(_I64)
        sh = np.asarray(shards, dtype=_I64)
        lo = base[sh] + np.asarray(firsts, dtype=_I64) if sh.size else np.zeros(0, dtype=_I64)
        hi = base[sh] + np.asarray(ends, dtype=_I64) if sh.size else np.zeros(0, dtype=_I64)
        pos = np.concatenate((lo, hi, [0, self.total_samples]))
        delta = np.concatenate((np.ones(lo.size, _I64), -np.ones(hi.size, _I64), [0, 0]))
        order = np.argsort(pos, kind="stable")
        pos, mult = pos[order], np.cumsum(delta[order])
        seg, mult = np.diff(pos), mult[:-1]
        missing = int(seg[mult == 0].sum())
        extra = int((seg * np.maximum(mult - 1, 0)).sum())
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
            A small JSON-safe dict (see the module docstring); pass it as ``resume=`` to
            :func:`plan_epoch`, with any topology.

        Raises:
            PlanError: a count is negative or above :attr:`batches_per_rank`, or the list length
                differs from the world size.
        """
        per = _per_rank_counts(batches, self.world_size, f"EpochPlan.state_dict(batches={batches!r})")
        for r, c in enumerate(per):
            if c > self.batches_per_rank:
                raise PlanError(f"rank {r} cannot have consumed {c} batches of epoch {self.epoch}: this plan yields {self.batches_per_rank} per rank; pass the batches taken since this plan started.")
        total = [self._start + c for c in per]
        stage = {K_WORLD: self.world_size, K_WORKERS: self._stage.topo.workers, K_BATCH: self.batch_size, K_BATCHES: total[0] if len(set(total)) == 1 else total}
        return {K_VERSION: STATE_VERSION, K_FINGERPRINT: dict(self._fp), K_EPOCH: self.epoch, K_STAGES: [*self._history, stage]}


# --------------------------------------------------------------------------- entry point


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _per_rank_counts(batches: Any, world: int, what: str) -> list[int]:
    if _is_int(batches):
        per = [int(batches)] * world
    elif isinstance(batches, Sequence) and not isinstance(batches, str) and all(_is_int(x) for x in batches):
        per = [int(x) for x in batches]
        if len(per) != world:
            raise PlanError(f"{what}: {len(per)} per-rank counts for world_size={world}; give one per rank or one int.")
    else:
        raise PlanError(f"{what}: expected an int or a list of ints, one per rank.")
    if any(c < 0 for c in per):
        raise PlanError(f"{what}: consumed counts must be >= 0.")
    return per


def _fingerprint(counts: np.ndarray, index_fingerprint: str | None, seed: int, policy: str, shuffle: Shuffle) -> dict[str, Any]:
    digest = hashlib.sha256(counts.astype("<i8").tobytes()).hexdigest()[:32]
    return {"samples": f"sha256:{digest}", "index": index_fingerprint, "seed": seed, "policy": policy, "shuffle": shuffle._as_json()}


def _check_int(name: str, value: object, low: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or int(value) < low:
        raise PlanError(f"{name}={value!r} must be an int >= {low}.")
    return int(value)


def _parse_stages(state: Mapping[str, Any]) -> list[tuple[_Topology, list[int], dict[str, Any]]]:
    stages = state.get(K_STAGES)
    if not isinstance(stages, list):
        raise PlanError(f"resume state has no {K_STAGES!r} list; pass a dict made by EpochPlan.state_dict().")
    out = []
    for i, st in enumerate(stages):
        if not isinstance(st, Mapping) or not all(k in st for k in (K_WORLD, K_WORKERS, K_BATCH, K_BATCHES)):
            raise PlanError(f"resume state stage {i} is malformed ({st!r}); pass a dict made by EpochPlan.state_dict().")
        topo = _Topology(_check_int(f"stage {i} world_size", st[K_WORLD], 1), _check_int(f"stage {i} num_workers", st[K_WORKERS], 1), _check_int(f"stage {i} batch_size", st[K_BATCH], 1))
        out.append((topo, _per_rank_counts(st[K_BATCHES], topo.world_size, f"resume state stage {i}"), dict(st)))
    return out


def plan_epoch(
    sample_counts: Sequence[int] | np.ndarray,
    *,
    seed: int,
    epoch: int,
    world_size: int,
    num_workers: int = 0,
    batch_size: int = 1,
    policy: TailPolicy = "pad",
    shuffle: Shuffle = Shuffle(),
    resume: Mapping[str, Any] | None = None,
    index_fingerprint: str | None = None,
) -> EpochPlan:
    """Plan one epoch (or the rest of it, from ``resume``) for one topology.

    Args:
        sample_counts: samples per shard, in index order (zeros allowed).
        seed: base seed (int >= 0); persisted in the state fingerprint.
        epoch: epoch number (int >= 0); with ``seed`` it keys the shard order.
        world_size: number of ranks.
        num_workers: DataLoader workers per rank (0 = load in the main process).
        batch_size: the DataLoader's batch size; worker streams are cut in whole batches so that
            resume positions are exact (1 when batching happens elsewhere).
        policy: ``"pad"`` (wrap to the start, like DistributedSampler) or ``"drop"``.
        shuffle: shard and sample-level shuffle settings.
        resume: a state from :meth:`EpochPlan.state_dict` of this epoch, or ``None`` for a fresh
            epoch. Any topology may resume any state.
        index_fingerprint: the index's own fingerprint, recorded in and checked against the state.

    Returns:
        The plan; ``plan.stream(rank, worker)`` is what each DataLoader worker reads.

    Raises:
        PlanError: invalid arguments, an empty data set, ``"drop"`` with fewer samples than
            ranks, or a malformed state.
        StateMismatchError: the state belongs to another data set, seed, policy, shuffle or epoch.
    """
    counts = np.asarray(sample_counts)
    if counts.ndim != 1 or (counts.size and (counts.dtype.kind not in "iu" or int(counts.min()) < 0)):
        raise PlanError("sample_counts must be a 1-D sequence of ints >= 0 (samples per shard, in index order).")
    counts = counts.astype(_I64)
    seed = _check_int("seed", seed, 0)
    epoch = _check_int("epoch", epoch, 0)
    topo = _Topology(_check_int("world_size", world_size, 1), max(1, _check_int("num_workers", num_workers, 0)), _check_int("batch_size", batch_size, 1))
    if policy not in _POLICIES:
        raise PlanError(f"policy={policy!r} is not one of {_POLICIES}.")
    if not isinstance(shuffle, Shuffle):
        raise PlanError(f"shuffle={shuffle!r} must be a streamio.data.plan.Shuffle.")
    fp = _fingerprint(counts, index_fingerprint, seed, policy, shuffle)

    total = int(counts.sum())
    order = _permutation((seed, epoch, _TAG_SHARDS), counts.size) if shuffle.shards else np.arange(counts.size, dtype=_I64)
    shard_cum = np.concatenate(([0], np.cumsum(counts[order]))).astype(_I64)
    key = (seed, epoch)
    seq = _Seq(np.array([0], dtype=_I64), np.array([total], dtype=_I64))

    def new_plan(index: int, seq: _Seq, history: list[dict[str, Any]], start: int) -> EpochPlan:
        stage = _Stage(index, seq, topo, policy, shuffle.window, key)
        return EpochPlan(stage=stage, shard_order=order, shard_cum=shard_cum, num_workers=num_workers, fingerprint=fp, epoch=epoch, history=history, start_batches=start)

    if resume is None:
        if total == 0:
            raise PlanError(f"the data set has no samples ({counts.size} shards, all empty); nothing to plan. Check the index.")
        if policy == "drop" and total < topo.world_size:
            raise PlanError(f"world_size={topo.world_size} exceeds the {total} samples of the data set: with policy='drop' every rank would get 0. Use policy='pad' or fewer ranks.")
        return new_plan(0, seq, [], 0)

    _check_state(resume, fp, epoch)
    stages = _parse_stages(resume)
    history: list[dict[str, Any]] = []
    for i, (t, per, raw) in enumerate(stages):
        stage = _Stage(i, seq, t, policy, shuffle.window, key)
        for r, c in enumerate(per):
            if c > stage.batches:
                raise PlanError(f"resume state stage {i}: rank {r} consumed {c} batches but the stage has {stage.batches}; the state does not belong to this data set.")
        last = i == len(stages) - 1
        if last and t == topo and len(set(per)) == 1:
            return new_plan(i, seq, history, per[0])
        history.append(raw)
        seq = stage.remaining(per)
    return new_plan(len(stages), seq, history, 0)


def _check_state(state: Mapping[str, Any], fp: dict[str, Any], epoch: int) -> None:
    if not isinstance(state, Mapping) or state.get(K_VERSION) != STATE_VERSION:
        got = state.get(K_VERSION) if isinstance(state, Mapping) else type(state).__name__
        raise PlanError(f"resume state version {got!r} is not supported (this streamio reads version {STATE_VERSION}); it was written by another streamio version.")
    theirs = state.get(K_FINGERPRINT)
    if not isinstance(theirs, Mapping):
        raise PlanError("resume state has no fingerprint; pass a dict made by EpochPlan.state_dict().")
    diffs = [f"{k}: state has {theirs.get(k)!r}, this plan has {fp[k]!r}" for k in fp if theirs.get(k) != fp[k]]
    if state.get(K_EPOCH) != epoch:
        diffs.append(f"epoch: state has {state.get(K_EPOCH)!r}, this plan has {epoch!r}")
    if diffs:
        raise StateMismatchError(f"resume state does not belong to this plan ({'; '.join(diffs)}); resume with the data set, seed, policy, shuffle and epoch it was taken with, or start fresh.")
