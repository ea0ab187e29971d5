"""A rank's share of a save, written as parts: the one writer of part objects.

docs/design.md "Commit protocol", step 1. A snapshot's byte stream (:class:`~.snapshot.Snapshot`)
is cut into parts (:func:`part_size_for`), each encoded (optional zstd) and CRC'd once in a thread
of a bounded pool (:mod:`~..tensors.crcs`: the part's, its blocks' and its tensors' checksums are
combined from that one pass) and written with one ``Store.put``, the threads overlapping each
other's checksums and PUTs; then the store is listed
to check that every part is there with its size. The result (:class:`Share`) is what the rank's
done marker records. The durable root's commit and a local tier's (:mod:`.local`) write through
here alike, so a part has the same name, bytes and checksum on every tier; :func:`copy_share`
uploads a share already on one tier to another as it is. On local disk a rank's parts share one
directory fsync, its marker's (:func:`write_share`). Every part written, on any tier, adds its
stored bytes to ``streamio_checkpoint_bytes_total{direction="write"}`` (:mod:`streamio.metrics`);
the uploads of a share are the ``upload`` span.

The manifest assembled from the ranks' markers (:func:`assemble_manifest`) is the same function
on every tier too: a save published from a local tier has the manifest bytes the local commit had.
"""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from streamio.checkpoint.format import layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format.entries import FileEntry, Section
from streamio.checkpoint.format.manifest import DoneMarker, Manifest
from streamio.checkpoint.options import SaveOptions, part_size_for
from streamio.checkpoint.save.abandon import writing
from streamio.checkpoint.save.bound import UNBOUNDED, SaveBound
from streamio.checkpoint.save.plan import SavePlan
from streamio.checkpoint.save.snapshot import Snapshot
from streamio.checkpoint.tensors.crcs import Piece, Pieces, cut_points, scan
from streamio.checkpoint.tensors.serialize import encode_part, tensor_entries, verify_file
from streamio.checksum import crc32c, format_checksum
from streamio.errors import CheckpointError
from streamio.metrics.catalog import CHECKPOINT_BYTES
from streamio.metrics.trace import span
from streamio.pool import run_detached
from streamio.storage import Store
from streamio.version import __version__

__all__ = [
    "Share", "assemble_manifest", "check_written", "copy_share", "part_size_for", "share_ranges", "software_stack",
    "write_share",
]


@dataclass(frozen=True)
class Share:
    """One rank's share of a save, written: its parts and the done marker that records them."""

    files: tuple[FileEntry, ...]
    marker: DoneMarker


def software_stack() -> dict[str, Any]:
    """Versions recorded in each manifest, so a resume on another stack is visible."""
    cuda = torch.version.cuda
    return {
        "streamio": __version__,
        "torch": torch.__version__,
        "cuda": cuda,
        "cuda_device": torch.cuda.get_device_name(0) if cuda and torch.cuda.is_available() else None,
        "python": platform.python_version(),
    }


def share_ranges(store: Store, job: Snapshot, options: SaveOptions, *, world: int = 1) -> list[tuple[int, int]]:
    """The byte ranges of ``job``'s stream that :func:`write_share` writes as parts, one each."""
    return layout.split_ranges(job.total, part_size_for(job.total, options, local=store.is_local, world=world))


