"""A sharding strategy's Lightning checkpoint in one streamio root, written and read through torch DCP.

With ``ModelParallelStrategy`` (FSDP2 ``fully_shard``, tensor parallelism) Lightning builds the
checkpoint dict on every rank, the model's and optimizers' states as that rank's shards
(``DTensor``), and every rank calls the strategy's ``save_checkpoint``. Lightning's own strategy
then turns the path into a local ``Path`` (``s3://bucket/x`` becomes the directory ``s3:/bucket/x``),
writes the shards with ``torch.distributed.checkpoint.save`` and ``torch.save``s the rest of the
dict to ``meta.pt`` on rank 0. Here instead:

* :func:`save_sharded` (every rank): one ``dcp.save`` through
  :class:`~streamio.checkpoint.StreamioWriter` into the root the path names (:mod:`.paths`):
  each rank's shards as its parts, the rest of the dict (loops, callbacks, the loader's state,
  hyper-parameters) as rank 0 holds it, as tagged JSON with its tensors as parts; then one
  manifest and one pointer, so the path holds the new checkpoint or the one before, never half.
  A path saved again (``last.ckpt``) is adopted first, as :class:`~.plugin.CheckpointIO` does.
* :func:`load_sharded` (every rank): one ``dcp.load`` through
  :class:`~streamio.checkpoint.StreamioReader` of the save the pointer names. DCP's planner
  intersects the shards each rank holds now with the saved ones, so a checkpoint of N ranks
  loads on M, on another mesh; the rest comes back as it was saved.

The rest is handed to DCP as a 1-tuple. DCP flattens mappings and lists into one item per leaf:
int keys would come back as strings, empty dicts not at all, and only what the loading side
already holds a place for is read, while a tuple is one leaf, which the writer stores as one JSON
value and the reader decodes as it was. Nothing is pickled either way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from streamio.checkpoint import KeepLast, StreamioReader, StreamioWriter
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.restore.candidates import detect_foreign
from streamio.errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError
from streamio.lightning.paths import checkpoint_store
from streamio.lightning.plugin import CheckpointIO, lightning_step

__all__ = ["MODEL", "REST", "load_sharded", "save_sharded"]

MODEL = "model"
"""The model's state in the DCP state (each optimizer's is ``optimizer_<i>``, as Lightning names them)."""
REST = "lightning"
"""The rest of the Lightning checkpoint dict in the DCP state, as a 1-tuple (see the module docstring)."""

_SHARDED_KEYS = ("state_dict", "optimizer_states")  # what Lightning's dict holds as shards


def save_sharded(checkpoint: Mapping[str, Any], path: str, plugin: CheckpointIO, comm: Comm) -> None:
    """Commit ``checkpoint`` (this rank's shards of it) as the one checkpoint at ``path``; every rank calls it.

    Raises:
        CheckpointError: no ``state_dict``, a value that cannot be saved without pickling (named),
            or the commit failed on any rank (``path`` keeps the checkpoint it held).
        CheckpointConflictError: another job writes ``path``.
        StorageError: the root cannot be reached.
    """
    if "state_dict" not in checkpoint:
        raise CheckpointError(
            f"the Lightning checkpoint for {path!r} has no 'state_dict' (keys: {sorted(map(str, checkpoint))[:8]}): "
            f"save through Trainer.save_checkpoint, which builds it"
        )
    store = checkpoint_store(path, plugin.storage_options)
    state: dict[str, Any] = {MODEL: checkpoint["state_dict"]}
    state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.get("optimizer_states", []))})
    if comm.rank == 0:
        state[REST] = ({k: v for k, v in checkpoint.items() if k not in _SHARDED_KEYS},)
    writer = StreamioWriter(store.root_url, step=lightning_step(checkpoint, path), retention=KeepLast(1),
                            storage_options=plugin.storage_options, options=plugin.options, retry=plugin.retry,
                            comm=comm)
    try:
        writer.adopt()
        writer.save(state)
    finally:
        writer.close()


def load_sharded(path: str, plugin: CheckpointIO, comm: Comm, model: torch.nn.Module,
                 optimizers: Sequence[torch.optim.Optimizer], *, strict: bool = True) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``model`` and ``optimizers`` (resharded onto how they are
    sharded now) and return the rest of its dict; every rank calls it.

    Raises:
        CheckpointNotFoundError: ``path`` holds no streamio checkpoint.
        CheckpointFormatError: it was not saved by a sharded strategy of ``streamio.lightning``
            (another tool's checkpoint is named: Lightning's own DCP directory, a ``torch.save`` file).
        CorruptDataError: a part differs from its checksum (nothing was loaded on this rank).
        CheckpointError: it does not fit ``model`` / ``optimizers`` (another model, other optimizers).
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    store = checkpoint_store(path, plugin.storage_options)
    state: dict[str, Any] = {MODEL: get_model_state_dict(model), REST: None}
    state.update({f"optimizer_{i}": get_optimizer_state_dict(model, o) for i, o in enumerate(optimizers)})
    reader = StreamioReader(store.root_url, storage_options=plugin.storage_options, retry=plugin.retry, comm=comm)
    try:
        reader.load(state)
    except CheckpointNotFoundError as exc:
        foreign = detect_foreign(store)
        if foreign is not None:
            raise CheckpointFormatError(
                f"ckpt_path {os.fspath(path)!r} is not a streamio checkpoint (Lightning's own strategy wrote it?): it "
                f"holds {foreign}"
            ) from exc
        raise CheckpointNotFoundError(
            f"ckpt_path {os.fspath(path)!r} names no streamio checkpoint ({exc}); pass the path of a checkpoint "
            f"saved with a streamio.lightning strategy, or ckpt_path='last' with streamio.lightning.ModelCheckpoint"
        ) from exc
    except CheckpointFormatError as exc:
        raise CheckpointFormatError(
            f"{store.root_url} cannot be loaded by a sharded streamio.lightning strategy: {exc} (a checkpoint of "
            f"streamio.lightning.CheckpointIO with strategy='ddp' loads with that strategy)"
        ) from exc
    set_model_state_dict(model, state[MODEL], options=StateDictOptions(strict=strict))
    for i, optimizer in enumerate(optimizers):
        set_optimizer_state_dict(model, optimizer, state[f"optimizer_{i}"])
    rest = state[REST]
    if not (isinstance(rest, tuple) and len(rest) == 1 and isinstance(rest[0], dict)):
        raise CheckpointError(
            f"{store.root_url} holds a torch DCP checkpoint whose {REST!r} entry is {type(rest).__name__}, not the "
            f"Lightning checkpoint dict a streamio.lightning strategy saves there"
        )
    return rest[0]
