"""What a :class:`~.trainer.StreamioTrainer` checkpoint holds, by name, and how it is read back.

One save of the trainer is one :class:`~streamio.checkpoint.CheckpointManager` save of these
entries (every rank takes part; docs/design.md "Checkpoints"):

* ``model``: the unwrapped model's ``state_dict`` (replicated: divided among ranks for upload);
* ``optimizer``, ``scheduler``, ``scaler``: their ``state_dict`` (``scaler`` is ``None`` without
  mixed precision);
* ``trainer``: the ``TrainerState`` as JSON data (``dataclasses.asdict``, what the stock
  ``trainer_state.json`` holds: step, epoch, log history, stateful callbacks), never a pickle;
* ``rng``: every RNG of each rank (:class:`~streamio.checkpoint.RNGState`, saved per rank);
* ``data``: the ``StreamingDataLoader``'s exact position (saved per rank; the same on each).

Restoring loads the model and the loader's position at once and hands back the rest as plain
values (:class:`Restored`): the optimizer and scheduler exist only after the Trainer's
``accelerator.prepare``, and the RNG must be set right before the next batch, where the stock
Trainer sets it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamio.errors import CheckpointError, CheckpointFormatError
from streamio.state_version import check_version

__all__ = ["ENTRIES", "Restored", "restore_template", "save_state", "trainer_state_value"]

MODEL, OPTIMIZER, SCHEDULER, SCALER, TRAINER, RNG, DATA = (
    "model", "optimizer", "scheduler", "scaler", "trainer", "rng", "data")
ENTRIES = (MODEL, OPTIMIZER, SCHEDULER, SCALER, TRAINER, RNG, DATA)
"""Every name a trainer checkpoint saves (``rng`` and ``data`` per rank: ``SaveOptions.per_rank``)."""

_TRAINER_VERSION = 1


def trainer_state_value(state: Any) -> dict[str, Any]:
    """The ``TrainerState`` as the versioned JSON value saved under ``trainer``."""
    return {"version": _TRAINER_VERSION, "trainer_state": dataclasses.asdict(state)}


def save_state(*, model: Any, optimizer: Any, scheduler: Any, scaler: Any, trainer_state: Any, rng: Any,
               loader: Any) -> dict[str, Any]:
    """The dict one save commits (see the module docstring)."""
    return {MODEL: model, OPTIMIZER: optimizer, SCHEDULER: scheduler, SCALER: scaler,
            TRAINER: trainer_state_value(trainer_state), RNG: rng, DATA: loader}


def restore_template(*, model: Any, loader: Any) -> dict[str, Any]:
    """What a restore loads into: the model and the loader in place, placeholders for the rest."""
    return {name: None for name in ENTRIES} | {MODEL: model, DATA: loader}


@dataclass(frozen=True)
class Restored:
    """The entries of a restored checkpoint that are loaded later than the restore."""

    step: int
    optimizer: Mapping[str, Any]
    scheduler: Mapping[str, Any] | None
    scaler: Mapping[str, Any] | None
    trainer_state: dict[str, Any]
    rng: Mapping[str, Any]

    @classmethod
    def of(cls, step: int, values: Mapping[str, Any], where: str) -> Restored:
        """The restored ``values`` of step ``step`` of the root ``where``, checked.

        Raises:
            CheckpointFormatError: the trainer entry has another version, or an entry is not what a
                StreamioTrainer saves.
        """
        fix = "resume with the StreamioTrainer (and streamio version) that saved it"
        trainer = check_version(values[TRAINER], _TRAINER_VERSION, what=f"trainer state of {where} step {step}",
                                error=CheckpointFormatError, fix=fix)
        shapes = {OPTIMIZER: Mapping, RNG: Mapping, SCHEDULER: (Mapping, type(None)), SCALER: (Mapping, type(None))}
        for name, kind in shapes.items():
            if not isinstance(values[name], kind):
                raise CheckpointFormatError(
                    f"{where} step {step} holds {type(values[name]).__name__} under {name!r}, not the state_dict a "
                    f"StreamioTrainer saves: {fix}"
                )
        if not isinstance(trainer.get("trainer_state"), dict):
            raise CheckpointFormatError(f"{where} step {step} holds no TrainerState under {TRAINER!r}: {fix}")
        return cls(step, values[OPTIMIZER], values[SCHEDULER], values[SCALER], trainer["trainer_state"], values[RNG])

    def load_into(self, name: str, obj: Any, where: str) -> None:
        """``obj.load_state_dict`` of this checkpoint's ``name`` entry, its refusal named.

        Raises:
            CheckpointError: ``obj`` does not take the saved state (another optimizer, its groups).
        """
        saved = getattr(self, name)
        if saved is None or obj is None:
            if (saved is None) != (obj is None):
                raise CheckpointError(
                    f"{where} step {self.step} {'has no' if saved is None else 'has a'} {name!r} state but this "
                    f"trainer {'has one' if saved is None else 'has none'}: resume with the same TrainingArguments "
                    f"(fp16/bf16, optimizer, scheduler) as the run that saved it"
                )
            return
        try:
            obj.load_state_dict(saved)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(
                f"{where} step {self.step}: the saved {name!r} state does not fit this trainer's {type(obj).__name__} "
                f"({exc}); resume with the same model, optimizer and TrainingArguments as the run that saved it"
            ) from exc
