"""``ShardedModelState``: a model and its optimizers as one state entry, through torch DCP's helpers.

FSDP2 and tensor-parallel models keep their parameters and optimizer moments as DTensors. torch
DCP's ``get_state_dict`` / ``set_state_dict`` are the supported way to take and load such state:
they key the optimizer state by parameter name (not by position, which differs between a
sharded and a plain model), strip wrapper prefixes (DDP, ``torch.compile``, activation
checkpointing), and initialise an optimizer's empty state before loading into it (a fresh
``opt.state_dict()`` has none: DCP's own ``load`` silently leaves it empty then). This object
wraps them behind ``state_dict`` / ``load_state_dict`` so that ``CheckpointManager.save`` and
``restore`` take it like any other state entry::

    state = {"app": ShardedModelState(model, opt), "rng": RNGState(), "data": loader}
    manager.restore(state)          # any mesh: a checkpoint of 4 ranks onto 2, FSDP onto plain
    manager.save(step, state)

The same object works for a plain (unsharded) model, so a checkpoint moves between FSDP2 and a
single-process model both ways with the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from streamio.errors import CheckpointError
from streamio.state_version import check_version

__all__ = ["ShardedModelState"]

VERSION = 1


class ShardedModelState:
    """A model and its optimizers, saved and loaded through DCP's ``get_state_dict`` / ``set_state_dict``.

    Args:
        model: the module (FSDP2 ``fully_shard``-ed, tensor-parallel, DDP, or plain).
        optimizers: its optimizers (one or several; none for a model alone).

    The state is ``{"version": 1, "model": ..., "optim": ...}`` with DCP's keys (parameter names).
    """

    def __init__(
        self, model: torch.nn.Module, optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] = ()
    ) -> None:
        self.model = model
        self.optimizers = (optimizers,) if isinstance(optimizers, torch.optim.Optimizer) else tuple(optimizers)

    def __repr__(self) -> str:
        return f"ShardedModelState({type(self.model).__name__}, {len(self.optimizers)} optimizer(s))"

    def state_dict(self) -> dict[str, Any]:
        """The model's and optimizers' state (DTensors stay sharded: nothing is gathered)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.model, self.optimizers)
        return {"version": VERSION, "model": model, "optim": optim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned (after restore filled it in place)."""
        from torch.distributed.checkpoint.state_dict import set_state_dict

        check_version(state, VERSION, what="ShardedModelState state", error=CheckpointError)
        set_state_dict(self.model, self.optimizers, model_state_dict=state["model"],
                       optim_state_dict=state["optim"] if self.optimizers else {})
