"""What the ranks of a restore read once for all of them: the manifest, and the parts several need.

docs/design.md "Restore fan-out". Both are collectives that every rank runs at the same point of
every restore attempt (:meth:`~.walk.Restorer.restore`), also a rank that already failed, so that
the ranks never pair one attempt's messages with another's:

* :meth:`SharedReads.manifest`: rank 0 reads the root's manifest as stored and broadcasts the bytes
  to every rank that has no verified local copy; each parses and verifies them itself. One GET
  per job instead of one per rank.
* :meth:`SharedReads.parts`: the parts several ranks need are read once, each by one rank (one
  that holds it on its local tier where there is one), and broadcast
  (:mod:`~..tensors.fanout`).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamio.checkpoint.comm import Comm
from streamio.checkpoint.format.entries import TensorEntry
from streamio.checkpoint.format.layout import Placement
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.restore.candidates import Candidate
from streamio.checkpoint.root import read_manifest_bytes
from streamio.checkpoint.tensors.fanout import Key, share_reads
from streamio.checkpoint.tensors.fetch import Places, Read, places_of, plan_reads, read_nearest, tensor_spans
from streamio.storage import Store

__all__ = ["Found", "SharedReads"]


@dataclass(frozen=True)
class Found:
    """A save's verified manifest, the tensors this rank needs of it and where its parts are."""

    manifest: Manifest
    wanted: dict[str, TensorEntry]
    parts: Places
    src_rank: int


class SharedReads:
    """The reads a restore's ranks share (see the module docstring).

    Args:
        store: the checkpoint root (its manifests).
        comm: the restore's collectives.
        part_store: the Store parts are read through when no local tier holds them.
        concurrency: parallel GETs of a rank's share of the parts.
        fanout: share the parts (``SaveOptions.restore_fanout``); the manifest is always shared.
    """

    def __init__(self, store: Store, comm: Comm, part_store: Store, *, concurrency: int, fanout: bool) -> None:
        self.store, self.comm, self.part_store = store, comm, part_store
        self.concurrency, self.fanout = concurrency, fanout

    def manifest(self, c: Candidate, *, need: bool) -> bytes | memoryview | None:
        """The root's manifest of ``c`` as stored, read by rank 0 for every rank that has no local
        copy (a collective): one GET per job, not one per rank. ``None`` in one process, or when no
        rank needs it.

        Raises:
            what rank 0's read raised, on every rank that needs it.
        """
        if self.comm.world == 1 or not any(self.comm.all_gather(need)):
            return None
        data: bytes | None = None
        size: int | BaseException
        if self.comm.rank == 0:
            try:
                data = read_manifest_bytes(self.store, c.step, c.path)
                size = len(data)
            except Exception as exc:  # noqa: BLE001 - raised on every rank that needs it
                size = exc
        else:
            size = 0
        size = self.comm.broadcast(size)
        if isinstance(size, BaseException):
            if need:
                raise size
            return None
        return self.comm.broadcast_bytes(data, src=0, size=size)

    def parts(self, found: Found | None, c: Candidate) -> dict[Key, bytes | memoryview]:
        """The requests several ranks need, each read by one of them from its nearest copy and
        exchanged (:mod:`~..tensors.fanout`; a collective)."""
        if not self.fanout:
            return {}
        reads, held = None, set()
        if found is not None:
            reads = plan_reads(found.manifest.files, tensor_spans(found.wanted))
            held = {r.key for r in reads if len(found.parts.of(r.file)) > 1}  # on this node's local tier
        parts = found.parts if found is not None else places_of(self.part_store)
        # a rank reads only requests it wants itself (:func:`~..tensors.fanout.assign`): it has the manifest
        place = found.manifest.place(c.path) if found is not None else Placement(c.path)

        def read(r: Read) -> bytes | memoryview:
            return read_nearest(parts, place.path(r.file.rank, r.file.path), r)

        return share_reads(self.comm, reads, read, concurrency=self.concurrency, where=self.store.url(c.path),
                           held=held)