def write_share(
    store: Store, job: Snapshot, plan: SavePlan, rank: int, options: SaveOptions, *, world: int = 1,
    bound: SaveBound = UNBOUNDED,
) -> Share:
    """Write ``rank``'s parts of ``job`` into ``plan.sdir`` of ``store`` (one of ``world`` ranks) and
    check they are there. Each request goes through ``bound`` (:mod:`.bound`: refused once the
    save's deadline passed, named while in flight), on threads that nothing joins.

    Returns the share with its done marker (not written: the caller decides where it goes, and
    writes it next, before anything names the save). On local disk the parts' names are made durable
    by that marker's put (:func:`~..root.write_marker`): it fsyncs the rank directory, which holds
    every part, after every part's rename, so one directory fsync covers a share, not one per part.
    """
    ranges = share_ranges(store, job, options, world=world)
    cuts = cut_points((s.offset, s.nbytes) for s in job.recorded)

    def put(i: int) -> tuple[FileEntry, list[Piece]]:
        # the one CRC32C pass (and compression) run here, in parallel, overlapping the other PUTs
        start, end = ranges[i]
        size = job.block_size if options.compression is None else 0  # blocks: ranged reads of sharded state
        pieces = scan(job.stream, start, end, cuts, size)
        data = encode_part(job.stream[start:end], options.compression, options.zstd_level)
        own = Pieces(pieces)
        checksum = format_checksum(crc32c(data) if options.compression else own.crc(start, end - start))
        blocks = tuple(format_checksum(own.crc(b, min(size, end - b))) for b in range(start, end, size)) if size else ()
        path = layout.part_path(rank, plan.save_id, i)
        entry = FileEntry(path, rank, start, end - start, len(data), checksum, options.compression, size, blocks)
        key = plan.place.path(rank, entry.path)
        with bound.request(store.url(key)), writing(store.url(key)):
            store.put(key, data, sync_dir=False)  # the marker's put syncs the directory for all (docstring)
        CHECKPOINT_BYTES.add(len(data), "write")
        return entry, pieces

    with span("upload", step=plan.step):
        done = run_detached(put, range(len(ranges)), concurrency=max(1, options.concurrency), name="streamio-ckpt-put")
    files = [entry for entry, _ in done]
    # a tensor spanning two parts is combined from both parts' pieces
    entries = tensor_entries(job.recorded, rank, Pieces(p for _, pieces in done for p in pieces).crc)
    rep_entries = {k: e for k, e in entries.items() if k in job.replicated}
    rank_entries = {k: e for k, e in entries.items() if k not in job.replicated}
    with bound.request(store.url(plan.place.rank_dir(rank))):
        check_written(store, plan.place, rank, files)
    marker = DoneMarker(
        rank=rank, save_id=plan.save_id, files=tuple(files), replicated_tensors=rep_entries,
        per_rank=Section(tree=job.per_rank_tree, tensors=rank_entries), replicated_tree=job.replicated_tree,
        sharded=job.sharded,
    )
    return Share(tuple(files), marker)


def copy_share(
    source: Store, dest: Store, place: layout.Placement, share: Share, *, concurrency: int, bound: SaveBound = UNBOUNDED
) -> None:
    """Upload ``share``'s parts from ``source`` to ``dest`` as they are (same names and bytes), and
    check they arrived with their sizes. The bytes are checked against their CRC32C first: a
    local copy damaged since it was written is never published."""
    def put(f: FileEntry) -> None:
        path = place.path(f.rank, f.path)
        data = source.read_view(path)
        verify_file(data, f, source.url(path))
        with bound.request(dest.url(path)), writing(dest.url(path)):
            dest.put(path, data, sync_dir=False)  # the marker's put syncs the directory (see write_share)
        CHECKPOINT_BYTES.add(len(data), "write")

    with span("upload", save=share.marker.save_id):
        run_detached(put, share.files, concurrency=max(1, concurrency), name="streamio-ckpt-upload")
    with bound.request(dest.url(place.rank_dir(share.marker.rank))):
        check_written(dest, place, share.marker.rank, share.files)


def check_written(store: Store, place: layout.Placement, rank: int, files: Sequence[FileEntry]) -> None:
    """Every part of ``rank`` in the save at ``place`` is listed with the size it was written with."""
    if not files:
        return
    listed = {o.path: o.size for o in store.list(place.rank_dir(rank))}
    for f in files:
        size = listed.get(place.path(rank, f.path))
        if size != f.size:
            raise CheckpointError(
                f"{store.url(place.path(rank, f.path))} holds {size} bytes after upload, expected {f.size}: "
                f"the store did not keep the part; the save is abandoned"
            )


def assemble_manifest(plan: SavePlan, markers: Sequence[DoneMarker], job: Snapshot) -> Manifest:
    """The manifest of ``plan``'s save from every rank's marker (index = rank), on its timeline."""
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    manifest = mf.build_manifest(plan.step, list(markers), metrics=job.metrics, software=software_stack(),
                                 created=created)
    return dataclasses.replace(manifest, timeline=plan.timeline, parent=plan.parent, key_prefixes=plan.prefixes)
