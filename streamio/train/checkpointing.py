"""How the trainer saves and restores: :func:`make_checkpointer`.

The trainer talks to a :class:`Checkpointer`, the protocol of :class:`streamio.checkpoint.CheckpointManager`:
``save(step, state, metrics=)`` (asynchronous: returns once the state is snapshotted to host memory),
``restore(state, *, step=None) -> step`` (raises :class:`~streamio.errors.CheckpointNotFoundError` when
there is none), ``wait()``, ``close()``. ``state`` maps names to stateful objects
(``state_dict`` / ``load_state_dict``).

Naming matters under DDP: the manager saves the entries named ``"rng"`` and ``"data"`` once per rank
(each rank has its own RNG streams and data position) and divides everything else (model,
optimizer, scheduler, progress, early stopping: identical on every rank) among the ranks for upload.

Retention is ``KeepLast(keep_last) | KeepBest("val_loss", k=keep_best)``: the trainer attaches
``val_loss`` only to checkpoints taken right after a validation of exactly those weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from streamio.checkpoint import CheckpointManager, KeepBest, KeepLast, RetentionPolicy


class Checkpointer(Protocol):
    """What the trainer needs from a checkpoint manager (see the module docstring)."""

    def save(self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, Any] | None = None) -> Any: ...
    def restore(self, state: Any, *, step: int | None = None) -> int: ...
    def wait(self) -> Any: ...
    def close(self) -> None: ...


def retention_policy(keep_last: int, keep_best: int) -> RetentionPolicy:
    """``KeepLast(keep_last)``, plus ``KeepBest("val_loss", "min", keep_best)`` when ``keep_best > 0``."""
    policy: RetentionPolicy = KeepLast(max(1, keep_last))
    if keep_best > 0:
        policy = policy | KeepBest("val_loss", mode="min", k=keep_best)
    return policy


def make_checkpointer(
    root_url: str | None,
    *,
    keep_last: int,
    keep_best: int,
    storage_options: Mapping[str, Any] | None = None,
) -> Checkpointer | None:
    """An asynchronous :class:`~streamio.checkpoint.CheckpointManager` on ``root_url`` (``None``: off).

    Under ``torch.distributed`` every rank must call this (the manager makes a process group).
    """
    if root_url is None:
        return None
    return CheckpointManager(
        root_url,
        retention=retention_policy(keep_last, keep_best),
        async_save=True,
        storage_options=storage_options,
    )
