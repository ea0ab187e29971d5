"""The planner's inputs as small frozen values: who reads an epoch, and how it is sampled.

:class:`Topology` says who reads (ranks, DataLoader workers, batch size); :class:`Sampling` says how
the epoch is drawn (:class:`Shuffle` and the tail policy). Each validates itself when built, so a
wrong setting fails where it was written, with a :class:`~streamio.errors.PlanError` that names it,
and :func:`~streamio.data.plan.plan_epoch` takes two values instead of six loose arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from streamio.errors import PlanError

__all__ = [
    "DEFAULT_INTERLEAVE", "DEFAULT_WINDOW", "MAX_BATCH_SIZE", "MAX_EPOCH", "MAX_STREAMS", "MAX_WORKERS",
    "MAX_WORLD_SIZE", "POLICIES", "Sampling", "Shuffle", "TailPolicy", "Topology", "check_int",
]

TailPolicy = Literal["drop", "pad"]
"""What happens to the samples that do not divide evenly across ranks (see :mod:`streamio.data.plan`)."""

POLICIES: tuple[str, ...] = ("drop", "pad")


# Sane bounds of the sizes a plan is made for. Topologies and resume states (which may come from a
# checkpoint file: untrusted input) are checked against them before anything is allocated for them:
# the planner's memory is O(ranks x workers), so a state claiming 10^9 ranks must be refused, not
# planned. Each is far above any job that exists; the error names the bound.
MAX_WORLD_SIZE = 1 << 20
"""Most ranks a topology (or a stage of a resume state) may have."""
MAX_WORKERS = 1024
"""Most DataLoader workers per rank."""
MAX_STREAMS = 1 << 20
"""Most worker streams (ranks x workers) of one topology: re-planning holds a few ints per stream."""
MAX_BATCH_SIZE = 1 << 24
"""Largest batch size."""
MAX_EPOCH = (1 << 31) - 1
"""Largest epoch number."""


def check_int(name: str, value: object, low: int, high: int | None = None, *, fix: str = "") -> int:
    """``value`` as an int, or a :class:`PlanError` naming ``name`` (then ``fix``) if not an int in ``[low, high]``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or int(value) < low:
        raise PlanError(f"{name}={_short(value)} must be an int >= {low}.{fix}")
    if high is not None and int(value) > high:
        raise PlanError(f"{name}={value!r} is above the limit of {high}.{fix}")
    return int(value)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


DEFAULT_WINDOW = 256
"""Sample-shuffle window of the default :class:`Shuffle`."""
DEFAULT_INTERLEAVE = 32
"""Shards read at once (interleaved) by the default :class:`Shuffle`."""


