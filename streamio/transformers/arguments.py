"""The ``TrainingArguments`` a :class:`~.trainer.StreamioTrainer` cannot honour, refused at construction.

Each refusal names the argument and what to do instead, so a combination that would silently
lose data, state or checkpoints never starts training:

* the batch size is the dataset's: a ``StreamingDataset`` cuts every rank's and worker's stream in
  whole batches of its own ``batch_size``, so ``per_device_train_batch_size`` must equal it and
  ``auto_find_batch_size`` (which changes it mid-run) cannot apply;
* ``dataloader_persistent_workers``: workers would keep their copy of the dataset across epochs
  (``StreamingDataLoader`` refuses it too);
* ``ignore_data_skip``: resuming costs nothing here, the loader continues at its saved position;
  the stock meaning (restart the epoch's data) would train on batches the saved run already had;
* ``save_only_model``: a checkpoint without optimizer, RNG and data position cannot be resumed;
* ``load_best_model_at_end``, ``push_to_hub``: they read or upload the stock ``checkpoint-N``
  folders of ``output_dir``, which a ``StreamioTrainer`` does not write;
* DeepSpeed and FSDP: their sharded states are saved by their own engines (not built yet).
"""

from __future__ import annotations

from typing import Any

from streamio.data.dataset import StreamingDataset
from streamio.errors import ConfigError

__all__ = ["check_arguments"]

_NOT_WRITTEN = "StreamioTrainer writes its checkpoints to checkpoint_root, not to output_dir's checkpoint-N folders"


def check_arguments(args: Any, dataset: object, *, batch_size: int, sharded: bool) -> None:
    """Refuse what cannot work with streamio's loader and checkpoints (see the module docstring).

    Args:
        args: the ``TrainingArguments``.
        dataset: the ``train_dataset`` given to the trainer.
        batch_size: the trainer's per-process training batch size.
        sharded: DeepSpeed or FSDP is enabled.

    Raises:
        ConfigError: the first argument that cannot be honoured, named with its fix.
    """
    if not isinstance(dataset, StreamingDataset):
        raise ConfigError(
            f"StreamioTrainer needs train_dataset=streamio.StreamingDataset(...), got {type(dataset).__name__}: "
            f"use the stock transformers.Trainer for other datasets"
        )
    if batch_size != dataset.batch_size:
        raise ConfigError(
            f"per_device_train_batch_size={batch_size} differs from the batch_size={dataset.batch_size} of "
            f"{dataset!r}, which cuts every rank's stream in whole batches of its own size: pass "
            f"TrainingArguments(per_device_train_batch_size={dataset.batch_size})"
        )
    refused = {
        "auto_find_batch_size": "the batch size is the dataset's; build the StreamingDataset with the one you want",
        "dataloader_persistent_workers": "workers would keep a stale copy of the dataset's epoch; leave it off",
        "ignore_data_skip": "resuming skips no batches here (the loader continues at its saved position); leave it off",
        "save_only_model": "a checkpoint without optimizer, RNG and data position cannot be resumed; leave it off",
        "load_best_model_at_end": f"{_NOT_WRITTEN}; restore a chosen step with CheckpointManager instead",
        "push_to_hub": f"{_NOT_WRITTEN}; push the model with trainer.save_model() and push_to_hub() after training",
    }
    for name, fix in refused.items():
        if getattr(args, name, False):
            raise ConfigError(f"StreamioTrainer cannot honour TrainingArguments({name}=True): {fix}")
    if sharded:
        raise ConfigError(
            "StreamioTrainer does not save DeepSpeed or FSDP states yet (their engines shard the model and optimizer): "
            "train without them, or use the stock transformers.Trainer"
        )
