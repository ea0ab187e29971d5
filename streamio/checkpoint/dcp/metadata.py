"""How a checkpoint written through torch DCP is held in a streamio manifest, and read back as DCP ``Metadata``.

``dcp.save(state, storage_writer=StreamioWriter(...))`` writes an ordinary streamio save (format
3: parts with block checksums, done markers, a sealed manifest, the pointer). DCP's pieces map
onto it like this:

* every tensor item (a DTensor's shard, or a plain tensor DCP's planner gave to one rank) is a
  chunk of the manifest's ``sharded`` entry of its flattened key (``"model.0.weight"``), with the
  global shape and dtype DCP's planner recorded;
* every non-tensor item (``BYTE_IO``: hyper-parameters, step counters, lists) is stored as
  tagged JSON (:mod:`~streamio.checkpoint.tensors.tree`) under its key in the per-rank tree of the rank
  DCP's planner gave it to, never as DCP's ``torch.save`` pickle; tensors nested in such a value
  go to that rank's stream as plain tensors;
* DCP's ``planner_data`` (each flattened key's path in the nested state dict) is kept, as JSON,
  in rank 0's replicated tree under ``"dcp"``.

:func:`metadata_of` rebuilds DCP's ``Metadata`` from a parsed (validated) manifest, so DCP's own
load planner computes what each rank reads; nothing of it is unpickled, because nothing of it
was pickled. :func:`checkpoint_step` reads DCP's ``checkpoint_id`` as a step under the root.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from streamio.checkpoint.format.checks import short
from streamio.checkpoint.format.layout import parse_step_dir
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.tensors.tree import dtype_from_name
from streamio.errors import CheckpointError, CheckpointFormatError, ConfigError, StreamioError
from streamio.limits import MAX_JSON_DEPTH

__all__ = [
    "DCP_KEY", "MAX_LIST_INDEX", "checkpoint_step", "dcp_failure", "metadata_of", "planner_data_from_json",
    "planner_data_to_json", "values_by_rank",
]

DCP_KEY = "dcp"
MAX_LIST_INDEX = 1 << 20
"""Bound of a list position in DCP's planner data: loading a value at position ``i`` extends the
list to ``i + 1`` entries (torch's ``set_element``), so a hostile position would allocate without bound."""


def checkpoint_step(checkpoint_id: Any) -> int:
    """DCP's ``checkpoint_id`` as a step: ``100``, ``"100"`` or ``"step-000000100"``.

    Raises:
        ConfigError: anything else (a path: the root is given to the writer or reader itself).
    """
    if isinstance(checkpoint_id, int) and not isinstance(checkpoint_id, bool) and checkpoint_id >= 0:
        return checkpoint_id
    text = str(checkpoint_id)
    step = int(text) if text.isdigit() else parse_step_dir(text)
    if step is None:
        raise ConfigError(
            f"checkpoint_id {checkpoint_id!r} is not a step: StreamioWriter/StreamioReader take the root URL when "
            f"constructed and the step as checkpoint_id (100, '100' or 'step-000000100')"
        )
    return step


def planner_data_to_json(mappings: Any) -> dict[str, list[Any]]:
    """DCP's flatten mappings (key -> path of str/int) as JSON; other values are not kept."""
    if not isinstance(mappings, Mapping):
        return {}
    return {
        k: list(path) for k, path in mappings.items()
        if isinstance(k, str) and isinstance(path, tuple) and all(isinstance(p, (str, int)) for p in path)
    }


def planner_data_from_json(doc: Any, what: str) -> dict[str, tuple[Any, ...]]:
    """Inverse of :func:`planner_data_to_json`, checking every field.

    Raises:
        CheckpointFormatError: not an object of key -> a list of 1 to ``MAX_JSON_DEPTH`` names and
            list positions in ``[0, MAX_LIST_INDEX)``.
    """
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise CheckpointFormatError(f"{what}: DCP planner data must map keys to lists of names and indices")
    for key, path in doc.items():
        if not isinstance(path, list) or not 1 <= len(path) <= MAX_JSON_DEPTH or not all(map(_path_step, path)):
            raise CheckpointFormatError(
                f"{what}: DCP planner data of {short(key)} must be a list of 1 to {MAX_JSON_DEPTH} names and indices "
                f"(list positions in [0, {MAX_LIST_INDEX})), got {short(path)}"
            )
    return {k: tuple(path) for k, path in doc.items()}


def _path_step(p: Any) -> bool:
    return isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool) and 0 <= p < MAX_LIST_INDEX)


