"""``StreamioTrainer``: the transformers ``Trainer`` with streamio's loader and checkpoints.

The stock ``Trainer`` (transformers 5.x) puts the training dataset into a ``DataLoader`` and
through ``accelerator.prepare``, which shards an ``IterableDataset`` again (rank 0 reads and
dispatches, or every rank takes every n-th batch); it checkpoints into local ``output_dir/checkpoint-N``
folders written by rank 0 (plus one RNG file per rank), and resumes the data by replaying every
batch of the epoch before the saved step (``skip_first_batches``: the time to resume grows with
the step). This subclass changes those three things and nothing else of the loop:

* ``get_train_dataloader`` returns a ``StreamingDataLoader`` over the ``StreamingDataset`` given
  as ``train_dataset`` (the Trainer's collator, ``dataloader_num_workers``, pin memory and
  ``dataloader_drop_last``), not prepared by Accelerate: streamio's own rank and worker sharding
  stands (every sample once per epoch, the same number of batches on every rank); the Trainer
  moves each batch to its device itself (``_prepare_inputs``).
* ``_save_checkpoint`` (every ``save_steps``, on every rank) is one collective
  :meth:`CheckpointManager.save <streamio.checkpoint.CheckpointManager.save>` of the entries of
  :mod:`.state` to ``checkpoint_root``: parts from every rank, the pointer last, nothing pickled;
  ``save_total_limit`` is the root's retention (``KeepLast``; none: ``KeepAll``). Nothing is
  written to ``output_dir``'s ``checkpoint-N`` folders (logs and ``save_model()`` still go there).
* ``preemption=streamio.Preemption()`` (:mod:`.preemption`): a signal to any rank ends with every
  rank saving the same step, then exiting ``Preemption.EXIT_CODE``.
* ``train(resume_from_checkpoint=...)`` (:mod:`.resume`) restores from the root. The Trainer's own
  resume steps are kept, with the root's URL standing in for the checkpoint folder:
  ``_init_training_state`` restores the checkpoint (every part verified before anything is
  loaded) and loads the loader's position, the model and the ``TrainerState``;
  ``_load_optimizer_and_scheduler`` / ``_load_scaler`` load theirs after ``prepare``;
  ``get_resumed_dataloader`` returns the loader as it is (already at the next batch: nothing is
  read or replayed); ``_load_rng_state`` sets every rank's RNG where the stock Trainer does.

Call order, as ``Trainer.train`` drives it: ``train`` -> ``get_train_dataloader`` ->
``_init_training_state`` (restore) -> ``_load_optimizer_and_scheduler``, ``_load_scaler`` ->
per epoch ``get_resumed_dataloader`` (the resumed epoch), ``_load_rng_state`` ->
``_save_checkpoint``... -> ``CheckpointManager.wait`` at the end of ``train``.
The Trainer internals used are those of transformers 5.x (``_inner_training_loop``'s keyword
``resume_from_checkpoint``, ``_init_training_state``, ``_load_callback_state``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from streamio.checkpoint import CheckpointManager, KeepAll, KeepLast, RetentionPolicy, RNGState, SaveOptions
from streamio.data.loader import StreamingDataLoader
from streamio.errors import CheckpointConflictError, CheckpointFormatError, CheckpointNotFoundError, StateMismatchError
from streamio.preemption import Preemption
from streamio.storage import RetryPolicy
from streamio.transformers.arguments import check_arguments
from streamio.transformers.preemption import PreemptionCallback, refuse
from streamio.transformers.requirement import require
from streamio.transformers.resume import Resume, parse_resume
from streamio.transformers.state import Restored, restore_template, save_state

__all__ = ["StreamioTrainer"]

log = logging.getLogger(__name__)

_Trainer: Any = require("transformers").Trainer
_callbacks = require("transformers.trainer_callback")
_utils = require("transformers.trainer_utils")


class StreamioTrainer(_Trainer):  # type: ignore[misc]
    """A ``transformers.Trainer`` whose data and checkpoints go through streamio (see the module docstring).

    Example::

        trainer = StreamioTrainer(model=model, args=TrainingArguments(per_device_train_batch_size=8, save_steps=500),
                                  train_dataset=streamio.StreamingDataset("s3://bucket/train", batch_size=8),
                                  checkpoint_root="s3://bucket/run/ckpt")
        trainer.train(resume_from_checkpoint=True)   # a fresh start when the root holds no checkpoint

    Args:
        *args: the ``Trainer``'s.
        checkpoint_root: where checkpoints go (any fsspec URL); every rank constructs the trainer.
        storage_options: fsspec options for the root (endpoint, credentials); never logged or stored.
        save_options: part size, concurrency, compression of the saves.
        retry: retry policy for transient storage errors of the saves and restores.
        preemption: a ``streamio.Preemption``: a signal to any rank makes every rank save the same step,
            then exit ``Preemption.EXIT_CODE`` when ``train()`` has stopped (:mod:`.preemption`).
        **kwargs: the ``Trainer``'s; ``train_dataset`` must be a ``StreamingDataset``.

    Raises:
        ConfigError: a ``TrainingArguments`` setting that cannot work here (:mod:`.arguments`);
            ``preemption`` with ``enable_jit_checkpoint``.
    """

    def __init__(self, *args: Any, checkpoint_root: str, storage_options: Mapping[str, Any] | None = None,
                 save_options: SaveOptions | None = None, retry: RetryPolicy | None = None,
                 preemption: Preemption | None = None, **kwargs: Any) -> None:
        if preemption is not None:  # before the Trainer installs its own SIGTERM handler (enable_jit_checkpoint)
            refuse(preemption, kwargs.get("args", args[1] if len(args) > 1 else None))
        super().__init__(*args, **kwargs)
        check_arguments(self.args, self.train_dataset, batch_size=self._train_batch_size,
                        sharded=bool(self.is_deepspeed_enabled or self.is_fsdp_enabled))
        limit = self.args.save_total_limit
        retention: RetentionPolicy = KeepAll() if limit is None else KeepLast(limit)
        self.checkpoints = CheckpointManager(checkpoint_root, retention=retention, storage_options=storage_options,
                                             options=save_options, retry=retry)
        self._rng = RNGState(seed=self.args.seed)
        self._loader: StreamingDataLoader | None = None
        self._epoch_batches = 0
        self._resume: Resume | None = None
        self._restored: Restored | None = None
        self._preemption = None if preemption is None else PreemptionCallback.install(self, preemption)

    @property
    def resumed_step(self) -> int | None:
        """The step the last ``train()`` resumed from (``None``: it started fresh, or has not run)."""
        return None if self._restored is None else self._restored.step

    @property
    def _root(self) -> str:
        return self.checkpoints.store.root_url

    def _ours(self, checkpoint: object) -> bool:
        return self._resume is not None and checkpoint == self._root

    # ------------------------------------------------------------------ entry point
    def train(self, resume_from_checkpoint: str | bool | int | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> Any:
        """``Trainer.train``, resuming from ``checkpoint_root`` (:mod:`.resume` says what each value asks).

        Raises:
            ArgumentError: ``resume_from_checkpoint`` names no checkpoint of ``checkpoint_root``.
            CheckpointConflictError: a fresh start (``None`` / ``False``) on a root that holds checkpoints.
            CheckpointNotFoundError: an explicit step (or the root's URL) names no checkpoint there.
            CheckpointError: no checkpoint verifies, or it does not fit this model, optimizer or
                dataset (``StateMismatchError`` for another dataset or topology).
        """
        self._resume = parse_resume(resume_from_checkpoint, self._root)
        self._restored = None
        if self._resume is None:
            self._refuse_earlier_run()
        try:
            output = super().train(resume_from_checkpoint=None, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval,
                                   **kwargs)
        finally:
            self._resume = None
        self.checkpoints.wait()  # the last save committed (or its error raised) before train() returns
        if self._preemption is not None:
            self._preemption.leave(self.checkpoints)  # stopped by a preemption: every rank exits, after the save
        return output

    def _refuse_earlier_run(self) -> None:
        """A fresh start on a root that holds another run's checkpoints is refused before training."""
        step = self.checkpoints.latest_step()
        if step is not None:
            raise CheckpointConflictError(
                f"checkpoint_root {self._root} holds step {step} of an earlier run and train() was asked to "
                f"start fresh: pass resume_from_checkpoint=True to continue that run, or give this run a "
                f"checkpoint_root of its own"
            )

    def _inner_training_loop(self, *args: Any, **kwargs: Any) -> Any:
        if self._resume is not None:  # the root stands in for the checkpoint folder in the Trainer's resume steps
            kwargs["resume_from_checkpoint"] = self._root
        return super()._inner_training_loop(*args, **kwargs)

    # ------------------------------------------------------------------ data
    def get_train_dataloader(self) -> StreamingDataLoader:
        """A ``StreamingDataLoader`` over ``train_dataset``, left alone by Accelerate (see the module docstring)."""
        a = self.args
        extra = {} if a.dataloader_prefetch_factor is None else {"prefetch_factor": a.dataloader_prefetch_factor}
        if a.dataloader_multiprocessing_context is not None:
            extra["multiprocessing_context"] = a.dataloader_multiprocessing_context
        if self._preemption is not None:  # workers leave the signals to their rank
            extra["worker_init_fn"] = self._preemption.stop.worker_init_fn
        collate = self._get_collator_with_removed_columns(self.data_collator, description="training")
        self._loader = StreamingDataLoader(self.train_dataset, collate_fn=collate, num_workers=a.dataloader_num_workers,
                                           pin_memory=a.dataloader_pin_memory, drop_last=a.dataloader_drop_last,
                                           **extra)
        self._epoch_batches = len(self._loader)  # the whole epoch: a restored position shortens len() to its rest
        return self._loader

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        """The loader itself when it was restored (at the next batch already); else the stock replay."""
        if self._restored is not None and dataloader is self._loader:
            return dataloader
        return super().get_resumed_dataloader(dataloader, num_batches)

    # ------------------------------------------------------------------ save
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """One collective save of the whole training state as step ``global_step`` (see :mod:`.state`)."""
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        for cb in [*self.callback_handler.callbacks, self.control]:  # what the stock save records of callbacks
            if isinstance(cb, _callbacks.ExportableState):
                name, saved = cb.__class__.__name__, cb.state()
                if isinstance(self.state.stateful_callbacks.get(name), list):
                    self.state.stateful_callbacks[name].append(saved)
                else:
                    self.state.stateful_callbacks[name] = saved
        state = save_state(model=self.model, optimizer=self.optimizer, scheduler=self.lr_scheduler,
                           scaler=self.accelerator.scaler, trainer_state=self.state, rng=self._rng, loader=self._loader)
        self.checkpoints.save(self.state.global_step, state)

    # ------------------------------------------------------------------ resume
    def _init_training_state(self, max_steps: int, num_update_steps_per_epoch: int, num_train_epochs: int,
                             resume_from_checkpoint: Any, trial: Any) -> tuple[int, int]:
        if not self._ours(resume_from_checkpoint):
            return super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs,
                                                resume_from_checkpoint, trial)
        fresh = super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs, None, trial)
        restored = self._restore()
        if restored is None:
            return fresh
        step = restored.trainer_state.get("global_step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointFormatError(
                f"{self._root} step {restored.step} holds a TrainerState with global_step={step!r}: resume with the "
                f"StreamioTrainer that saved it"
            )
        epochs = step // num_update_steps_per_epoch
        batches = step % num_update_steps_per_epoch * self.args.gradient_accumulation_steps
        self._check_position(restored.step, batches)  # before the model changes
        restored.load_model(self.model, self._root)
        try:
            self.state = _callbacks.TrainerState(**restored.trainer_state)
        except TypeError as exc:
            raise CheckpointFormatError(
                f"{self._root} step {restored.step} holds a TrainerState this transformers cannot read ({exc}): "
                f"resume with the transformers version that saved it"
            ) from exc
        _utils.compare_trainer_and_checkpoint_args(self.args, self.state)
        self._load_callback_state()
        self.state.init_training_references(self, max_steps, num_train_epochs, trial)
        self._restored = restored
        log.info("resumed from %s step %d (the data at its next batch, nothing replayed)", self._root, restored.step)
        return epochs, batches

    def _restore(self) -> Restored | None:
        request = self._resume
        if request is None:
            return None
        values = restore_template()
        try:
            step = self.checkpoints.restore(values, step=request.step)
        except CheckpointNotFoundError as exc:
            if request.required:
                raise CheckpointNotFoundError(
                    f"train(resume_from_checkpoint=...) found nothing to resume in {self._root} ({exc}); pass True to "
                    f"start fresh when the root holds no checkpoint"
                ) from exc
            log.info("%s holds no checkpoint: training starts fresh", self._root)
            return None
        restored = Restored.of(step, values, self._root)
        restored.load_data(self._loader, self._root)  # first: a checkpoint of other data changes nothing
        return restored

    def _check_position(self, step: int, batches: int) -> None:
        """The loader's restored position must leave the rest of the epoch the Trainer's step leaves."""
        rest = len(self._loader) if self._loader is not None else 0
        if rest != self._epoch_batches - batches:
            raise StateMismatchError(
                f"{self._root} step {step}: the saved data position leaves {rest} of this rank's "
                f"{self._epoch_batches} batches of the epoch, the Trainer's step leaves "
                f"{self._epoch_batches - batches}: resume with the same number of processes, "
                f"per_device_train_batch_size and gradient_accumulation_steps as the run that saved it"
            )

    def _load_optimizer_and_scheduler(self, checkpoint: Any) -> None:
        if not self._ours(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)
        if self._restored is not None:
            self._restored.load_into("optimizer", self.optimizer, self._root)
            self._restored.load_into("scheduler", self.lr_scheduler, self._root)
        return None

    def _load_scaler(self, checkpoint: Any) -> None:
        if not self._ours(checkpoint):
            return super()._load_scaler(checkpoint)
        if self._restored is not None:
            self._restored.load_into("scaler", self.accelerator.scaler, self._root)
        return None

    def _load_rng_state(self, checkpoint: Any) -> None:
        if not self._ours(checkpoint):
            return super()._load_rng_state(checkpoint)
        if self._restored is not None:
            self._rng.load_state_dict(self._restored.rng)
        return None
