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
   is rebuilt from it (:func:`~.metadata.metadata_of`). A ``.metadata`` pickle is never read;
3. ``prepare_local_plan`` / ``prepare_global_plan``: unchanged;
4. ``read_data`` (every rank): the byte spans of every tensor item are read with concurrent
   ranged GETs and verified block by block (:mod:`~..tensors.fetch`), and every non-tensor value is
   decoded from JSON; only when all of this rank's reads verified are they copied into the
   destinations DCP's planner resolves, and the values handed to it.

Non-tensor values reach the state without ``torch.load``: for ``DefaultLoadPlanner`` and its
subclasses the decoded value is set where its ``load_bytes`` would set the unpickled one; other
planners get a ``CheckpointError`` rather than bytes to unpickle.

Errors. ``dcp.load`` catches every error of a storage reader and raises torch's
``CheckpointException`` instead (a ``BaseException``, which ``except Exception`` does not catch,
carrying each rank's error in ``failures``); an error of ``read_metadata`` survives there only as
text inside an ``AssertionError``. :meth:`StreamioReader.load` runs ``dcp.load`` with this reader
and raises streamio's error itself: the one this reader raised on this rank, else another rank's
streamio error, else a :class:`~streamio.errors.CheckpointError` naming the checkpoint and what
torch's planner said (a state that does not fit the checkpoint). Everything a hostile manifest
can declare is refused as a :class:`~streamio.errors.CheckpointFormatError` before torch's
planner sees it (the manifest's checks, and the planner data's: :mod:`.metadata`), and the
reads planned for each tensor must fill it exactly once (:func:`~..tensors.resharding.check_cover`).

Metrics (:mod:`streamio.metrics`): ``streamio_checkpoint_seconds{phase="restore"}`` is the time in
``read_data`` (the reads, their checks and the copies; the metadata read before it is not
included), and the parts' bytes count as a manager's restore does.

What ``CheckpointManager.restore`` adds and this reader does not: walking back past a damaged
checkpoint (here its error is raised: DCP's load has no second choice), and all-or-nothing across
ranks (each rank verifies all it reads before copying, but another rank may fail after this one
copied).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from streamio.checkpoint.comm import Comm
from streamio.checkpoint.dcp.metadata import StepCheckpointId, dcp_failure, metadata_of, values_by_rank
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.root import read_manifest, read_pointer, resolve_save
from streamio.checkpoint.tensors.boxes import BoxSource, byte_span
from streamio.checkpoint.tensors.fetch import Span, fetch_spans, load_tensors
from streamio.checkpoint.tensors.resharding import check_chunks, check_cover
from streamio.checkpoint.tensors.serialize import StreamReader
from streamio.checkpoint.tensors.tree import decode_tree, dtype_from_name, is_dtensor
from streamio.errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError, StreamioError
from streamio.metrics.catalog import CHECKPOINT_SECONDS
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
        comm: the collectives (default: gloo groups of its own, made here with ``collective_timeout_s``);
            a job that reads many roots shares one.

    Attributes:
        manifest: the manifest of the save being (or last) loaded.
    """

    def __init__(
        self, root_url: str, *, step: int | None = None, storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None, concurrency: int = 8, collective_timeout_s: float = 300.0,
        comm: Comm | None = None,
    ) -> None:
        self.store = Store(root_url, storage_options, retry=retry)
        self.step = step
        self.concurrency = concurrency
        self.manifest: Manifest | None = None
        self._parts = self.store.for_verified_reads()
        self._path = ""
        self._what = f"the checkpoint under {self.store.root_url}"  # the save being loaded, for messages
        self._failure: StreamioError | None = None  # what this reader raised during the load in progress
        self._comm = comm or Comm(timeout_s=collective_timeout_s)

    def __repr__(self) -> str:
        return f"StreamioReader({self.store.root_url!r}, step={self.step})"

    def load(self, state_dict: dict[str, Any], *, planner: LoadPlanner | None = None,
             process_group: Any = None) -> None:
        """``torch.distributed.checkpoint.load(state_dict, storage_reader=self, ...)``, raising
        streamio's errors rather than torch's ``CheckpointException`` (see the module docstring).

        Raises:
            CheckpointNotFoundError: no pointer (and no ``step``), or no such step.
            CheckpointFormatError: the manifest does not verify, or declares what cannot be.
            CorruptDataError: a block or part differs from its checksum (nothing was copied).
            CheckpointError: the checkpoint does not fit ``state_dict`` (torch's planner's error).
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        self._failure = None
        try:
            dcp.load(state_dict, storage_reader=self, planner=planner, process_group=process_group)
        except CheckpointException as exc:
            raise self._unwrapped(exc) from exc

    def _unwrapped(self, exc: Any) -> BaseException:
        """The error to raise for DCP's ``CheckpointException``."""
        return dcp_failure(exc, self._failure, self._comm.rank, f"loading {self._what}",
                           "the state does not fit the checkpoint: another model, or keys it does not hold")

    # ------------------------------------------------------------------------ DCP's interface
    def read_metadata(self, *args: Any) -> Metadata:
        """DCP's ``Metadata`` of the save to load, rebuilt from its verified manifest.

        Raises:
            CheckpointNotFoundError: no pointer (and no ``step``), or no such step.
            CheckpointFormatError: the manifest does not verify, or was not written through DCP.
        """
        try:
            chosen = self._comm.broadcast(self._choose() if self._comm.rank == 0 else None)
            if isinstance(chosen, BaseException):
                raise chosen
            step, path, checksum = chosen
            self._what = f"checkpoint step {step} at {self.store.url(path)}"
            self.manifest = read_manifest(self.store, step, path=path, checksum=checksum)
            self._path = path
            return metadata_of(self.manifest, self._what)
        except StreamioError as exc:  # dcp.load keeps only its text: load() raises it as it is
            self._failure = exc
            raise

    def _choose(self) -> tuple[int, str, str | None] | BaseException:
        """Rank 0: ``(step, save directory, manifest checksum)`` to load, or the error to raise."""
        try:
            if self.step is not None:
                return self.step, resolve_save(self.store, self.step), None
            pointer = read_pointer(self.store)
            if pointer is None:
                raise CheckpointNotFoundError(f"no checkpoint under {self.store.root_url}: latest.json is missing")
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
        began = time.perf_counter()
        try:
            self._read(m, plan, planner)
        except StreamioError as exc:
            self._failure = exc
            raise
        CHECKPOINT_SECONDS.observe(time.perf_counter() - began, "restore")
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read(self, m: Manifest, plan: LoadPlan, planner: LoadPlanner) -> None:
        tensors = [r for r in plan.items if r.type != LoadItemType.BYTE_IO]
        boxes = [self._box(m, r) for r in tensors]
        by_dest: dict[str, list[ReadItem]] = defaultdict(list)
        for req in tensors:
            by_dest[req.dest_index.fqn].append(req)
        for fqn, reqs in by_dest.items():  # a damaged manifest's overlapping chunks would leave elements unset
            try:
                check_cover(fqn, reqs, _held(planner, fqn))
            except CheckpointFormatError as exc:
                raise CheckpointFormatError(f"{self._what}: {exc}") from exc
        pieces = fetch_spans(self._parts, m.files, [b[0] for b in boxes], place=m.place(self._path),
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

    # ------------------------------------------------------------------------ helpers
    def _box(self, m: Manifest, req: ReadItem) -> tuple[Span, tuple[int, ...], torch.dtype]:
        """The stream span of the saved chunk ``req`` reads, its chunk's sizes and the dtype."""
        fqn, offsets = req.storage_index.fqn, tuple(req.storage_index.offset or ())
        entry = m.sharded.get(fqn)
        chunk = next((c for c in entry.chunks if c.offsets == offsets), None) if entry is not None else None
        if entry is None or chunk is None:
            raise CheckpointFormatError(f"{self._what} has no chunk of {fqn!r} at {list(offsets)}")
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
            raise CheckpointFormatError(f"{self._what} has no value {missing[0]!r}")
        ranks = {where[r.storage_index.fqn] for r in reqs}
        wanted = {k: e for r in ranks for k, e in m.per_rank[r].tensors.items()}
        tensors = load_tensors(self._parts, m, wanted, concurrency=self.concurrency, sdir=self._path)
        return [(r, decode_tree(m.per_rank[where[fqn]].tree[fqn], tensors, path=fqn))
                for r in reqs for fqn in [r.storage_index.fqn]]


def _held(planner: LoadPlanner, fqn: str) -> int | None:
    """Elements of the destination ``fqn`` on this rank, where the planner says (DCP's default)."""
    state = getattr(planner, "state_dict", None)
    value = state.get(fqn) if isinstance(state, Mapping) else None
    if is_dtensor(value):
        value = value.to_local()
    return value.numel() if isinstance(value, torch.Tensor) else None


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
