"""What the ranks of a restore read once for all of them: the manifest, and the parts several need.

docs/design.md "Restore fan-out". Both are collectives that every rank runs at the same point of
every restore attempt (:meth:`~.walk.Restorer.restore`), also a rank that already failed, so that
the ranks never pair one attempt's messages with another's:

* :meth:`SharedReads.manifest`: rank 0 reads the root's manifest as stored and broadcasts the bytes
  to every rank that has no verified local copy; each parses and verifies them itself
  (:meth:`SharedReads.verified`), and reads them again from the store before judging the save
  when they do not verify. One GET per job instead of one per rank.
* :meth:`SharedReads.parts`: the parts several ranks need are read once, each by one rank (one
  that holds it on its local tier where there is one), and broadcast
  (:mod:`~..tensors.fanout`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from streamio.checkpoint.comm import Comm
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.entries import TensorEntry
from streamio.checkpoint.format.layout import Placement
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.restore.candidates import Candidate
from streamio.checkpoint.root import parse_manifest, read_manifest_bytes
from streamio.checkpoint.tensors.fanout import Key, share_reads
from streamio.checkpoint.tensors.fetch import Places, Read, Received, places_of, plan_reads, read_nearest, tensor_spans
from streamio.errors import TransientStorageError
from streamio.storage import Store

__all__ = ["Found", "SharedReads"]

log = logging.getLogger(__name__)


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

    def verified(self, c: Candidate, data: bytes | memoryview | None) -> Manifest:
        """The root's manifest of ``c``, verified (against ``c.checksum`` and its own seal) and
        parsed: ``data``, the bytes rank 0 read for every rank, or (``None``) read here.

        Bytes that do not verify are read again here before the save is judged, as parts are
        (:func:`~..tensors.fetch.read_confirmed`): a byte flipped on the way, or in rank 0's
        broadcast, never condemns a save whose stored manifest is intact.

        Raises:
            ManifestError: the manifest read again is the same and does not verify.
            TransientStorageError: the reads returned different bytes, neither verifying.
            CheckpointNotFoundError: the save has no manifest.
        """
        step, sdir, root = c.step, c.path, self.store
        url = root.url(layout.manifest_at(sdir))
        sent = data is not None and self.comm.rank != 0
        if data is None:
            data = read_manifest_bytes(root, step, sdir)
        try:
            return parse_manifest(root, step, sdir, data, c.checksum)
        except ManifestError as exc:
            damaged = exc
        again = read_manifest_bytes(root, step, sdir)
        try:
            manifest = parse_manifest(root, step, sdir, again, c.checksum)
        except ManifestError as exc:
            if again == data:
                raise
            reads = "the bytes rank 0 sent and a read here" if sent else "two reads"
            raise TransientStorageError(
                f"{url}: {reads} differ, neither verifying ({damaged}; then: {exc}): they are damaged on the way, "
                f"not in the store, so step {step} is not judged; retry the restore, and check the network path to "
                f"the store if this repeats"
            ) from exc
        log.warning("%s of %s did not verify (%s); a read here verified: they were damaged %s, not in the store",
                    "the bytes rank 0 read and sent" if sent else "a read", url, damaged,
                    "on rank 0 or on the way" if sent else "on the way")
        return manifest

    def parts(self, found: Found | None, c: Candidate) -> dict[Key, Received]:
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
