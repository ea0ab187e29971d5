"""Test helpers for the planner: an independent model of torch's DataLoader and of the epoch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from streamio.data.plan import EpochPlan

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


def global_sequence(plan: EpochPlan, counts: Sequence[int]) -> list[Sample]:
    """The epoch's global sequence G, from the public shard order."""
    return [(s, i) for s in plan.shard_order for i in range(counts[s])]


def all_streams(plan: EpochPlan) -> list[list[Sample]]:
    """Every rank's DataLoader order."""
    return [dataloader_order(plan, r) for r in range(plan.world_size)]


def multiset(streams: Sequence[Sequence[Sample]]) -> Counter[Sample]:
    """The multiset union of streams."""
    c: Counter[Sample] = Counter()
    for s in streams:
        c.update(s)
    return c
