"""Saving sharded tensors: each rank writes the local pieces it alone is responsible for, no gather.

A DTensor of the state (FSDP2's parameters and optimizer moments, a tensor-parallel module's
weights) is saved as *chunks*: this rank's local tensor is one box of the global tensor
(:func:`~.boxes.local_box`, DCP's own geometry), written into this rank's byte stream and
recorded with its offsets and sizes (:class:`~streamio.checkpoint.format.entries.ChunkEntry`). Nothing
is gathered and no rank ever holds more than its own shard.

**Who writes a box.** Along the mesh dimensions where the tensor is sharded every rank holds
another box; along the others (``Replicate()``, e.g. HSDP's replica groups or a 2-D mesh with a
replicated dimension) several ranks hold the same box. Exactly one writes it: the rank whose mesh
coordinate is 0 on every non-sharded dimension. That needs no collective (every rank decides for
itself from its coordinate), so the snapshot ``save`` blocks on copies only this rank's written
boxes to host memory. ``Partial()`` placements hold pending sums, not values: refused.

Each rank's entries travel in its done marker; rank 0 merges them into the manifest's ``sharded``
section, which must then cover every tensor exactly (:func:`~..format.manifest.build_manifest`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from streamio.checkpoint.format.entries import ChunkEntry, ShardedEntry
from streamio.checkpoint.tensors.boxes import local_box
from streamio.checkpoint.tensors.serialize import Layout
from streamio.checkpoint.tensors.tree import dtype_name
from streamio.errors import CheckpointError

__all__ = ["LocalShard", "describe_layout", "local_shards", "sharded_entries", "written"]


@dataclass(frozen=True)
class LocalShard:
    """This rank's piece of one DTensor of the state.

    Attributes:
        key: its key (the tree refers to it).
        local: the local tensor (what is copied to host memory when ``writes``).
        box: ``(offsets, sizes)`` in the global tensor; ``None`` when this rank is not in its mesh.
        writes: this rank writes the box (the replica at coordinate 0 of the non-sharded dims).
        dtype: its dtype name.
        shape: its global shape.
        layout: how it is sharded (mesh shape, dim names, placements), for ``ckpt inspect``.
    """

    key: str
    local: torch.Tensor
    box: tuple[tuple[int, ...], tuple[int, ...]] | None
    writes: bool
    dtype: str
    shape: tuple[int, ...]
    layout: dict[str, Any]


def local_shards(dtensors: Mapping[str, Any]) -> list[LocalShard]:
    """This rank's piece of each DTensor, and whether it writes it.

    Raises:
        CheckpointError: a DTensor with a ``Partial`` placement.
    """
    out = []
    for key, dt in dtensors.items():
        placements = tuple(dt.placements)
        if any(p.is_partial() for p in placements):
            raise CheckpointError(
                f"cannot save {key!r}: its DTensor placements {list(placements)} include Partial(), pending sums "
                f"rather than values; redistribute it to Shard() or Replicate() before saving"
            )
        coordinate = dt.device_mesh.get_coordinate()
        box = local_box(dt) if coordinate is not None else None
        local = dt.to_local()
        if box is not None and tuple(local.shape) != box[1]:
            raise CheckpointError(
                f"cannot save {key!r}: its local tensor is {list(local.shape)}, but its placements give this rank "
                f"a box of {list(box[1])} (a DTensor built with from_local(..., shape=...) that does not match?)"
            )
        replicas = [c for c, p in zip(coordinate or (), placements, strict=False) if not p.is_shard()]
        writes = box is not None and all(c == 0 for c in replicas)
        out.append(LocalShard(key, local, box, writes, dtype_name(dt.dtype), tuple(dt.shape), describe_layout(dt)))
    return out


def describe_layout(dt: Any) -> dict[str, Any]:
    """How a DTensor is sharded, for people: mesh shape, mesh dim names, placements."""
    mesh = dt.device_mesh
    return {"mesh": list(mesh.shape), "dims": list(mesh.mesh_dim_names or ()),
            "placements": [repr(p) for p in dt.placements]}


def written(shards: list[LocalShard]) -> list[tuple[str, torch.Tensor]]:
    """``(key, local tensor)`` of the boxes this rank writes (empty boxes are not written)."""
    return [(s.key, s.local) for s in shards if s.writes and s.local.numel()]


def sharded_entries(shards: list[LocalShard], layout: Layout, rank: int) -> dict[str, ShardedEntry]:
    """This rank's entry of every sharded tensor: its chunk where it writes one (placed by
    ``layout`` in its stream), none elsewhere; dtype, shape and layout always (rank 0's tree
    refers to every one of them)."""
    slots = {s.key: s for s in layout.slots}
    out = {}
    for s in shards:
        chunks: tuple[ChunkEntry, ...] = ()
        slot = slots.get(s.key)
        if slot is not None and s.box is not None:
            chunks = (ChunkEntry(s.box[0], s.box[1], rank, slot.offset, slot.nbytes),)
        out[s.key] = ShardedEntry(s.dtype, s.shape, chunks, s.layout)
    return out
