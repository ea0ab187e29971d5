"""``StreamioTrainer(preemption=...)``: a termination notice to any rank ends in one save of one step, then exit 143.

The transformers ``Trainer`` stops through its callbacks' ``TrainerControl``: a callback that sets
``should_save`` and ``should_training_stop`` in ``on_step_end`` makes the loop save (here: the
collective :meth:`StreamioTrainer._save_checkpoint <streamio.transformers.StreamioTrainer>`, every
rank) and leave ``train()``. :class:`PreemptionCallback` does that at the step the ranks agree on
(:meth:`streamio.Preemption.requested` with the ``global_step``, every rank, at every optimizer
step), so every rank saves the same step; ``StreamioTrainer.train`` then waits for the save
(``CheckpointManager.close``) and leaves through :meth:`streamio.Preemption.exit` (every rank
waits for the others, then exits ``Preemption.EXIT_CODE``).

transformers' own answer to ``SIGTERM``, ``TrainingArguments(enable_jit_checkpoint=True)``, sets
a flag per process 3 s after the signal and saves on the rank that got it: with a collective save,
a signal to one rank leaves that rank alone in the save's collectives. It installs its handler when
the Trainer is made, over the one ``Preemption`` installed before, so the two are refused together.
"""

from __future__ import annotations

from typing import Any

from streamio.checkpoint import CheckpointManager
from streamio.errors import ConfigError
from streamio.preemption import Preemption
from streamio.transformers.requirement import require

__all__ = ["PreemptionCallback", "refuse"]

_TrainerCallback: Any = require("transformers").TrainerCallback


class PreemptionCallback(_TrainerCallback):  # type: ignore[misc]
    """Asks ``stop.requested(global_step)`` at every step's end; at the agreed step, save and stop training.

    ``StreamioTrainer(preemption=stop)`` installs it (:meth:`install`); ``step`` is the step it stopped at.
    """

    def __init__(self, stop: Preemption) -> None:
        self.stop = stop
        self.step: int | None = None

    @classmethod
    def install(cls, trainer: Any, stop: Preemption) -> PreemptionCallback:
        """Add a callback over ``stop`` to ``trainer`` (:func:`refuse` has been called before the Trainer was made)."""
        callback = cls(stop)
        trainer.add_callback(callback)
        return callback

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.step is None and self.stop.requested(state.global_step):  # every rank, the same steps
            self.step = state.global_step
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.step is not None:
            control.should_save = False  # saved at this step already (an epoch-end save would repeat it)
        return control

    def leave(self, checkpoints: CheckpointManager) -> None:
        """After ``train()`` stopped here: the save durable (``close``), then every rank exits 143 together."""
        if self.step is None:
            return
        checkpoints.close()
        self.stop.exit()


def refuse(stop: object, args: Any) -> None:
    """Refuse, before the Trainer is made (it installs the JIT handler), what cannot work with ``stop``.

    Raises:
        ConfigError: ``stop`` is not a ``streamio.Preemption``, or ``args`` has ``enable_jit_checkpoint`` on.
    """
    if not isinstance(stop, Preemption):
        raise ConfigError(
            f"preemption={stop!r} must be a streamio.Preemption (e.g. preemption=streamio.Preemption()), "
            f"made in the main thread before the trainer"
        )
    if getattr(args, "enable_jit_checkpoint", False):
        raise ConfigError(
            "StreamioTrainer(preemption=...) with TrainingArguments(enable_jit_checkpoint=True): both take "
            "SIGTERM, and the JIT checkpoint saves on the signalled rank alone; give enable_jit_checkpoint=False"
        )
