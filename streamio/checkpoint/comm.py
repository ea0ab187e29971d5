"""The collectives the commit protocol and the restore walk need, on a dedicated gloo group.

Saving and restoring are collective: ranks agree on a save id, on whether every rank's parts
are in the store (the barrier), and on the outcome of each restore attempt. These run in the
manager's background thread while the training loop runs its own collectives (NCCL or gloo) on
the default group, so they go through a separate gloo group and never interleave with those.
Without an initialised process group everything is a single process: rank 0 of 1, and every
collective returns this rank's own value.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from streamio.distributed import group_initialized, rank_and_world

__all__ = ["Comm"]


class Comm:
    """This rank's place in the job and the two object collectives, on a gloo group of their own.

    Attributes:
        active: a default process group exists (else a single process, rank 0 of 1).
        rank: this process's rank.
        world: the number of ranks.
    """

    def __init__(self) -> None:
        self.active = group_initialized()
        # torchrun's RANK/WORLD_SIZE alone do not make this a rank of a job: without a group
        # there are no collectives, so the process saves and restores on its own.
        self.rank, self.world = rank_and_world() if self.active else (0, 1)
        self._group = dist.new_group(backend="gloo") if self.active and self.world > 1 else None

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, index = rank (picklable values the library built itself)."""
        if self._group is None:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self._group is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]
