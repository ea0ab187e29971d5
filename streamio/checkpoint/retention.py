"""Retention policies: which committed checkpoints to keep (PURE, like :mod:`.manifest`).

A policy sees what retention knows of each committed checkpoint (:class:`CheckpointRecord`: its
step and metrics) and returns the steps to keep; policies combine with ``|`` (union). Whatever a
policy says, the step ``latest.json`` names is never deleted (:func:`steps_to_delete`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class CheckpointRecord:
    """What retention knows of a committed checkpoint."""

    step: int
    metrics: Mapping[str, Any] = field(default_factory=dict)


class RetentionPolicy:
    """Decides which committed checkpoints to keep; combine policies with ``|`` (union).

    Subclasses implement :meth:`keep`; the manager always also keeps the newest committed
    checkpoint, whatever the policy says, so retention can never leave none.
    """

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        """Steps to keep among ``records`` (sorted by step, oldest first)."""
        raise NotImplementedError

    def __or__(self, other: RetentionPolicy) -> RetentionPolicy:
        return KeepAny((self, other))


@dataclass(frozen=True)
class KeepLast(RetentionPolicy):
    """Keep the ``k`` newest checkpoints."""

    k: int

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"KeepLast(k) needs k >= 1, got {self.k}")

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        return {r.step for r in sorted(records, key=lambda r: r.step)[-self.k :]}


@dataclass(frozen=True)
class KeepBest(RetentionPolicy):
    """Keep the ``k`` checkpoints with the best value of ``metric`` (checkpoints without it lose)."""

    metric: str
    mode: Literal["min", "max"] = "min"
    k: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"KeepBest mode must be 'min' or 'max', got {self.mode!r}")
        if self.k < 1:
            raise ValueError(f"KeepBest(k) needs k >= 1, got {self.k}")

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        scored = [
            (float(r.metrics[self.metric]), r.step)
            for r in records
            if isinstance(r.metrics.get(self.metric), (int, float)) and not isinstance(r.metrics.get(self.metric), bool)
            and r.metrics[self.metric] == r.metrics[self.metric]  # not NaN
        ]
        # ties: the newer checkpoint wins
        scored.sort(key=lambda vs: (vs[0] if self.mode == "min" else -vs[0], -vs[1]))
        return {step for _, step in scored[: self.k]}


@dataclass(frozen=True)
class KeepEvery(RetentionPolicy):
    """Keep every checkpoint whose step is a multiple of ``n`` (permanent milestones)."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"KeepEvery(n) needs n >= 1, got {self.n}")

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        return {r.step for r in records if r.step % self.n == 0}


@dataclass(frozen=True)
class KeepAll(RetentionPolicy):
    """Never delete anything."""

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        return {r.step for r in records}


@dataclass(frozen=True)
class KeepAny(RetentionPolicy):
    """The union of several policies: a checkpoint any of them keeps is kept."""

    policies: tuple[RetentionPolicy, ...]

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        kept: set[int] = set()
        for p in self.policies:
            kept |= p.keep(records)
        return kept


def steps_to_delete(policy: RetentionPolicy, records: Sequence[CheckpointRecord], *, current: int) -> list[int]:
    """Committed steps that ``policy`` drops, never ``current`` (the one the pointer names)."""
    kept = policy.keep(records) | {current}
    return sorted(r.step for r in records if r.step not in kept)
