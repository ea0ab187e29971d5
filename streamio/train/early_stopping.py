"""Early stopping on a validation metric, as a stateful object saved in every checkpoint.

The patience counter and the best value are training state like the weights: a run resumed from a
checkpoint must stop at exactly the epoch the uninterrupted run stops at, so both live in
``state_dict()`` (JSON-safe, versioned) and the trainer saves this object with the model.

Epochs are numbered from 0. With ``patience=5``, validation losses ``10, 8, 6, 6.5, 6.5, ...`` stop
after epoch 7: epoch 2 holds the best value and epochs 3..7 are five epochs without improvement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from streamio.errors import CheckpointFormatError, ConfigError
from streamio.state_version import check_version

_VERSION = 1


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
            "version": _VERSION,
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
        check_version(state, _VERSION, what="early-stopping state", error=CheckpointFormatError, fix=fix)
        if state.get("mode") != self.mode:
            raise CheckpointFormatError(
                f"early-stopping state was saved in mode {state.get('mode')!r}, this trainer runs in mode "
                f"{self.mode!r}: {fix}"
            )
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.counter, self.last, self.stopped_epoch = int(state["counter"]), state["last"], state["stopped_epoch"]

    def __repr__(self) -> str:
        return f"EarlyStopping(patience={self.patience}, best={self.best}, counter={self.counter})"
