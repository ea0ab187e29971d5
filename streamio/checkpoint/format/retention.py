"""Retention policies: which committed checkpoints to keep (PURE).

A policy sees what retention knows of each checkpoint of the *current timeline*
(:class:`CheckpointRecord`: its step and metrics), in commit order, oldest first, and returns the
steps to keep; policies combine with ``|`` (union). Saves of abandoned timelines are never shown
to a policy: they are retired whatever it says (docs/checkpoint-lifecycle.md). Whatever a policy
says, the step ``latest.json`` names is never deleted (:func:`steps_to_delete`).

A policy is recorded in the root (:func:`policy_to_json`, ``retention.json``) so that a job that
opens the root without one applies the same (:func:`policy_from_json`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streamio.errors import ConfigError


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
        """Steps to keep among ``records`` (the current timeline's, in commit order, oldest first)."""
        raise NotImplementedError

    def __or__(self, other: RetentionPolicy) -> RetentionPolicy:
        return KeepAny((self, other))


@dataclass(frozen=True)
class KeepLast(RetentionPolicy):
    """Keep the ``k`` checkpoints committed last on the current timeline."""

    k: int

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ConfigError(f"KeepLast(k) needs k >= 1, got {self.k}")

    def keep(self, records: Sequence[CheckpointRecord]) -> set[int]:
        return {r.step for r in records[-self.k :]}


@dataclass(frozen=True)
class KeepBest(RetentionPolicy):
    """Keep the ``k`` checkpoints with the best value of ``metric`` (checkpoints without it lose)."""

    metric: str
    mode: Literal["min", "max"] = "min"
    k: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ConfigError(f"KeepBest mode must be 'min' or 'max', got {self.mode!r}")
        if self.k < 1:
            raise ConfigError(f"KeepBest(k) needs k >= 1, got {self.k}")

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
            raise ConfigError(f"KeepEvery(n) needs n >= 1, got {self.n}")

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


# ------------------------------------------------------------------------------ recording
def policy_to_json(policy: RetentionPolicy) -> dict[str, Any]:
    """The JSON form recorded in ``retention.json``: ``{"keep_last": 3}``, ``{"keep_best":
    {"metric": "val_loss", "mode": "min", "k": 1}}``, ``{"keep_every": 1000}``, ``{"keep_all":
    {}}``, ``{"any": [...]}`` for a union, and ``{"custom": "module.Class"}`` for a policy of
    one's own, which cannot be rebuilt from JSON."""
    if isinstance(policy, KeepLast):
        return {"keep_last": policy.k}
    if isinstance(policy, KeepBest):
        return {"keep_best": {"metric": policy.metric, "mode": policy.mode, "k": policy.k}}
    if isinstance(policy, KeepEvery):
        return {"keep_every": policy.n}
    if isinstance(policy, KeepAll):
        return {"keep_all": {}}
    if isinstance(policy, KeepAny):
        return {"any": [policy_to_json(p) for p in policy.policies]}
    return {"custom": f"{type(policy).__module__}.{type(policy).__qualname__}"}


def policy_from_json(doc: Any, *, depth: int = 0) -> RetentionPolicy | None:
    """The policy ``doc`` records; ``None`` for a ``custom`` one (it cannot be rebuilt here).

    Raises:
        ValueError: ``doc`` is not a policy as :func:`policy_to_json` writes them.
    """
    if not isinstance(doc, dict) or len(doc) != 1 or depth > 16:
        raise ConfigError(f"a retention policy is an object with one key, got {str(doc)[:80]!r}")
    ((kind, arg),) = doc.items()
    if kind == "keep_last" and _count(arg):
        return KeepLast(arg)
    if kind == "keep_every" and _count(arg):
        return KeepEvery(arg)
    if kind == "keep_all" and arg == {}:
        return KeepAll()
    if kind == "keep_best" and isinstance(arg, dict) and set(arg) == {"metric", "mode", "k"}:
        if isinstance(arg["metric"], str) and arg["mode"] in ("min", "max") and _count(arg["k"]):
            return KeepBest(arg["metric"], arg["mode"], arg["k"])
    if kind == "any" and isinstance(arg, list) and arg:
        parts = [policy_from_json(p, depth=depth + 1) for p in arg]
        if any(p is None for p in parts):
            return None
        return KeepAny(tuple(p for p in parts if p is not None))
    if kind == "custom" and isinstance(arg, str):
        return None
    raise ConfigError(f"unknown retention policy {str(doc)[:80]!r}")


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 1 << 62
