"""How many samples each source of a mixture contributes to an epoch.

A source states at most one of ``weight`` (a relative share) and ``samples`` (an absolute count per
epoch); with neither it contributes its own size. Fixed contributions (``samples``, or the size) are
taken as stated; the weighted sources share what is left of the epoch in proportion to their
weights. The epoch is ``epoch_samples`` when given, else the fixed contributions plus the weighted
sources' own sizes (so weights alone re-balance a mixture without changing its epoch length).
Shares are rounded by the largest-remainder method over exact fractions, so the contributions sum
to the epoch exactly and are the same on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from streamio.errors import PlanError

__all__ = ["PlanSource", "contributions"]


@dataclass(frozen=True)
class PlanSource:
    """One source of a mixture as the planner sees it: its sample counts and its stated share.

    Attributes:
        counts: samples per shard, in index order.
        weight: relative share (a finite number > 0), or None.
        samples: samples per epoch (an int >= 1), or None.
        fingerprint: the source index's fingerprint (recorded in resume states), or None.
        name: how errors name the source (its URL).
    """

    counts: np.ndarray
    weight: float | None = None
    samples: int | None = None
    fingerprint: str | None = None
    name: str = "source"

    @property
    def size(self) -> int:
        """Samples in the source."""
        return int(self.counts.sum())

    def __post_init__(self) -> None:
        if self.weight is not None and self.samples is not None:
            raise PlanError(f"{self.name}: give weight= or samples=, not both")
        if self.weight is not None and (
            isinstance(self.weight, bool)
            or not isinstance(self.weight, (int, float, np.integer, np.floating))
            or not math.isfinite(self.weight)
            or self.weight <= 0
        ):
            raise PlanError(f"{self.name}: weight={self.weight!r} must be a finite number > 0")
        if self.samples is not None and (
            isinstance(self.samples, bool) or not isinstance(self.samples, (int, np.integer)) or self.samples < 1
        ):
            raise PlanError(f"{self.name}: samples={self.samples!r} must be an int >= 1")
        counts = np.asarray(self.counts)
        if counts.ndim != 1 or (counts.size and (counts.dtype.kind not in "iu" or int(counts.min()) < 0)):
            raise PlanError(f"{self.name}: sample counts must be a 1-D sequence of ints >= 0 (samples per shard).")
        object.__setattr__(self, "counts", counts.astype(np.int64))
        if self.size < 1:
            raise PlanError(f"{self.name} has no samples; a mixture cannot draw from an empty source")


def contributions(specs: Sequence[PlanSource], epoch_samples: int | None = None) -> list[int]:
    """Samples each source contributes to every epoch (see the module docstring).

    Raises:
        PlanError: no sources, ``epoch_samples`` below the fixed contributions (or given with no
            weighted source to scale while the fixed ones do not add up to it).
    """
    if not specs:
        raise PlanError("a mixture needs at least one source")
    if epoch_samples is not None and (
        isinstance(epoch_samples, bool) or not isinstance(epoch_samples, int) or epoch_samples < 1
    ):
        raise PlanError(f"epoch_samples={epoch_samples!r} must be an int >= 1")
    fixed = [s.samples if s.samples is not None else s.size for s in specs]
    weighted = [i for i, s in enumerate(specs) if s.weight is not None]
    out = [0 if i in weighted else f for i, f in enumerate(fixed)]
    fixed_total = sum(out)
    if epoch_samples is None:
        pool = sum(specs[i].size for i in weighted)
    else:
        pool = epoch_samples - fixed_total
        if pool < 0 or (pool > 0 and not weighted):
            raise PlanError(
                f"epoch_samples={epoch_samples} but the sources without a weight contribute {fixed_total}: "
                "give weights to the sources that should fill the epoch, or drop epoch_samples"
            )
    if weighted:
        total_w = sum(Fraction(specs[i].weight) for i in weighted)  # type: ignore[arg-type]
        exact = [Fraction(specs[i].weight) / total_w * pool for i in weighted]  # type: ignore[arg-type]
        floors = [int(x) for x in exact]
        short = pool - sum(floors)
        by_remainder = sorted(range(len(weighted)), key=lambda k: (-(exact[k] - floors[k]), k))
        for k in by_remainder[:short]:
            floors[k] += 1
        for k, i in enumerate(weighted):
            out[i] = floors[k]
    return out
