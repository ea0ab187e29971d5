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

__all__ = ["POLICIES", "Sampling", "Shuffle", "TailPolicy", "Topology", "check_int"]

TailPolicy = Literal["drop", "pad"]
"""What happens to the samples that do not divide evenly across ranks (see :mod:`streamio.data.plan`)."""

POLICIES: tuple[str, ...] = ("drop", "pad")


def check_int(name: str, value: object, low: int) -> int:
    """``value`` as an int, or a :class:`PlanError` naming ``name`` when it is no int ``>= low``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or int(value) < low:
        raise PlanError(f"{name}={value!r} must be an int >= {low}.")
    return int(value)


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

    def as_json(self) -> dict[str, Any]:
        """The settings as recorded in a resume state's fingerprint."""
        return {"shards": bool(self.shards), "window": int(self.window)}


@dataclass(frozen=True)
class Topology:
    """Who reads an epoch: ranks, DataLoader workers per rank, and the DataLoader's batch size.

    Attributes:
        world_size: number of ranks (int >= 1).
        num_workers: DataLoader workers per rank (int >= 0; 0 = load in the main process, which
            reads the same single stream as 1 worker).
        batch_size: the DataLoader's batch size (int >= 1); worker streams are cut in whole batches
            so that resume positions are exact (1 when batching happens elsewhere).

    Raises:
        PlanError: a field is not an int in its range (numpy ints are accepted and stored as int).
    """

    world_size: int
    num_workers: int = 0
    batch_size: int = 1

    def __post_init__(self) -> None:
        # stored as plain ints: they go into JSON resume states
        object.__setattr__(self, "world_size", check_int("world_size", self.world_size, 1))
        object.__setattr__(self, "num_workers", check_int("num_workers", self.num_workers, 0))
        object.__setattr__(self, "batch_size", check_int("batch_size", self.batch_size, 1))

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