def values_by_rank(m: Manifest) -> dict[str, int]:
    """Each non-tensor value's key -> the rank whose per-rank tree holds it."""
    out: dict[str, int] = {}
    for rank, section in enumerate(m.per_rank):
        for key in section.tree or {}:
            out.setdefault(key, rank)
    return out


def metadata_of(m: Manifest, what: str) -> Any:
    """torch DCP's ``Metadata`` of a checkpoint written by :class:`~.writer.StreamioWriter`.

    Raises:
        CheckpointFormatError: the save was not written through DCP (a ``CheckpointManager``
            save: restore it with the manager), or its planner data is malformed.
    """
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    tree = m.replicated.tree if isinstance(m.replicated.tree, dict) else {}
    if DCP_KEY not in tree:
        raise CheckpointFormatError(
            f"{what} was not written through torch DCP (StreamioWriter): restore it with CheckpointManager.restore"
        )
    dcp = tree[DCP_KEY] if isinstance(tree[DCP_KEY], dict) else {}
    state: dict[str, Any] = {}
    for key, e in m.sharded.items():
        chunks = [ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in e.chunks]
        state[key] = TensorStorageMetadata(TensorProperties(dtype=dtype_from_name(e.dtype)), torch.Size(e.shape),
                                           chunks)
    for key in values_by_rank(m):
        state.setdefault(key, BytesStorageMetadata())
    return Metadata(state_dict_metadata=state, planner_data=planner_data_from_json(dcp.get("planner_data"), what))


class StepCheckpointId:
    """DCP's ``checkpoint_id`` as a streamio step: the part of the interface the writer and reader share.

    The root is fixed at construction; ``checkpoint_id`` (``100``, ``"100"``, ``"step-000000100"``)
    only selects the step (:func:`checkpoint_step`).
    """

    step: int | None

    def reset(self, checkpoint_id: str | os.PathLike[str] | int | None = None) -> None:
        """A new save or load begins; ``checkpoint_id``, if given, is its step."""
        if checkpoint_id is not None:
            self.step = checkpoint_step(checkpoint_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str] | int) -> bool:
        """Whether ``checkpoint_id`` names a step."""
        try:
            checkpoint_step(checkpoint_id)
        except ConfigError:
            return False
        return True


def dcp_failure(exc: Any, mine: StreamioError | None, rank: int, doing: str, hint: str) -> BaseException:
    """The error to raise for torch DCP's ``CheckpointException`` ``exc``: what this rank's writer or
    reader raised (``mine``), else another rank's streamio error, else a
    :class:`~streamio.errors.CheckpointError` naming ``doing``, the first failing rank and ``hint``.

    DCP catches every error of its storage layer and raises ``CheckpointException`` (a
    ``BaseException`` carrying each rank's error in ``failures``), which ``except Exception`` misses.
    """
    if mine is not None:
        return mine
    failures = sorted(((r, error) for r, (error, _) in exc.failures.items()), key=lambda f: f[0])
    ours = [e for _, e in failures if isinstance(e, StreamioError)]
    if ours:
        return ours[0]
    first_rank, first = failures[0] if failures else (rank, exc)
    return CheckpointError(
        f"{doing} through torch DCP failed on rank {first_rank}: {type(first).__name__}: {first} ({hint})"
    )
