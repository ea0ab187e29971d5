"""What the trainer keeps in its checkpoints besides the model, and what saves them.

Everything that decides the next loss is training state: a run resumed from a checkpoint must
reproduce the uninterrupted run, so beside the model, optimizer, scheduler, RNG streams and data
position (:meth:`streamio.train.loop.Trainer.state`) every checkpoint holds the trainer's own
stateful objects, each with a JSON-safe, versioned ``state_dict()``:

* :class:`Progress`: the epoch, step and step within the epoch, and whether training is done;
* :class:`EarlyStopping`: the patience counter and the best value, so a resumed run stops at
  exactly the epoch the uninterrupted run stops at. Epochs are numbered from 0. With
  ``patience=5``, validation losses ``10, 8, 6, 6.5, 6.5, ...`` stop after epoch 7: epoch 2 holds
  the best value and epochs 3..7 are five epochs without improvement.

The trainer talks to a :class:`Checkpointer`, the protocol of :class:`streamio.checkpoint.CheckpointManager`
(:func:`make_checkpointer`): ``save(step, state, metrics=)`` (asynchronous: returns once the state
is snapshotted to host memory), ``restore(state, *, step=None) -> step`` (raises
:class:`~streamio.errors.CheckpointNotFoundError` when there is none), ``wait()``, ``close()``.
``state`` maps names to stateful objects (``state_dict`` / ``load_state_dict``).

Naming matters under DDP: the manager saves the entries named ``"rng"`` and ``"data"`` once per rank
(each rank has its own RNG streams and data position) and divides everything else (model,
optimizer, scheduler, progress, early stopping: identical on every rank) among the ranks for upload.

Retention is ``KeepLast(keep_last) | KeepBest("val_loss", k=keep_best)``: the trainer attaches
``val_loss`` only to checkpoints taken right after a validation of exactly those weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

from streamio.checkpoint import CheckpointManager, KeepBest, KeepLast, LocalTier, RetentionPolicy, SaveOptions
from streamio.errors import CheckpointFormatError, ConfigError
from streamio.state_version import check_version

_EARLY_STOPPING_VERSION = 1


@dataclass
class Progress:
    """Counters that say where training is; saved in every checkpoint."""

    epoch: int = 0
    step: int = 0
    epoch_step: int = 0
    done: bool = False

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, **asdict(self)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        check_version(state, 1, what="progress state", error=CheckpointFormatError,
                      fix="resume with the trainer that saved it")
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.epoch_step, self.done = int(state["epoch_step"]), bool(state["done"])


class EarlyStopping:
    """Counts epochs without improvement of a metric and says when to stop.

    Args:
        patience: epochs without improvement that end training (0 disables stopping).
        mode: ``"min"`` (losses) or ``"max"`` (accuracies).
        min_delta: the least change in the right direction that counts as an improvement.
    """

    def __init__(self, patience: int, *, mode: Literal["min", "max"] = "min", min_delta: float = 0.0) -> None:
        if mode not in ("min", "max"):
            raise ConfigError(f"mode must be 'min' or 'max', not {mode!r}")
        self.patience = patience
        self.mode = mode
        self.min_delta = min_delta
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.counter = 0
        self.last: float | None = None
        self.stopped_epoch: int | None = None

    def improves(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by at least ``min_delta``."""
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def update(self, epoch: int, value: float) -> bool:
        """Record epoch ``epoch``'s metric; return True when training should stop now."""
        self.last = value
        if self.improves(value):
            self.best, self.best_epoch, self.counter = value, epoch, 0
        else:
            self.counter += 1
        if self.patience > 0 and self.counter >= self.patience:
            self.stopped_epoch = epoch
        return self.should_stop

    @property
    def should_stop(self) -> bool:
        """True once patience ran out (also right after restoring a stopped run)."""
        return self.stopped_epoch is not None

    def state_dict(self) -> dict[str, Any]:
        """Best value, its epoch, the patience counter, the last value and the stop epoch (JSON-safe)."""
        return {
            "version": _EARLY_STOPPING_VERSION,
            "mode": self.mode,
            "best": self.best,
            "best_epoch": self.best_epoch,
            "counter": self.counter,
            "last": self.last,
            "stopped_epoch": self.stopped_epoch,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises:
            CheckpointFormatError: unknown version, or the state was saved for the other mode.
        """
        fix = "resume with the same trainer configuration that saved it"
        check_version(
            state, _EARLY_STOPPING_VERSION, what="early-stopping state", error=CheckpointFormatError, fix=fix
        )
        if state.get("mode") != self.mode:
            raise CheckpointFormatError(
                f"early-stopping state was saved in mode {state.get('mode')!r}, this trainer runs in mode "
                f"{self.mode!r}: {fix}"
            )
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.counter, self.last, self.stopped_epoch = int(state["counter"]), state["last"], state["stopped_epoch"]

    def __repr__(self) -> str:
        return f"EarlyStopping(patience={self.patience}, best={self.best}, counter={self.counter})"


class Checkpointer(Protocol):
    """What the trainer needs from a checkpoint manager (see the module docstring)."""

    def save(self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, Any] | None = None,
             durable: bool | Literal["local"] | None = None) -> Any: ...
    def restore(self, state: Any, *, step: int | None = None) -> int: ...
    def wait(self) -> Any: ...
    def close(self, *, timeout_s: float | None = None) -> None: ...


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
    local_dir: str | None = None,
    durable_every: int = 1,
) -> Checkpointer | None:
    """An asynchronous :class:`~streamio.checkpoint.CheckpointManager` on ``root_url`` (``None``: off),
    with a :class:`~streamio.checkpoint.LocalTier` at ``local_dir`` whose every ``durable_every``-th
    save is uploaded to the root.

    Under ``torch.distributed`` every rank must call this (the manager makes a process group).
    """
    if root_url is None:
        return None
    return CheckpointManager(
        root_url,
        retention=retention_policy(keep_last, keep_best),
        async_save=True,
        storage_options=storage_options,
        local=None if local_dir is None else LocalTier(local_dir),
        options=SaveOptions(durable_every=durable_every),
    )
