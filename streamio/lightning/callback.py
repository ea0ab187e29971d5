"""``ModelCheckpoint``: Lightning's callback, with ``ckpt_path="last"`` that finds streamio checkpoints.

Lightning resolves ``fit(ckpt_path="last")`` before any plugin is called, from the
``ModelCheckpoint`` callbacks' own lookup, which on object storage finds nothing (Lightning
#18261) and could not use a streamio root if it did (a prefix has no modification time). This
subclass answers that lookup with the newest committed ``last*.ckpt`` root under ``dirpath``
(:func:`~.paths.newest_last`), so a half-written save is never resumed from. When the training
loader is a ``StreamingDataLoader`` resumed inside an epoch, it also makes Lightning count that
epoch's batches from its start (:mod:`.epochs`), as the loader's state does. It carries every
rank's RNG streams in the checkpoint rank 0 writes, and gives each rank its own back (:mod:`.rng`).
Everything else is Lightning's: top-k, ``save_last``, monitors, file names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streamio.lightning.epochs import count_whole_epochs
from streamio.lightning.paths import newest_last
from streamio.lightning.plugin import plugin_of
from streamio.lightning.requirement import require
from streamio.lightning.rng import PendingRNG, gather_rng

__all__ = ["ModelCheckpoint"]

_LightningModelCheckpoint: Any = require("lightning.pytorch.callbacks").ModelCheckpoint


class ModelCheckpoint(_LightningModelCheckpoint):  # type: ignore[misc]
    """``lightning.pytorch.callbacks.ModelCheckpoint`` whose ``last`` lookup reads streamio roots.

    Takes Lightning's arguments. The storage options of the lookup are those of the trainer's
    :class:`~.plugin.CheckpointIO`, also when Lightning's ``AsyncCheckpointIO`` wraps it;
    ``save_last="link"`` is refused on object storage by Lightning.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rng = PendingRNG()

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        gather_rng(checkpoint, rank=trainer.global_rank, world=trainer.world_size)  # every rank calls it

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._rng.loaded(checkpoint)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._rng.apply(rank=trainer.global_rank, world=trainer.world_size)

    def _find_last_checkpoints(self, trainer: Any) -> set[str]:
        if self.dirpath is None:
            return set()
        found = newest_last(str(self.dirpath), _storage_options(trainer))
        return {found} if found is not None else set()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_start(trainer, pl_module)
        count_whole_epochs(trainer)


def _storage_options(trainer: Any) -> Mapping[str, Any] | None:
    """The storage options of the trainer's :class:`~.plugin.CheckpointIO`, also inside Lightning's
    ``AsyncCheckpointIO`` (a wrapper holding the plugin it wraps as ``checkpoint_io``)."""
    plugin = plugin_of(getattr(trainer.strategy, "checkpoint_io", None))
    return plugin.storage_options if plugin is not None else None
