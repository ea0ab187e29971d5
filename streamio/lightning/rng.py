"""Every rank's RNG streams in Lightning's checkpoint, which rank 0 alone writes.

Lightning builds the checkpoint dict on every rank but writes rank 0's, so a rank's own state (its
dropout and sampling streams: torch, Python ``random``, NumPy's global RNG, CUDA) is lost, and a
resumed rank 1 would draw rank 0's numbers. ``ModelCheckpoint.on_save_checkpoint`` runs on every
rank while the dict is built: :func:`gather_rng` all-gathers each rank's
:class:`~streamio.checkpoint.rng.RNGState` there (a few KB per rank, the job's process group) and
puts the list, indexed by rank, under :data:`KEY`. On load, :class:`PendingRNG` keeps the list and
applies this rank's entry when the first batch after the resume starts: later than Lightning's
restore, because building the training loader's iterator draws from torch's RNG (its base seed),
which the uninterrupted run did at the epoch's start, before the checkpoint. On another number of
ranks no saved stream belongs to a rank: every rank is re-seeded by ``RNGState``'s documented rule
(``SeedSequence([seed, reseeds, world_size, rank])``, with a warning), reproducible but not
bit-identical. ``seed`` is Lightning's ``seed_everything`` seed (``PL_GLOBAL_SEED``), else 0.

Not covered: numbers drawn in the training process while a batch is *loaded* (augmentations of a
``DataLoader`` with ``num_workers=0``): the resumed run loads its first batches before the restore.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from streamio.checkpoint.rng import RNGState
from streamio.errors import CheckpointFormatError

__all__ = ["KEY", "MAX_RANKS", "PendingRNG", "gather_rng"]

KEY = "streamio_rng"
"""Where the checkpoint dict holds the list of every rank's RNG state (index = global rank)."""

MAX_RANKS = 1 << 20
"""More RNG states than this in a checkpoint is a damaged or forged claim, not a job."""


def _rng_state(rank: int, world: int) -> RNGState:
    return RNGState(seed=int(os.environ.get("PL_GLOBAL_SEED", "0") or 0), rank=rank, world_size=world)


def gather_rng(checkpoint: dict[str, Any], *, rank: int, world: int) -> None:
    """Put every rank's RNG state into ``checkpoint`` (collective when ``world`` > 1: every rank calls it)."""
    mine = _rng_state(rank, world).state_dict()
    if world > 1 and dist.is_available() and dist.is_initialized():
        states: list[Any] = [None] * world
        dist.all_gather_object(states, mine)
    else:
        states = [mine]
    checkpoint[KEY] = states


class PendingRNG:
    """The RNG states a checkpoint brought, applied to this rank when training starts (module docstring)."""

    def __init__(self) -> None:
        self._states: list[Mapping[str, Any]] | None = None

    def loaded(self, checkpoint: Mapping[str, Any]) -> None:
        """Keep the states of ``checkpoint`` (none in a checkpoint written without this callback).

        Raises:
            CheckpointFormatError: :data:`KEY` holds something else than a list of state dicts.
        """
        states = checkpoint.get(KEY)
        if states is None:
            self._states = None
            return
        if not isinstance(states, list) or not 0 < len(states) <= MAX_RANKS or not all(
                isinstance(s, Mapping) for s in states):
            what = f"a list of {len(states)}" if isinstance(states, list) else f"a {type(states).__name__}"
            raise CheckpointFormatError(
                f"the checkpoint's {KEY!r} holds {what}, not a list of 1 to {MAX_RANKS} RNG state dicts (one per "
                f"rank): it was not written by streamio.lightning.ModelCheckpoint; remove that entry or resume "
                f"from another checkpoint"
            )
        self._states = states

    def apply(self, *, rank: int, world: int) -> None:
        """Restore this rank's streams (once; nothing if none are pending).

        Raises:
            CheckpointFormatError: a state of an unknown version, or not an ``RNGState``'s.
        """
        states, self._states = self._states, None
        if states is None:
            return
        saved = states[rank] if len(states) == world else states[0]  # another world: RNGState re-seeds
        try:
            _rng_state(rank, world).load_state_dict(saved)
        except CheckpointFormatError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointFormatError(
                f"the checkpoint's {KEY!r} entry for rank {rank} is not an RNG state ({type(exc).__name__}: {exc}): "
                f"resume from a checkpoint written by streamio.lightning.ModelCheckpoint"
            ) from exc