@dataclass(frozen=True)
class Shuffle:
    """How an epoch's order is randomised.

    The default mixes across shards: every worker reads ``interleave`` shards at once, each front to
    back, their samples interleaved, and yields every ``window`` consecutive samples permuted. On a
    data set written one class per shard, a batch of 32 then holds samples of about 20 shards.
    ``Shuffle(interleave=1)`` reads one shard at a time (cheaper: one read stream per worker, but
    neighbours come from the same one or two shards); ``Shuffle(shards=False, window=0,
    interleave=1)`` is index order (what ``shuffle=False`` means).

    Attributes:
        shards: permute the shard order every epoch (keyed by ``(seed, epoch)``). ``False`` keeps
            index order (evaluation).
        window: sample-level shuffle: permute every ``window`` consecutive samples of a worker's
            stream. 0 or 1 = no sample-level permutation. The reader buffers this many samples.
        interleave: shards whose samples are interleaved (groups of this many consecutive shards of
            the epoch order). The reader keeps one read stream per shard of a group open, buffering
            at most a segment (about 1 MiB) of each. 1 = one shard after another.
    """

    shards: bool = True
    window: int = DEFAULT_WINDOW
    interleave: int = DEFAULT_INTERLEAVE

    def __post_init__(self) -> None:
        for name in ("window", "interleave"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise PlanError(f"Shuffle({name}={v!r}) must be an int >= 0.")
        if self.interleave > 4096:
            raise PlanError(f"Shuffle(interleave={self.interleave}) reads too many shards at once; at most 4096.")
        object.__setattr__(self, "interleave", max(1, self.interleave))

    @classmethod
    def off(cls) -> Shuffle:
        """Index order, no permutation at all (``shuffle=False``)."""
        return cls(shards=False, window=0, interleave=1)

    def as_json(self) -> dict[str, Any]:
        """The settings as recorded in a resume state's fingerprint."""
        out: dict[str, Any] = {"shards": bool(self.shards), "window": int(self.window)}
        if self.interleave > 1:  # absent = 1: states written before interleaving existed still match
            out["interleave"] = int(self.interleave)
        return out


@dataclass(frozen=True)
class Topology:
    """Who reads an epoch: ranks, DataLoader workers per rank, and the DataLoader's batch size.

    Attributes:
        world_size: number of ranks (int, 1 to :data:`MAX_WORLD_SIZE`).
        num_workers: DataLoader workers per rank (int, 0 to :data:`MAX_WORKERS`; 0 = load in the
            main process, which reads the same single stream as 1 worker).
        batch_size: the DataLoader's batch size (int, 1 to :data:`MAX_BATCH_SIZE`); worker streams
            are cut in whole batches so that resume positions are exact (1 when batching happens
            elsewhere).

    Raises:
        PlanError: a field is not an int in its range, or ranks x workers exceeds
            :data:`MAX_STREAMS` (numpy ints are accepted and stored as int).
    """

    world_size: int
    num_workers: int = 0
    batch_size: int = 1

    def __post_init__(self) -> None:
        # stored as plain ints: they go into JSON resume states
        object.__setattr__(self, "world_size", check_int("world_size", self.world_size, 1, MAX_WORLD_SIZE))
        object.__setattr__(self, "num_workers", check_int("num_workers", self.num_workers, 0, MAX_WORKERS))
        object.__setattr__(self, "batch_size", check_int("batch_size", self.batch_size, 1, MAX_BATCH_SIZE))
        if self.world_size * self.workers > MAX_STREAMS:
            raise PlanError(
                f"world_size={self.world_size} x num_workers={self.workers} is {self.world_size * self.workers} "
                f"worker streams, above the limit of {MAX_STREAMS}."
            )

    @property
    def workers(self) -> int:
        """Streams per rank: ``num_workers``, or 1 when loading in the main process."""
        return max(1, self.num_workers)

    def streams(self) -> Topology:
        """This topology with ``num_workers`` as the number of streams (0 becomes 1).

        Two topologies read an epoch identically exactly when their ``streams()`` are equal; it is
        what a resume state records.
        """
        return Topology(self.world_size, self.workers, self.batch_size)


@dataclass(frozen=True)
class Sampling:
    """How an epoch is drawn from the data set: the shuffle and the tail policy.

    Attributes:
        shuffle: shard-order and sample-level shuffle settings.
        policy: ``"pad"`` (wrap to the start, like ``DistributedSampler``) or ``"drop"``: what
            happens to the samples that do not divide evenly across ranks.

    Raises:
        PlanError: ``shuffle`` is not a :class:`Shuffle` or ``policy`` is not a tail policy.
    """

    shuffle: Shuffle = Shuffle()
    policy: TailPolicy = "pad"

    def __post_init__(self) -> None:
        if not isinstance(self.shuffle, Shuffle):
            raise PlanError(f"shuffle={self.shuffle!r} must be a streamio.data.plan.Shuffle.")
        if self.policy not in POLICIES:
            raise PlanError(f"policy={self.policy!r} is not one of {POLICIES}.")

    def as_json(self) -> dict[str, Any]:
        """The settings as recorded in a resume state's fingerprint."""
        return {"policy": self.policy, "shuffle": self.shuffle.as_json()}
