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

A restore reads and verifies every part of the save before it returns (the manager's all or
nothing), and hands every entry back as a plain value (:class:`Restored`); the trainer then loads
them in an order that changes nothing when the checkpoint does not fit: the loader's position
first (a checkpoint of another dataset, seed or shuffle is refused with the loader as it was),
then the model after its keys, shapes and dtypes are checked against the live one; the optimizer
and scheduler after the Trainer's ``accelerator.prepare`` made them; the RNG right before the
next batch, where the stock Trainer sets it. The cost: the model's tensors are held once more
while they are copied in (as the stock Trainer holds the ``state_dict`` it reads from a file).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from streamio.errors import CheckpointError, CheckpointFormatError, PlanError
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


def restore_template() -> dict[str, Any]:
    """What a restore loads into: a placeholder per entry, each replaced by the saved value."""
    return dict.fromkeys(ENTRIES)


@dataclass(frozen=True)
class Restored:
    """The entries of a restored checkpoint that are loaded later than the restore."""

    step: int
    model: Mapping[str, Any]
    data: Mapping[str, Any]
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
        optional = (Mapping, type(None))
        shapes = {MODEL: Mapping, DATA: Mapping, OPTIMIZER: Mapping, RNG: Mapping, SCHEDULER: optional,
                  SCALER: optional}
        for name, kind in shapes.items():
            if not isinstance(values[name], kind):
                raise CheckpointFormatError(
                    f"{where} step {step} holds {type(values[name]).__name__} under {name!r}, not the state_dict a "
                    f"StreamioTrainer saves: {fix}"
                )
        if not isinstance(trainer.get("trainer_state"), dict):
            raise CheckpointFormatError(f"{where} step {step} holds no TrainerState under {TRAINER!r}: {fix}")
        return cls(step, values[MODEL], values[DATA], values[OPTIMIZER], values[SCHEDULER], values[SCALER],
                   trainer["trainer_state"], values[RNG])

    def load_data(self, loader: Any, where: str) -> None:
        """The loader's saved position into ``loader`` (left as it was when the state is not its own).

        Raises:
            StateMismatchError: a position of another dataset, seed, policy or shuffle.
            PlanError: a malformed position.
        """
        try:
            loader.load_state_dict(self.data)
        except PlanError as exc:
            raise type(exc)(f"{where} step {self.step} holds the position of other data: {exc}") from exc

    def load_model(self, model: Any, where: str) -> None:
        """The saved weights into ``model``, after every key, shape and dtype is checked.

        Raises:
            CheckpointError: the checkpoint is of another model (the model is left as it was).
        """
        live = model.state_dict()
        problems = [f"missing {k!r}" for k in live if k not in self.model]
        problems += [f"unexpected {k!r}" for k in self.model if k not in live]
        problems += [f"{k!r} is {tuple(v.shape)} {v.dtype}, saved {tuple(self.model[k].shape)} {self.model[k].dtype}"
                     for k, v in live.items() if k in self.model and _spec(self.model[k]) != _spec(v)]
        if problems:
            raise CheckpointError(
                f"{where} step {self.step} holds another model ({len(problems)} differences: "
                f"{'; '.join(problems[:4])}): resume with the model the run that saved it trained, or use another "
                f"checkpoint_root"
            )
        model.load_state_dict(self.model)

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


def _spec(tensor: Any) -> tuple[Any, ...]:
    return (tuple(getattr(tensor, "shape", ())), getattr(tensor, "dtype", type(tensor)))
