"""What ``save`` blocks on: the state encoded, split per rank / replicated, copied to host memory.

Each state object's ``state_dict()`` (or the plain value) becomes a JSON tree with references to
tensors (:class:`~..tensors.tree.TreeEncoder`, never pickle); a module's is taken under wrapper-independent
keys (:mod:`~..tensors.wrappers`: ``DDP(model)`` and ``torch.compile(model)`` save what ``model`` saves).
State named in ``SaveOptions.per_rank`` (RNG, data position) is this rank's own; everything else
is replicated (DDP model, optimizer) and its tensors are divided among ranks so each uploads a
disjoint share of about equal bytes (:func:`~..tensors.serialize.assign_shares`). Replicated state must
really be equal on every rank; the one known exception, module buffers (BatchNorm statistics,
which DDP re-broadcasts from rank 0 at each forward), is always taken from rank 0, and JSON
(non-tensor) replicated state is rank 0's.

Sharded tensors (DTensors: FSDP2 parameters and optimizer state, tensor-parallel weights) are
neither: each rank writes the local box it alone is responsible for (:mod:`.tensors.shards`), no
gather, and the parts of such a save carry block checksums (``SaveOptions.block_size``) so that a
restore onto another sharding can read just the rows it needs.

The tensors this rank writes are then copied into the manager's reused host buffer
(:class:`~..tensors.serialize.HostBuffer`): after that copy training may change them, and the commit
(:mod:`.commit`) uploads from the buffer in the background. That copy (device to host, of this
rank's own share and shards) is all ``save`` blocks on.

Metrics (:mod:`streamio.metrics`): the ``blocked`` phase of ``streamio_checkpoint_seconds`` is
observed here, once per save, as ``Snapshot.blocked_s`` (from the ``save()`` call); the copy is
the ``snapshot`` span.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from streamio.checkpoint.comm import Comm
from streamio.checkpoint.format.entries import ShardedEntry
from streamio.checkpoint.tensors.serialize import HostBuffer, Slot, assign_shares, plan_layout
from streamio.checkpoint.tensors.shards import local_shards, sharded_entries, written
from streamio.checkpoint.tensors.tree import TreeEncoder
from streamio.checkpoint.tensors.wrappers import ModuleKeys
from streamio.errors import CheckpointError
from streamio.metrics.catalog import CHECKPOINT_SECONDS
from streamio.metrics.trace import span

__all__ = ["Snapshot", "take_snapshot"]


@dataclass
class Snapshot:
    """One step as ``save`` left it: this rank's byte stream and the JSON of its state.

    Attributes:
        step: the step to commit.
        started: ``time.perf_counter()`` when ``save`` was called.
        blocked_s: seconds the caller waited (previous save + snapshot).
        stream: this rank's bytes (a numpy view of the host buffer).
        total: bytes in ``stream``.
        per_rank_tree: the JSON tree of this rank's own state.
        replicated_tree: the JSON tree of the replicated state (rank 0; ``None`` elsewhere).
        metrics: recorded in the manifest.
        recorded: the tensors whose checksums the manifest records (a sharded chunk's bytes are
            covered by its part's block checksums instead); the upload combines them from its
            one CRC32C pass (:mod:`~..tensors.crcs`).
        replicated: the keys of ``recorded`` that are replicated state (the others: per-rank).
        sharded: this rank's entry of every sharded tensor (its chunks, if it writes any).
        block_size: bytes per checksummed block of each part (0: none; set when ``sharded``).
    """

    step: int
    started: float
    blocked_s: float
    stream: Any
    total: int
    per_rank_tree: Any
    replicated_tree: Any
    metrics: dict[str, Any]
    recorded: tuple[Slot, ...] = field(repr=False)
    replicated: frozenset[str] = frozenset()
    sharded: dict[str, ShardedEntry] = field(default_factory=dict)
    block_size: int = 0


def take_snapshot(
    step: int, state: Mapping[str, Any], *, comm: Comm, per_rank: frozenset[str], buffer: HostBuffer,
    metrics: dict[str, Any], started: float, block_size: int = 1 << 20,
) -> Snapshot:
    """Encode ``state`` and copy this rank's share of its tensors into ``buffer``.

    Args:
        step: the step being saved (named in errors).
        state: name -> object with ``state_dict()`` or plain value.
        comm: this rank's place in the job.
        per_rank: the state names each rank saves for itself.
        buffer: the host buffer the tensors are copied into (reused between saves).
        metrics: recorded in the manifest.
        started: ``time.perf_counter()`` when ``save`` was called (``blocked_s`` counts from it).
        block_size: bytes per checksummed block of the parts when the state holds DTensors.

    Raises:
        CheckpointError: a state name is not a string, a value cannot be saved without pickling,
            or a DTensor is in per-rank state or has a ``Partial`` placement.
    """
    rep_tensors: dict[str, torch.Tensor] = {}
    rank_tensors: dict[str, torch.Tensor] = {}
    rep_tree: dict[str, Any] = {}
    rank_tree: dict[str, Any] = {}
    dtensors: dict[str, torch.Tensor] = {}
    buffers: set[str] = set()
    for name, obj in state.items():
        if not isinstance(name, str):
            raise CheckpointError(f"state names must be strings, got {name!r} while saving step {step}")
        if isinstance(obj, torch.nn.Module):
            # under wrapper-independent keys: DDP(model), torch.compile(model) and model alike
            keys = ModuleKeys(obj)
            buffers.update(f"{name}/{keys.canonical_key(b)}" for b, _ in obj.named_buffers())
            value = keys.canonical(obj.state_dict())
        else:
            value = obj.state_dict() if callable(getattr(obj, "state_dict", None)) else obj
        if name in per_rank:
            rank_tree[name] = TreeEncoder(rank_tensors).encode(value, name)
        else:
            rep_tree[name] = TreeEncoder(rep_tensors, sharded=dtensors).encode(value, name)
    sizes = {k: t.numel() * t.element_size() for k, t in rep_tensors.items()}
    # Module buffers (BatchNorm statistics) differ between DDP ranks until the next forward
    # broadcasts rank 0's; parameters and optimizer state are identical, so they are shared.
    owner = assign_shares(sizes, comm.world, rank0=buffers)
    mine = [(k, rep_tensors[k]) for k in rep_tensors if owner[k] == comm.rank]
    shards = local_shards(dtensors)
    ordered = mine + list(rank_tensors.items())
    planned = plan_layout(ordered + written(shards))
    with span("snapshot", step=step):
        stream = buffer.snapshot(planned, dict(ordered + written(shards)))
    blocked = time.perf_counter() - started
    CHECKPOINT_SECONDS.observe(blocked, "blocked")
    return Snapshot(
        step=step, started=started, blocked_s=blocked, stream=stream, total=planned.total, per_rank_tree=rank_tree,
        replicated_tree=rep_tree if comm.rank == 0 else None, metrics=metrics,
        recorded=tuple(s for s in planned.slots if s.key not in dtensors), replicated=frozenset(k for k, _ in mine),
        sharded=sharded_entries(shards, planned, comm.rank), block_size=block_size if dtensors else 0,
    )
