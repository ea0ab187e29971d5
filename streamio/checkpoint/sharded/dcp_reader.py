"""``StreamioReader``: a torch DCP ``StorageReader`` over a streamio checkpoint root.

``torch.distributed.checkpoint.load(state, storage_reader=StreamioReader(root))`` loads the save
``latest.json`` names (or ``step=`` / ``checkpoint_id=``) into ``state`` with DCP's own load
planner, on any number of ranks and any sharding: the planner intersects what each rank holds
with the saved chunks, and this reader fetches just those bytes.

The interface's call order, and what happens at each step:

1. ``reset(checkpoint_id)``: the step to load, if given;
2. ``read_metadata`` (every rank): rank 0 reads the pointer fresh and broadcasts which save to
   load, so all ranks load the same one; each rank reads that manifest (verified against the
   pointer's checksum and its own seal, every field checked, JSON only) and DCP's ``Metadata``
   is rebuilt from it (:func:`~.dcp_format.metadata_of`). A ``.metadata`` pickle is never read;
3. ``prepare_local_plan`` / ``prepare_global_plan``: unchanged;
4. ``read_data`` (every rank): the byte spans of every tensor item are read with concurrent
   ranged GETs and verified block by block (:mod:`.fetch`), and every non-tensor value is
   decoded from JSON; only when all of this rank's reads verified are they copied into the
   destinations DCP's planner resolves, and the values handed to it.

Non-tensor values reach the state without ``torch.load``: for ``DefaultLoadPlanner`` and its
subclasses the decoded value is set where its ``load_bytes`` would set the unpickled one; other
planners get a ``CheckpointError`` rather than bytes to unpickle.

What ``CheckpointManager.restore`` adds and this reader does not: walking back past a damaged
checkpoint (here its error is raised: DCP's load has no second choice), and all-or-nothing across
ranks (each rank verifies all it reads before copying, but another rank may fail after this one
copied).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from streamio.checkpoint import layout
from streamio.checkpoint.catalog import read_manifest, read_pointer, resolve_save
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.records import Manifest
from streamio.checkpoint.restore import load_tensors
from streamio.checkpoint.serialize import StreamReader
from streamio.checkpoint.sharded.boxes import BoxSource, byte_span
from streamio.checkpoint.sharded.dcp_format import StepCheckpointId, metadata_of, values_by_rank
from streamio.checkpoint.sharded.fetch import Span, fetch_spans
from streamio.checkpoint.sharded.loading import check_chunks
from streamio.checkpoint.tree import decode_tree, dtype_from_name
from streamio.errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError
from streamio.storage import RetryPolicy, Store

__all__ = ["StreamioReader"]


class StreamioReader(StepCheckpointId, StorageReader):
    """torch DCP storage reader over a streamio checkpoint root; see the module docstring.

    Args:
        root_url: the checkpoint root (any fsspec URL).
        step: the step to load (default: the one ``latest.json`` names, read at each load).
        storage_options: fsspec options (endpoint, credentials); never logged or stored.
        retry: retry policy for transient storage errors.
        concurrency: parallel ranged GETs.
        collective_timeout_s: how long a rank waits for the others (every rank constructs it).

    Attributes:
        manifest: the manifest of the save being (or last) loaded.
    """

    def __init__(
        self, root_url: str, *, step: int | None = None, storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None, concurrency: int = 8, collective_timeout_s: float = 300.0,
    ) -> None:
        self.store = Store(root_url, storage_options, retry=retry)
        self.step = step
        self.concurrency = concurrency
        self.manifest: Manifest | None = None
        self._parts = self.store.for_verified_reads()
        self._path = ""
        self._comm = Comm(timeout_s=collective_timeout_s)

    def __repr__(self) -> str:
        return f"StreamioReader({self.store.root_url!r}, step={self.step})"

    # ------------------------------------------------------------------------ DCP's interface
    def read_metadata(self, *args: Any) -> Metadata:
        """DCP's ``Metadata`` of the save to load, rebuilt from its verified manifest.

        Raises:
            CheckpointNotFoundError: no pointer (and no ``step``), or no such step.
            CheckpointFormatError: the manifest does not verify, or was not written through DCP.
        """
        chosen = self._comm.broadcast(self._choose() if self._comm.rank == 0 else None)
        if isinstance(chosen, BaseException):
            raise chosen
        step, path, checksum = chosen
        self.manifest = read_manifest(self.store, step, path=path, checksum=checksum)
        self._path = path
        return metadata_of(self.manifest, f"checkpoint step {step} under {self.store.root_url}")

    def _choose(self) -> tuple[int, str, str | None] | BaseException:
        """Rank 0: ``(step, save directory, manifest checksum)`` to load, or the error to raise."""
        try:
            if self.step is not None:
                return self.step, resolve_save(self.store, self.step), None
            pointer = read_pointer(self.store)
            if pointer is None:
                raise CheckpointNotFoundError(f"no checkpoint under {self.store.root_url}: {layout.LATEST} is missing")
            return pointer.step, pointer.path, pointer.manifest_checksum
        except Exception as exc:  # raised on every rank
            return exc

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self.manifest is None:
            raise CheckpointError("StreamioReader.read_metadata() must run before set_up_storage_reader()")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Read and verify everything ``plan`` needs, then copy it into the planner's state.

        Raises:
            CorruptDataError: a block or part differs from its checksum (nothing was copied).
            CheckpointFormatError: a damaged entry; CheckpointError: a planner that would unpickle.
        """
        m = self.manifest
        if m is None:
            raise CheckpointError("StreamioReader.read_data() before read_metadata()")
        tensors = [r for r in plan.items if r.type != LoadItemType.BYTE_IO]
        boxes = [self._box(m, r) for r in tensors]
        pieces = fetch_spans(self._parts, m.files, [b[0] for b in boxes], sdir=self._path,
                             concurrency=self.concurrency)
        values = self._values(m, [r for r in plan.items if r.type == LoadItemType.BYTE_IO])
        streams = {rank: StreamReader(p, rank, self.store.url(self._path)) for rank, p in pieces.items()}
        for req, (span, sizes, dtype) in zip(tensors, boxes, strict=True):  # all verified: now copy
            if span.end == span.start:
                continue  # an empty box
            source = BoxSource(dtype, tuple(req.lengths), sizes, streams[span.rank].segments(span.start,
                                                                                            span.end - span.start))
            target = planner.resolve_tensor(req).detach()
            source.copy_into(target)
            planner.commit_tensor(req, target)
        for req, value in values:
            _deliver(planner, req, value)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    # ------------------------------------------------------------------------ helpers
    def _box(self, m: Manifest, req: ReadItem) -> tuple[Span, tuple[int, ...], torch.dtype]:
        """The stream span of the saved chunk ``req`` reads, its chunk's sizes and the dtype."""
        fqn, offsets = req.storage_index.fqn, tuple(req.storage_index.offset or ())
        entry = m.sharded.get(fqn)
        chunk = next((c for c in entry.chunks if c.offsets == offsets), None) if entry is not None else None
        if entry is None or chunk is None:
            raise CheckpointFormatError(f"the checkpoint has no chunk of {fqn!r} at {list(offsets)}")
        itemsize = check_chunks(fqn, entry)
        lengths = tuple(req.lengths)
        if 0 in lengths:
            return Span(chunk.rank, chunk.offset, chunk.offset), chunk.sizes, dtype_from_name(entry.dtype)
        a, b = byte_span(chunk.sizes, tuple(req.storage_offsets), lengths, itemsize)
        return Span(chunk.rank, chunk.offset + a, chunk.offset + b), chunk.sizes, dtype_from_name(entry.dtype)

    def _values(self, m: Manifest, reqs: list[ReadItem]) -> list[tuple[ReadItem, Any]]:
        """The non-tensor values ``reqs`` load, decoded from the per-rank trees (tensors nested in
        them read and verified like any per-rank tensor)."""
        where = values_by_rank(m)
        missing = [r.storage_index.fqn for r in reqs if r.storage_index.fqn not in where]
        if missing:
            raise CheckpointFormatError(f"the checkpoint has no value {missing[0]!r}")
        ranks = {where[r.storage_index.fqn] for r in reqs}
        wanted = {k: e for r in ranks for k, e in m.per_rank[r].tensors.items()}
        tensors = load_tensors(self._parts, m, wanted, concurrency=self.concurrency, sdir=self._path)
        return [(r, decode_tree(m.per_rank[where[fqn]].tree[fqn], tensors, path=fqn))
                for r in reqs for fqn in [r.storage_index.fqn]]


def _deliver(planner: LoadPlanner, req: ReadItem, value: Any) -> None:
    """Put a decoded value where the planner's ``load_bytes`` would put its unpickled bytes."""
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    if not isinstance(planner, DefaultLoadPlanner):
        raise CheckpointError(
            f"cannot load the non-tensor value {req.dest_index.fqn!r} through {type(planner).__name__}: streamio "
            f"stores such values as JSON and sets them itself for DefaultLoadPlanner and its subclasses, never "
            f"handing bytes to load_bytes (which would torch.load them)"
        )
    fqn = req.dest_index.fqn
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[fqn], value)
    else:
        planner.state_dict[fqn] = value
