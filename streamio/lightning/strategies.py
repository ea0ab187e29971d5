"""``ModelParallelStrategy``: Lightning's sharding strategy, with its checkpoints in streamio roots.

Lightning's ``ModelParallelStrategy`` (FSDP2 ``fully_shard`` and tensor parallelism, applied in
``configure_model``) saves and loads sharded checkpoints itself, bypassing the ``CheckpointIO``
plugin: every rank calls ``save_checkpoint`` and ``load_checkpoint``, which make the path a local
``Path`` (an ``s3://`` dirpath becomes the directory ``s3:/bucket/...``), refuse
``storage_options``, and ``torch.save`` / ``torch.load`` the non-tensor rest (``meta.pt``). This
subclass keeps Lightning's training (setup, the device mesh, the state dicts it builds) and
replaces those two calls with :mod:`.sharded`: every rank writes its shards through streamio's
torch DCP writer into the root the path names, and loads through its reader, resharding onto the
current world size and mesh. Removals (``ModelCheckpoint``'s top-k) go to the strategy's
``checkpoint_io`` on rank 0, which is a :class:`~.plugin.CheckpointIO` (the default, or the one
given as ``plugins=[CheckpointIO(...)]``): its ``storage_options``, ``options`` and ``retry`` are
those of every save and load. The collectives of all the job's saves and loads share one
:class:`~streamio.checkpoint.comm.Comm`, made at the first one.

Lightning's ``FSDPStrategy`` (FSDP1) refuses ``accelerator="cpu"``; it has no streamio subclass
(``ModelParallelStrategy`` with ``fully_shard`` is FSDP2, on CPU and GPU).
"""

from __future__ import annotations

import os
from typing import Any

from streamio.checkpoint import SaveOptions
from streamio.checkpoint.comm import Comm
from streamio.errors import ConfigError
from streamio.lightning.plugin import CheckpointIO, plugin_of, refuse_storage_options
from streamio.lightning.requirement import require
from streamio.lightning.sharded import load_sharded, save_sharded

__all__ = ["ModelParallelStrategy"]

_LightningModelParallelStrategy: Any = require("lightning.pytorch.strategies").ModelParallelStrategy


class ModelParallelStrategy(_LightningModelParallelStrategy):  # type: ignore[misc]
    """``lightning.pytorch.strategies.ModelParallelStrategy`` saving and loading through streamio.

    Example::

        trainer = L.Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
                            plugins=[CheckpointIO()],   # optional: its storage_options / options / retry
                            callbacks=[streamio.lightning.ModelCheckpoint(dirpath="s3://bucket/run/ckpt")])

    Takes Lightning's arguments, and ``checkpoint_io`` as Lightning's other strategies do.
    ``save_distributed_checkpoint=False`` (the whole state gathered on rank 0) is refused.

    Raises:
        ConfigError: ``save_distributed_checkpoint=False``.
    """

    def __init__(self, *args: Any, checkpoint_io: CheckpointIO | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self._save_distributed_checkpoint:
            raise ConfigError(
                "streamio.lightning.ModelParallelStrategy saves each rank's shards (save_distributed_checkpoint=True); "
                "save_distributed_checkpoint=False gathers the whole state on rank 0: drop the argument, or use "
                "Lightning's own ModelParallelStrategy for that"
            )
        self._checkpoint_io = checkpoint_io
        self._comm: Comm | None = None

    @property
    def checkpoint_io(self) -> Any:
        """The plugin removals go through (default: a :class:`~.plugin.CheckpointIO`)."""
        if self._checkpoint_io is None:
            self._checkpoint_io = CheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: Any) -> None:
        self._checkpoint_io = io

    def _plugin(self) -> CheckpointIO:
        plugin = plugin_of(self.checkpoint_io)
        if plugin is None:
            raise ConfigError(
                f"streamio.lightning.ModelParallelStrategy writes streamio checkpoints, but the trainer's checkpoint "
                f"plugin is {type(self.checkpoint_io).__name__}: pass plugins=[streamio.lightning.CheckpointIO(...)] "
                f"or none"
            )
        return plugin

    def _collectives(self, plugin: CheckpointIO) -> Comm:
        if self._comm is None:
            self._comm = Comm(timeout_s=(plugin.options or SaveOptions()).collective_timeout_s)
        return self._comm

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        """Commit this rank's part of ``checkpoint`` to the root at ``filepath`` (rank 0's path; collective).

        Raises:
            ArgumentError: ``storage_options`` given per call (give them to ``CheckpointIO``).
            ConfigError: the trainer's checkpoint plugin is not a streamio ``CheckpointIO``.
            CheckpointError: a value that cannot be saved without pickling, or a failed save on any
                rank (the path keeps the checkpoint it held).
        """
        refuse_storage_options(storage_options, filepath, "streamio.lightning.ModelParallelStrategy.save_checkpoint")
        plugin = self._plugin()
        path = self.broadcast(os.fspath(filepath))
        save_sharded(checkpoint, path, plugin, self._collectives(plugin))

    def load_checkpoint(self, checkpoint_path: str | os.PathLike[str],
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Load the model's and optimizers' shards from ``checkpoint_path`` (rank 0's path; collective)
        and return the rest of the checkpoint dict. ``weights_only`` does not apply: nothing is unpickled.

        Raises:
            CheckpointNotFoundError: the path holds no streamio checkpoint.
            CheckpointFormatError: it was not saved by this strategy.
            CheckpointError: it does not fit the model or optimizers.
        """
        plugin = self._plugin()
        path = self.broadcast(os.fspath(checkpoint_path))
        assert self.model is not None and self.lightning_module is not None  # load runs after setup
        return load_sharded(path, plugin, self._collectives(plugin), self.model, self.optimizers,
                            strict=self.lightning_module.strict_loading)
