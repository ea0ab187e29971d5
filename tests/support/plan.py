"""Test helpers for the planner: an independent model of torch's DataLoader and of the epoch."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from streamio.data.plan import EpochPlan
from streamio.data.plan.permutation import TAG_REST, TAG_SHARDS, permutation

Sample = tuple[int, int]


def dataloader_order(plan: EpochPlan, rank: int) -> list[Sample]:
    """What ``DataLoader(num_workers=W, batch_size=B)`` over the rank's loader-worker streams yields.

    Mirrors torch: a fresh loader asks worker 0, 1, ..., W-1, 0, ... for one batch each; a worker
    answers up to B samples of its own stream (a partial batch at its end), and a worker with
    nothing left is skipped from then on.
    """
    streams = [list(s) for s in plan.streams(rank)]
    pos = [0] * len(streams)
    active = [True] * len(streams)
    out: list[Sample] = []
    k = 0
    while any(active):
        if active[k]:
            batch = streams[k][pos[k] : pos[k] + plan.batch_size]
            if batch:
                pos[k] += len(batch)
                out.extend(batch)
            else:
                active[k] = False
        k = (k + 1) % len(streams)
    return out


def dataloader_batches(plan: EpochPlan, rank: int) -> int:
    """Number of batches the DataLoader model yields on ``rank``."""
    return sum(-(-s.size // plan.batch_size) for s in plan.streams(rank))


def interleaved(order: Sequence[int], counts: Sequence[int], width: int) -> list[Sample]:
    """Shards in ``order``, in groups of ``width`` whose samples are merged by key ``(k + 1/2) / size``.

    An independent model of :mod:`streamio.data.plan.interleave` in exact fractions: item ``k`` of
    lane ``j`` has key ``(2k + 1) / (2 c_j)``, ties broken by lane.
    """
    out: list[Sample] = []
    for g in range(0, len(order), max(1, width)):
        members = order[g : g + max(1, width)]
        keyed = [
            (Fraction(2 * k + 1, 2 * counts[s]), j, (s, k)) for j, s in enumerate(members) for k in range(counts[s])
        ]
        out.extend(item for _, _, item in sorted(keyed))
    return out


def mixed(slices: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Lanes merged proportionally: item ``k`` of lane ``i`` (of ``L``) at key ``(k + (i + 1/2) / L) / c_i``."""
    lanes = len(slices)
    keyed = [
        (Fraction(2 * lanes * k + 2 * i + 1, 2 * lanes * len(sl)), i, item)
        for i, sl in enumerate(slices)
        for k, item in enumerate(sl)
    ]
    return [item for _, _, item in sorted(keyed)]


def global_sequence(plan: EpochPlan, counts: Sequence[int]) -> list[Sample]:
    """The epoch's global sequence G of one data set, from the public shard order."""
    return interleaved(plan.shard_order, counts, 1)


def all_streams(plan: EpochPlan) -> list[list[Sample]]:
    """Every rank's DataLoader order."""
    return [dataloader_order(plan, r) for r in range(plan.world_size)]


def multiset(streams: Sequence[Sequence[Sample]]) -> Counter[Sample]:
    """The multiset union of streams."""
    c: Counter[Sample] = Counter()
    for s in streams:
        c.update(s)
    return c


# --------------------------------------------------------------------------- mixtures (independent models)


def source_slice(
    counts: Sequence[int], offset: int, c: int, *, seed: int, epoch: int, source: int, single: bool, shuffle: bool
) -> list[Sample]:
    """A source's epoch slice, from the definition: ``c // size`` passes, then ``c % size`` of the remainder walk.

    Pass ``p`` of epoch ``e`` is the shards in ``permutation((seed, e, TAG_SHARDS, source, p))``
    (``(seed, e, TAG_SHARDS)`` for pass 0 of a single source); the remainder walk is the shards in
    ``permutation((seed, Q, TAG_REST, source))`` read cyclically from ``(e * r) % size``, with
    ``Q = (e * r) // lcm(size, r)``. Shards are named globally (``offset + local``).
    """
    size, n = sum(counts), len(counts)

    def samples(order: Sequence[int]) -> list[Sample]:
        return [(offset + s, i) for s in order for i in range(counts[s])]

    def order(key: tuple[int, ...]) -> list[int]:
        return [int(x) for x in permutation(key, n)] if shuffle else list(range(n))

    passes, rest = divmod(c, size)
    out: list[Sample] = []
    for p in range(passes):
        key = (seed, epoch, TAG_SHARDS) if single and p == 0 else (seed, epoch, TAG_SHARDS, source, p)
        out.extend(samples(order(key)))
    if rest:
        walk = samples(order((seed, epoch * rest // math.lcm(size, rest), TAG_REST, source)))
        first = epoch * rest % size
        out.extend(walk[(first + x) % size] for x in range(rest))
    return out


def mixture_sequence(
    counts: Sequence[Sequence[int]], shares: Sequence[int], *, seed: int, epoch: int, shuffle_shards: bool
) -> list[Sample]:
    """Epoch `epoch` of a mixture's global sequence G, from the definition (:func:`source_slice`, :func:`mixed`)."""
    slices = []
    offset = 0
    for i, (cs, c) in enumerate(zip(counts, shares, strict=True)):
        single = len(counts) == 1
        slices.append(
            source_slice(cs, offset, c, seed=seed, epoch=epoch, source=i, single=single, shuffle=shuffle_shards)
            if c else []
        )
        offset += len(cs)
    return mixed(slices) if len(slices) > 1 else slices[0]


def with_tail(g: Sequence[Sample], policy: str, padding: int, dropped: int) -> Counter[Sample]:
    """The multiset an epoch over G yields under a tail policy: pad repeats G's start, drop cuts its end."""
    if policy == "pad":
        return Counter(g) + Counter(g[i % len(g)] for i in range(padding))
    return Counter(g[: len(g) - dropped])


def largest_remainder(weights: Sequence[float], pool: int) -> list[int]:
    """Hamilton's method in exact fractions: floors of ``pool * w_i / sum(w)``, the rest to the largest remainders.

    Ties in the remainder go to the earlier source.
    """
    exact = [Fraction(w) / sum(Fraction(x) for x in weights) * pool for w in weights]
    out = [math.floor(x) for x in exact]
    for i in sorted(range(len(out)), key=lambda i: (out[i] - exact[i], i))[: pool - sum(out)]:
        out[i] += 1
    return out
