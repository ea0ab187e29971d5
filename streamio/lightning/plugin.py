"""``CheckpointIO``: Lightning's checkpoint plugin, writing streamio checkpoints.

Lightning builds one checkpoint dict (model ``state_dict``, optimizer and scheduler states, loops,
callbacks, the loader's state) on every rank, then calls the plugin on global rank 0 only
(``Strategy.save_checkpoint``), with a barrier after it. streamio's saves are collective, so the
plugin saves through a *solo* :class:`~streamio.checkpoint.CheckpointManager` (rank 0 of 1 while
the process group exists, nothing collective): the dict Lightning hands over is the whole state,
as with ``torch.save``. ``load_checkpoint`` runs on every rank and reads the same checkpoint.

Each path is a root of its own holding one save (:mod:`.paths`): tensors as parts, CRC-checked on
load, everything else as tagged JSON (docs/design.md "Layout and formats"): nothing is unpickled,
and a value the format cannot hold is refused at save with a :class:`~streamio.errors.CheckpointError`
naming where it is in the dict. A path saved again (``last.ckpt``) is taken over
(:meth:`~streamio.checkpoint.CheckpointManager.adopt`): the new save becomes current by the
pointer swap, then the old one is retired, so the path never holds less than one complete
checkpoint. Saves are synchronous: Lightning expects the file to exist when the call returns. The
managers of the roots saved to last are kept for the next save (:mod:`.managers`: no pointer
re-read, one host buffer).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions
from streamio.errors import ArgumentError, CheckpointError, CheckpointNotFoundError
from streamio.lightning.managers import Managers
from streamio.lightning.paths import checkpoint_store, remove_root
from streamio.lightning.requirement import require_any
from streamio.storage import RetryPolicy, Store

__all__ = ["STATE", "CheckpointIO", "lightning_step", "plugin_of", "refuse_storage_options"]

STATE = "lightning"
"""The one name a Lightning checkpoint dict is saved under in its root."""

_BASES: tuple[type, ...] = require_any("CheckpointIO", "lightning.fabric.plugins", "lightning_fabric.plugins")


class CheckpointIO(*_BASES):  # type: ignore[misc]
    """A Lightning ``CheckpointIO`` plugin over streamio checkpoints (see the module docstring).

    It subclasses the ``CheckpointIO`` of each Lightning package installed (``lightning`` and the
    older ``pytorch_lightning`` / ``lightning_fabric``), so both packages' ``Trainer`` and ``Fabric``
    accept it.

    Example::

        trainer = L.Trainer(plugins=[CheckpointIO()],
                            callbacks=[streamio.lightning.ModelCheckpoint(dirpath="s3://bucket/run/ckpt")])

    Args:
        storage_options: fsspec options (endpoint, credentials); never logged or stored.
        options: part size, concurrency, compression (``per_rank`` does not apply: rank 0 saves).
        retry: retry policy for transient storage errors.
    """

    def __init__(
        self,
        *,
        storage_options: Mapping[str, Any] | None = None,
        options: SaveOptions | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.storage_options = dict(storage_options or {})
        self.options = options
        self.retry = retry
        self._managers = Managers(self._new_manager)

    def __repr__(self) -> str:
        return "streamio.lightning.CheckpointIO()"

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn pickles the plugin: live managers stay here
        return {k: v for k, v in self.__dict__.items() if k != "_managers"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._managers = Managers(self._new_manager)

    def _new_manager(self, store: Store) -> CheckpointManager:
        return CheckpointManager(store.root_url, async_save=False, solo=True, retention=KeepLast(1),
                                 storage_options=self.storage_options, options=self.options, retry=self.retry)

    def _manager(self, path: str | os.PathLike[str]) -> CheckpointManager:
        return self._new_manager(checkpoint_store(path, self.storage_options))

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any | None = None) -> None:
        """Commit ``checkpoint`` as the one checkpoint at ``path``.

        Its step is ``global_step`` (the Trainer's); a state without one (Fabric's) counts the
        saves of the path: one past the step the path holds, 0 for the first.

        Raises:
            ArgumentError: ``storage_options`` given per call (give them to the constructor).
            CheckpointError: a value that cannot be saved without pickling (named), or a failed save
                (the checkpoint ``path`` held before stays).
            StorageError: the root cannot be reached.
        """
        refuse_storage_options(storage_options, path, "streamio.lightning.CheckpointIO.save_checkpoint")
        step = None if checkpoint.get("global_step") is None else lightning_step(checkpoint, path)
        with self._managers.saving(checkpoint_store(path, self.storage_options), step) as (manager, counted):
            manager.save(counted, {STATE: checkpoint})

    def load_checkpoint(self, path: str | os.PathLike[str], map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint dict saved at ``path`` (a root, or the pointer ``ckpt_path="last"`` found).

        Tensors come back on the CPU whatever ``map_location`` says; Lightning moves them.
        ``weights_only`` does not apply: nothing is unpickled.

        Raises:
            CheckpointNotFoundError: ``path`` holds no streamio checkpoint.
            CheckpointError: no checkpoint there verifies, or it was not written by this plugin.
            StorageError: the root cannot be reached.
        """
        state: dict[str, Any] = {STATE: None}
        with self._manager(path) as manager:
            try:
                manager.restore(state)
            except CheckpointNotFoundError as exc:
                raise CheckpointNotFoundError(
                    f"ckpt_path {os.fspath(path)!r} names no streamio checkpoint ({exc}); pass the path of a "
                    f"checkpoint saved with streamio.lightning.CheckpointIO, or ckpt_path='last' with "
                    f"streamio.lightning.ModelCheckpoint"
                ) from exc
        loaded = state[STATE]
        if not isinstance(loaded, dict):
            raise CheckpointError(
                f"{manager.store.root_url} holds a streamio checkpoint, but not one saved by "
                f"streamio.lightning.CheckpointIO (its {STATE!r} entry is {type(loaded).__name__}, not a dict)"
            )
        return loaded

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Delete the checkpoint at ``path`` (each manifest first, so nothing is left half visible).

        Raises:
            StorageError: the root cannot be reached (what was deleted so far stays deleted).
        """
        store = checkpoint_store(path, self.storage_options)
        self._managers.forget(store)
        remove_root(store)

    def teardown(self) -> None:
        """Release the managers kept for the next saves (Lightning calls this at the end of ``fit``)."""
        self._managers.close()


def lightning_step(checkpoint: Mapping[str, Any], path: str | os.PathLike[str]) -> int:
    """The step a Lightning checkpoint dict is saved as: its ``global_step`` (0 if it has none).

    Raises:
        CheckpointError: ``global_step`` is not an int >= 0.
    """
    step = checkpoint.get("global_step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(
            f"the Lightning checkpoint for {os.fspath(path)!r} has global_step={step!r}: a step is an int >= 0"
        )
    return step


def refuse_storage_options(storage_options: Any, path: str | os.PathLike[str], where: str) -> None:
    """Refuse ``storage_options`` given per save, as Lightning's own plugin and strategies do.

    Raises:
        ArgumentError: ``storage_options`` is not ``None`` (they are given once, to the plugin).
    """
    if storage_options is not None:
        raise ArgumentError(
            f"{where} got storage_options={type(storage_options).__name__} for {os.fspath(path)!r}: give them once, "
            f"as CheckpointIO(storage_options=...)"
        )


def plugin_of(checkpoint_io: Any) -> CheckpointIO | None:
    """The :class:`CheckpointIO` a strategy's ``checkpoint_io`` is, or wraps (Lightning's
    ``AsyncCheckpointIO`` holds the plugin it wraps as ``checkpoint_io``); ``None``: another plugin."""
    while checkpoint_io is not None and not isinstance(checkpoint_io, CheckpointIO):
        checkpoint_io = getattr(checkpoint_io, "checkpoint_io", None)
    return checkpoint_io
