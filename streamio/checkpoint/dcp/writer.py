"""``StreamioWriter``: a torch DCP ``StorageWriter`` that commits through streamio's protocol.

``torch.distributed.checkpoint.save(state, storage_writer=StreamioWriter(root, step=100))`` keeps
DCP's planning (flattening, deduplication of replicated items, the global plan) and replaces its
storage: each rank's items are laid out in one host buffer and committed by the same
:class:`~streamio.checkpoint.save.commit.Committer` as ``CheckpointManager.save``: parts uploaded in
parallel under streamio's retry policy with a CRC32C per part and per block, create-only done
markers, the barrier, a sealed create-only manifest, the compare-and-swap of ``latest.json``,
then retention and timelines. What DCP calls the checkpoint is therefore only visible once the
pointer names it, and a ``kill -9`` at any instant leaves the previous one current.

Where DCP's sequence of calls meets the protocol (the interface's call order):

1. ``reset(checkpoint_id)``: the step (``dcp.save(..., checkpoint_id=200)``); the root is fixed
   at construction (its timeline and pointer version belong to the writer, like a manager's);
2. ``set_up_storage_writer`` / ``prepare_local_plan`` / ``prepare_global_plan``: unchanged plans;
3. ``write_data`` (every rank): the snapshot of this rank's items (tensors through the planner's
   ``resolve_data``; non-tensor values through ``lookup_object`` and encoded as JSON, never
   through ``resolve_data``, which would ``torch.save`` them), then the whole commit, collective
   over streamio's own gloo groups; a failure on any rank fails it on every rank;
4. ``finish`` (coordinator): nothing left to do; DCP's ``Metadata`` is rebuilt from the manifest
   on load (:mod:`.metadata`).

Metrics (:mod:`streamio.metrics`): as a manager's save, but ``blocked`` is the snapshot of this
rank's items (``write_data`` until the copy is made; DCP's planning before it is not included) and
``durable`` runs from there until the pointer names the step; ``dcp.save`` returns only then.

Every rank constructs the writer (it makes the gloo groups of the commit, as a manager does) and
DCP must run over the default process group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from streamio.checkpoint.comm import Comm
from streamio.checkpoint.dcp.metadata import DCP_KEY, StepCheckpointId, dcp_failure, planner_data_to_json
from streamio.checkpoint.format.entries import ChunkEntry, ShardedEntry
from streamio.checkpoint.format.retention import RetentionPolicy
from streamio.checkpoint.options import SaveOptions, SaveStats
from streamio.checkpoint.save.commit import Committer, PhaseHook
from streamio.checkpoint.save.plan import current_point
from streamio.checkpoint.save.snapshot import Snapshot
from streamio.checkpoint.tensors.serialize import HostBuffer, Layout, plan_layout
from streamio.checkpoint.tensors.shards import describe_layout
from streamio.checkpoint.tensors.tree import TreeEncoder, dtype_name, is_dtensor
from streamio.errors import CheckpointError, StreamioError
from streamio.metrics.catalog import CHECKPOINT_SECONDS
from streamio.metrics.trace import span
from streamio.storage import RetryPolicy, Store

__all__ = ["StreamioWriter"]

log = logging.getLogger(__name__)


class StreamioWriter(StepCheckpointId, StorageWriter):
    """torch DCP storage writer over a streamio checkpoint root; see the module docstring.

    Args:
        root_url: the checkpoint root (any fsspec URL), as for ``CheckpointManager``.
        step: the step the next ``dcp.save`` commits (or pass ``checkpoint_id=step`` to it;
            set :attr:`step` between saves).
        retention: which committed checkpoints to keep (default: the root's recorded policy).
        storage_options: fsspec options (endpoint, credentials); never logged or stored.
        options: part size, concurrency, block size, collective timeout.
        retry: retry policy for transient storage errors.
        on_phase: called with the name of each commit phase as it completes (tests kill there).
        comm: the collectives of the commit (default: gloo groups of its own, made here). A job
            that writes many roots (one per Lightning checkpoint path) shares one, since each
            writer's groups live as long as the process.

    Attributes:
        metrics: numbers recorded in the next manifest (what ``KeepBest`` ranks by).
        last_stats: what the last save cost.
    """

    def __init__(
        self, root_url: str, *, step: int | None = None, retention: RetentionPolicy | None = None,
        storage_options: Mapping[str, Any] | None = None, options: SaveOptions | None = None,
        retry: RetryPolicy | None = None, on_phase: PhaseHook | None = None, comm: Comm | None = None,
    ) -> None:
        self.store = Store(root_url, storage_options, retry=retry)
        self.options = options or SaveOptions()
        self.step = step
        self.metrics: dict[str, Any] = {}
        self.last_stats: SaveStats | None = None
        self._comm = comm or Comm(timeout_s=self.options.collective_timeout_s)
        self._committer = Committer(self.store, self._comm, options=self.options, retention=retention,
                                    on_phase=on_phase)
        self._buffer = HostBuffer()
        self._failure: StreamioError | None = None  # what this writer raised during the save in progress

    def __repr__(self) -> str:
        return f"StreamioWriter({self.store.root_url!r}, step={self.step})"

    def adopt(self) -> int | None:
        """Continue the root's current checkpoint without loading it: the next save supersedes it,
        whatever its step (as :meth:`CheckpointManager.adopt <streamio.checkpoint.CheckpointManager.adopt>`;
        every rank calls it).

        Returns:
            The step the pointer names (``None``: the root holds no checkpoint yet).

        Raises:
            CheckpointError: the pointer is unusable.
        """
        point, version = current_point(self.store)
        self._committer.restored(None if point is None else (point, version))
        return None if point is None else point.step

    def save(self, state_dict: dict[str, Any], *, planner: SavePlanner | None = None) -> None:
        """``torch.distributed.checkpoint.save(state_dict, storage_writer=self, ...)``, raising
        streamio's errors rather than torch's ``CheckpointException`` (every rank calls it).

        Raises:
            CheckpointError: a value cannot be stored as JSON, or the commit failed on any rank (the
                previous checkpoint stays current); what torch's planner refused, naming the rank.
            CheckpointConflictError: another job writes this root.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        self._failure = None
        try:
            dcp.save(state_dict, storage_writer=self, planner=planner)
        except CheckpointException as exc:
            raise dcp_failure(exc, self._failure, self._comm.rank, f"saving step {self.step} to {self.store.root_url}",
                              "the previous checkpoint stays current") from exc

    # ------------------------------------------------------------------------ DCP's interface
    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        rank = kwargs.get("rank", self._comm.rank)
        if rank != self._comm.rank or is_coordinator != (self._comm.rank == 0):
            raise CheckpointError(
                f"StreamioWriter runs on rank {self._comm.rank} of the default process group, but DCP calls it "
                f"rank {rank}{' (coordinator)' if is_coordinator else ''}: save over the default group, coordinator 0"
            )

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Snapshot this rank's items and commit the save (collective: every rank calls it).

        Raises:
            CheckpointError: no step was given, a value cannot be stored as JSON, or the commit
                failed on any rank (the previous checkpoint stays current).
            CheckpointConflictError: another job writes this root.
        """
        if self.step is None:
            raise CheckpointError(
                "StreamioWriter has no step: construct it with step=N, set writer.step, or pass checkpoint_id=N "
                "to torch.distributed.checkpoint.save"
            )
        try:
            job = self._snapshot(self.step, plan, planner, time.perf_counter())
            self._comm.arrive("save", job.step, where=f"saving step {job.step} to {self.store.root_url} (torch DCP)")
            self.last_stats = self._committer.commit(job)
        except StreamioError as exc:  # dcp.save keeps only its text on other ranks: save() raises it as it is
            self._failure = exc
            raise
        future: Future[list[WriteResult]] = Future()
        future.set_result([WriteResult(index=i.index, size_in_bytes=_nbytes(i), storage_data=None) for i in plan.items])
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Nothing to do: the save was committed in ``write_data`` (DCP's ``Metadata`` is rebuilt
        from the manifest on load)."""
        log.debug("torch DCP save of step %s finished (%d ranks' results)", self.step, len(results))

    def close(self) -> None:
        """Release the host buffer (the writer may still be used; the next save allocates it again)."""
        self._buffer = HostBuffer()

    # ------------------------------------------------------------------------ the snapshot
    def _snapshot(self, step: int, plan: SavePlan, planner: SavePlanner, started: float) -> Snapshot:
        rank = self._comm.rank
        values: dict[str, Any] = {}
        chunks: dict[str, tuple[WriteItem, Any]] = {}  # slot key -> (item, tensor)
        for i, item in enumerate(plan.items):
            if item.type == WriteItemType.BYTE_IO:
                values[item.index.fqn] = _lookup(planner, item)
            else:
                chunks[f"{item.index.fqn}#{i}"] = (item, planner.resolve_data(item).detach())
        nested: dict[str, Any] = {}  # tensors inside non-tensor values: plain per-rank tensors
        tree = {key: TreeEncoder(nested).encode(value, key) for key, value in values.items()}
        ordered = list(nested.items()) + [(k, t) for k, (_, t) in chunks.items() if t.numel()]
        planned = plan_layout(ordered)
        with span("snapshot", step=step):
            stream = self._buffer.snapshot(planned, dict(ordered))
        blocked = time.perf_counter() - started
        CHECKPOINT_SECONDS.observe(blocked, "blocked")
        replicated = {DCP_KEY: {"planner_data": planner_data_to_json(plan.planner_data)}} if rank == 0 else None
        return Snapshot(
            step=step, started=started, blocked_s=blocked, stream=stream, total=planned.total, per_rank_tree=tree,
            replicated_tree=replicated, metrics=dict(self.metrics),
            recorded=tuple(s for s in planned.slots if s.key in nested),
            sharded=_sharded(chunks, planned, rank, planner), block_size=self.options.block_size,
        )


def _sharded(
    chunks: dict[str, tuple[WriteItem, Any]], planned: Layout, rank: int, planner: Any
) -> dict[str, ShardedEntry]:
    """This rank's chunks, by DCP key, with the global shape and dtype DCP's planner recorded."""
    slots = {s.key: s for s in planned.slots}
    state = getattr(planner, "state_dict", None) or {}
    out: dict[str, ShardedEntry] = {}
    for key, (item, _) in chunks.items():
        data, fqn = item.tensor_data, item.index.fqn
        assert data is not None  # a tensor item always has its tensor data
        slot = slots.get(key)
        mine = (ChunkEntry(tuple(data.chunk.offsets), tuple(data.chunk.sizes), rank, slot.offset, slot.nbytes),) \
            if slot is not None else ()
        have = out.get(fqn)
        live = state.get(fqn) if isinstance(state, Mapping) else None
        layout = describe_layout(live) if is_dtensor(live) else {}
        out[fqn] = ShardedEntry(dtype_name(data.properties.dtype), tuple(data.size),
                                (have.chunks if have else ()) + mine, layout)
    return out


def _lookup(planner: Any, item: WriteItem) -> Any:
    """A non-tensor value of the state, as it is (the default planner's ``resolve_data`` would
    ``torch.save`` it: a pickle, which streamio never writes)."""
    lookup = getattr(planner, "lookup_object", None)
    if lookup is None:
        raise CheckpointError(
            f"cannot save the non-tensor value {item.index.fqn!r}: StreamioWriter stores such values as JSON and gets "
            f"them through the planner's lookup_object() (DefaultSavePlanner and its subclasses have it), which "
            f"{type(planner).__name__} does not have"
        )
    return lookup(item.index)


def _nbytes(item: WriteItem) -> int:
    return item.tensor_storage_size() or 0
