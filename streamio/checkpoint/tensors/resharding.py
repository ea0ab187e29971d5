"""Restoring sharded tensors onto whatever sharding the live state has: plan, read, verify, copy.

Restore decodes a state tree against the live objects (:mod:`~streamio.checkpoint.restore.plan`).
A ``{"$t": "dtensor"}`` reference there is a :class:`ShardedSource`: it *binds* to the live value
at its place and records a :class:`PendingRead`, touching nothing:

* a live tensor (a DTensor on any mesh and placements, or a plain tensor) of the saved global
  shape and dtype receives the bytes in place, into its local tensor;
* no live tensor there (a fresh optimizer's empty state, a plain value): a fresh CPU tensor of the
  global shape is filled with the whole tensor;
* a live tensor of another shape or dtype: a ``meta`` tensor of the saved shape stands in, so the
  mismatch check reports it (another model) and nothing is read for it.

Then :func:`read_pending` turns the pending reads into verified copies: torch DCP's own load
planner (``create_default_local_load_plan``) intersects the box each live tensor holds with the
saved chunks, which is the whole of resharding; the bytes each overlap needs are read as ranged,
block-verified GETs (:mod:`.fetch`), concurrently over every tensor; and each overlap becomes a
:class:`~.boxes.BoxSource` copy that ``apply`` runs only once every rank verified everything.

The chunks an overlap comes from must cover the destination exactly (checked here: the volumes
add up and no two overlaps intersect), so a damaged manifest can never leave elements unset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from streamio.checkpoint.format.entries import ChunkEntry, FileEntry, ShardedEntry
from streamio.checkpoint.format.layout import Placement
from streamio.checkpoint.tensors.boxes import BoxSource, byte_span, narrow
from streamio.checkpoint.tensors.fetch import Places, Span, fetch_spans, places_of
from streamio.checkpoint.tensors.serialize import StreamReader
from streamio.checkpoint.tensors.tree import dtype_from_name, is_dtensor
from streamio.errors import CheckpointFormatError
from streamio.storage import Store

__all__ = ["PendingRead", "ShardedSource", "check_chunks", "check_cover", "plan_boxes", "read_pending", "sources_for"]


@dataclass(frozen=True)
class PendingRead:
    """A sharded tensor to fill: ``target`` (live, or fresh) from the chunks of ``entry``."""

    key: str
    entry: ShardedEntry
    target: torch.Tensor


@dataclass(frozen=True)
class BoxRead:
    """One overlap: bytes of ``chunk`` (``span``: in its rank's stream) -> ``dest`` (a view)."""

    chunk: ChunkEntry
    span: Span
    lengths: tuple[int, ...]
    dest: torch.Tensor


class ShardedSource:
    """The manifest's sharded tensor ``key``, as :func:`~.tree.decode_tree` sees it.

    Args:
        key: its key in the manifest's ``sharded`` section.
        entry: the entry.
        pending: where :meth:`bind` records what to read (shared by every source of a restore).
    """

    def __init__(self, key: str, entry: ShardedEntry, pending: list[PendingRead]) -> None:
        self.key, self.entry, self._pending = key, entry, pending

    def bind(self, template: Any, path: str) -> torch.Tensor:
        """The value at ``path`` once loaded: the live tensor (filled later) or a fresh one."""
        dtype, shape = dtype_from_name(self.entry.dtype), torch.Size(self.entry.shape)
        if isinstance(template, torch.Tensor) and not template.is_inference():
            if template.shape != shape or template.dtype != dtype:
                return torch.empty(shape, dtype=dtype, device="meta")  # reported by the mismatch check
            target = template
        else:
            target = torch.empty(shape, dtype=dtype)
        self._pending.append(PendingRead(self.key, self.entry, target))
        return target


def sources_for(sharded: Mapping[str, ShardedEntry]) -> tuple[dict[str, ShardedSource], list[PendingRead]]:
    """A source per sharded tensor of a manifest, and the list their bindings fill."""
    pending: list[PendingRead] = []
    return {k: ShardedSource(k, e, pending) for k, e in sharded.items()}, pending


def _metadata(key: str, entry: ShardedEntry) -> Any:
    """DCP's ``Metadata`` of one saved tensor (what its load planner intersects with)."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    chunks = [ChunkStorageMetadata(torch.Size(c.offsets), torch.Size(c.sizes)) for c in entry.chunks]
    md = TensorStorageMetadata(TensorProperties(dtype=dtype_from_name(entry.dtype)), torch.Size(entry.shape), chunks)
    return Metadata({key: md})


def check_chunks(key: str, entry: ShardedEntry) -> int:
    """The element size of ``entry``'s dtype, once every chunk's byte count matches its box.

    Raises:
        CheckpointFormatError: a chunk is not ``prod(sizes) * element size`` bytes.
    """
    itemsize = torch.empty((), dtype=dtype_from_name(entry.dtype)).element_size()
    for c in entry.chunks:
        if c.nbytes != math.prod(c.sizes) * itemsize:
            raise CheckpointFormatError(
                f"sharded tensor {key!r}: the chunk at {list(c.offsets)} is {c.nbytes} bytes, not "
                f"{entry.dtype}{list(c.sizes)}"
            )
    return itemsize


def plan_boxes(key: str, entry: ShardedEntry, live: torch.Tensor) -> list[BoxRead]:
    """The overlaps of the saved chunks with the box ``live`` holds (DCP's load planner).

    Raises:
        CheckpointFormatError: a chunk's byte count does not match its box, or the overlaps do
            not cover the destination exactly once (the manifest is damaged).
    """
    from torch.distributed.checkpoint.default_planner import create_default_local_load_plan

    itemsize = check_chunks(key, entry)
    local = (live.to_local() if is_dtensor(live) else live).detach()
    items = create_default_local_load_plan({key: live}, _metadata(key, entry), True).items
    by_offsets = {c.offsets: c for c in entry.chunks}
    reads = []
    for item in items:
        chunk = by_offsets[tuple(item.storage_index.offset or ())]
        lengths = tuple(item.lengths)
        if 0 in lengths:
            continue
        a, b = byte_span(chunk.sizes, item.storage_offsets, lengths, itemsize)
        dest = narrow(local, tuple(item.dest_offsets), lengths)
        reads.append(BoxRead(chunk, Span(chunk.rank, chunk.offset + a, chunk.offset + b), lengths, dest))
    check_cover(key, items, local.numel())
    return reads


def check_cover(key: str, items: list[Any], numel: int | None) -> None:
    """DCP read items (``dest_offsets``, ``lengths``) fill a destination of ``numel`` elements
    exactly: no two of them intersect and (``numel`` known) their volumes add up to it.

    Raises:
        CheckpointFormatError: they overlap or leave elements unset (the manifest is damaged).
    """
    boxes = [(tuple(i.dest_offsets), tuple(i.lengths)) for i in items if 0 not in tuple(i.lengths)]
    volume = sum(math.prod(n) for _, n in boxes)
    overlap = any(
        all(oa < ob + nb and ob < oa + na for oa, na, ob, nb in zip(a[0], a[1], b[0], b[1], strict=True))
        for i, a in enumerate(boxes) for b in boxes[i + 1:]
    )
    if overlap or (numel is not None and volume != numel):
        held = f" of the {numel} elements this rank holds" if numel is not None else ""
        raise CheckpointFormatError(
            f"sharded tensor {key!r}: the saved chunks cover {volume}{held}{' and overlap' if overlap else ''}: "
            f"the manifest is damaged"
        )


def read_pending(
    store: Store | Places, files: tuple[FileEntry, ...], pending: list[PendingRead], *, place: Placement,
    concurrency: int,
) -> list[tuple[BoxSource, torch.Tensor]]:
    """Plan, read and verify every pending sharded tensor; the copies that load them.

    Raises:
        CheckpointFormatError: a damaged sharded entry (see :func:`plan_boxes`).
        CorruptDataError: a block or part differs from its checksum, or is not listed.
    """
    reads = [r for p in pending for r in plan_boxes(p.key, p.entry, p.target)]
    pieces = fetch_spans(store, files, [r.span for r in reads], place=place, concurrency=concurrency)
    url = places_of(store).root.url(place.sdir)
    streams = {rank: StreamReader(got, rank, url) for rank, got in pieces.items()}
    copies = []
    for r in reads:
        segments = streams[r.span.rank].segments(r.span.start, r.span.end - r.span.start)
        copies.append((BoxSource(r.dest.dtype, r.lengths, r.chunk.sizes, segments), r.dest))
    return copies
