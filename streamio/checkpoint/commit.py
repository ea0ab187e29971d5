"""The commit protocol: what makes a snapshot a checkpoint, and what is kept afterwards.

docs/design.md "Commit protocol". At every instant ``latest.json`` names a complete checkpoint,
so a ``kill -9`` anywhere costs at most the save in progress. :meth:`Committer.commit` runs, for
one :class:`~.snapshot.Snapshot` (a step's bytes on this rank, in host memory):

1. Each rank uploads its parts concurrently (a bounded pool of ``Store.put``, each thread also
   computing its part's CRC32C), checks their sizes in the store, then writes its done marker
   (create-only).
2. Barrier over the manager's gloo group (:class:`~.comm.Comm`: an all-gather of each rank's
   outcome, so a rank that failed makes every rank fail instead of hanging).
3. Rank 0 assembles ``manifest.json`` from the markers and writes it create-only.
4. Rank 0 replaces ``latest.json`` in one PUT conditional on the version it read before the save
   began (``if_match``; ``mode="create"`` when there was none). If another job wrote it meanwhile
   the PUT fails and :class:`~streamio.errors.CheckpointConflictError` stops this job: two jobs
   can never interleave their pointers. Backends without conditional writes cannot detect this
   (the store's ``put`` documents which do: S3 ``If-Match``, GCS generation match, local/memory).
5. Only then retention runs (rank 0, :mod:`.pruning`): the policy (:mod:`.retention`) says which
   steps to keep; obsolete steps lose their manifest first, then their parts. The step the
   pointer names is never deleted, so there is always a complete checkpoint.

Conflicts: a step that already has a manifest is refused (another job, or a step saved twice),
except a manifest left by an earlier run that died between its manifest and its pointer swap,
which is removed once this job has restored from an older step (:meth:`Committer._abandoned`).

``on_phase`` is called with the name of each phase as it completes (:data:`PHASES`); the kill
tests use it to ``kill -9`` the process there.
"""

from __future__ import annotations

import concurrent.futures
import logging
import platform
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import torch

from streamio.checkpoint import layout
from streamio.checkpoint import manifest as mf
from streamio.checkpoint.catalog import PhaseHook, pointed_step
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.options import SaveOptions, SaveStats
from streamio.checkpoint.pruning import Pruner
from streamio.checkpoint.records import DoneMarker, FileEntry, Pointer, Section
from streamio.checkpoint.retention import RetentionPolicy
from streamio.checkpoint.serialize import encode_part
from streamio.checkpoint.snapshot import Snapshot
from streamio.checkpoint.validate import ManifestError
from streamio.checksum import checksum_bytes
from streamio.errors import CheckpointConflictError, CheckpointError, ObjectNotFoundError, WriteConflictError
from streamio.pool import gather
from streamio.storage import Store

__all__ = ["PHASES", "Committer", "part_size_for", "software_stack"]

log = logging.getLogger(__name__)

PHASES = ("parts", "markers", "manifest", "pointer", "delete", "retention")
"""Phase names passed to ``on_phase``: "delete" is a step's manifest deleted, its parts not yet."""

_UNKNOWN = object()  # pointer version not read yet
_ABSENT = object()  # there was no pointer


def part_size_for(total: int, options: SaveOptions, *, local: bool = False) -> int:
    """Part size for a stream of ``total`` bytes: at most ``options.part_size``, but small enough
    that there are about two parts per upload thread (never below 4 MiB), so a small state still
    uploads in parallel.

    On a local root (``local``) each part costs a temp file, an fsync, a link and a directory
    fsync, and there are no slow requests to balance, so it is one part per upload thread: on
    local disk 8 parts of a 300 MB state reached durable in ~0.25 s after the snapshot against
    ~0.3-0.55 s for 16 (benchmarks/bench_checkpoint.py, 2 shared CPUs).
    """
    per_thread = -(-total // max(1, (1 if local else 2) * options.concurrency))
    return max(min(options.part_size, per_thread), min(options.part_size, 4 << 20))


def software_stack() -> dict[str, Any]:
    """Versions recorded in each manifest, so a resume on another stack is visible."""
    import streamio

    cuda = torch.version.cuda
    return {
        "streamio": streamio.__version__,
        "torch": torch.__version__,
        "cuda": cuda,
        "cuda_device": torch.cuda.get_device_name(0) if cuda and torch.cuda.is_available() else None,
        "python": platform.python_version(),
    }


class Committer:
    """Runs the commit protocol for one root, then retention (:attr:`pruner`); see the module docstring.

    Args:
        store: the checkpoint root.
        comm: the collectives (every rank holds a Committer and calls :meth:`commit` alike).
        options: part size, concurrency, compression.
        retention: which committed checkpoints to keep (applied by :attr:`pruner`).
        on_phase: called with each phase name as it completes (:data:`PHASES`).
    """

    def __init__(
        self, store: Store, comm: Comm, *, options: SaveOptions, retention: RetentionPolicy,
        on_phase: PhaseHook | None = None,
    ) -> None:
        self.store, self.comm, self.options = store, comm, options
        self.pruner = Pruner(store, retention, on_phase=on_phase)
        self._on_phase = on_phase
        self._pointer_version: Any = _UNKNOWN  # what the next pointer swap expects to replace
        self._restored_at: datetime | None = None  # when this job last restored

    def restored(self) -> None:
        """Note that this job has just restored: manifests written before now that the pointer
        never named are left from a crashed run (:meth:`_abandoned`); and, on rank 0, the
        pointer's version is what the first save will replace."""
        self._restored_at = datetime.now(timezone.utc)
        if self._pointer_version is _UNKNOWN and self.comm.rank == 0:
            self._pointer_version = self._read_pointer_version()

    def commit(self, job: Snapshot) -> SaveStats:
        """Make ``job`` the current checkpoint (collective), then apply retention.

        Raises:
            CheckpointConflictError: another job writes this root (or the step was saved).
            CheckpointError: any rank failed; the previous checkpoint stays current.
        """
        comm, store = self.comm, self.store
        sdir = layout.step_dir(job.step)
        save_id = comm.broadcast(uuid.uuid4().hex[:12] if comm.rank == 0 else None)
        failure: str | None = None
        own_exc: BaseException | None = None
        files: list[FileEntry] = []
        try:
            files = self._write_rank(job, save_id)
        except Exception as exc:  # reported to every rank below, then re-raised
            failure, own_exc = f"rank {comm.rank}: {type(exc).__name__}: {exc}", exc
        bad = [o for o in comm.all_gather(failure) if o is not None]  # the barrier
        if bad:
            if own_exc is not None and isinstance(own_exc, CheckpointError):
                raise own_exc
            raise CheckpointError(
                f"saving step {job.step} to {store.url(sdir)} failed on {len(bad)} rank(s): {bad[0]}; "
                f"the previous checkpoint stays current"
            ) from own_exc

        result: str | None = None
        commit_exc: BaseException | None = None
        if comm.rank == 0:
            try:
                self._publish(job, save_id)
            except Exception as exc:
                result, commit_exc = f"{type(exc).__name__}: {exc}", exc
        result = comm.broadcast(result)
        if commit_exc is not None:
            raise commit_exc
        if result is not None:
            raise CheckpointError(f"rank 0 could not commit step {job.step} to {store.url(sdir)}: {result}")
        durable = time.perf_counter() - job.started
        self.pruner.committed(job.step, job.metrics)
        if comm.rank == 0:
            self.pruner.prune(job.step)
        log.info("checkpoint step %d durable at %s (%.3f s blocked, %.3f s to durable)",
                 job.step, store.url(sdir), job.blocked_s, durable)
        return SaveStats(job.step, job.blocked_s, durable, sum(f.size for f in files), len(files))

    def _write_rank(self, job: Snapshot, save_id: str) -> list[FileEntry]:
        """This rank's share: parts uploaded and checked in the store, then its done marker."""
        comm, store, opts = self.comm, self.store, self.options
        sdir = layout.step_dir(job.step)
        if comm.rank == 0:
            self._check_step_free(job.step)
            if self._pointer_version is _UNKNOWN:
                self._pointer_version = self._read_pointer_version()
        local = store.is_local
        ranges = layout.split_ranges(job.total, part_size_for(job.total, opts, local=local))

        def upload(i: int) -> FileEntry:
            # checksum (and compression) run here, in parallel, overlapping the other PUTs
            start, end = ranges[i]
            data, checksum = encode_part(job.stream[start:end], opts.compression, opts.zstd_level)
            path = layout.part_path(comm.rank, save_id, i)
            entry = FileEntry(path, comm.rank, start, end - start, len(data), checksum, opts.compression)
            store.put(f"{sdir}/{entry.path}", data)
            return entry

        threads = max(1, opts.concurrency)
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="streamio-ckpt-put") as pool:
            entries_future = pool.submit(job.entries)  # tensor checksums, beside the uploads
            files = gather(pool, upload, range(len(ranges)))
            rep_entries, rank_entries = entries_future.result()
        self._check_uploaded(sdir, files)
        self._phase("parts")
        marker = DoneMarker(
            rank=comm.rank, save_id=save_id, files=tuple(files), replicated_tensors=rep_entries,
            per_rank=Section(tree=job.per_rank_tree, tensors=rank_entries), replicated_tree=job.replicated_tree,
        )
        store.put(f"{sdir}/{layout.marker_path(comm.rank, save_id)}", mf.marker_to_bytes(marker), mode="create")
        self._phase("markers")
        return files

    def _publish(self, job: Snapshot, save_id: str) -> None:
        """Rank 0: markers -> manifest (create-only) -> latest.json (compare-and-swap)."""
        store, sdir = self.store, layout.step_dir(job.step)
        markers_at = [f"{sdir}/{layout.marker_path(r, save_id)}" for r in range(self.comm.world)]
        markers = [mf.marker_from_bytes(b) for b in store.read_many(markers_at, concurrency=self.options.concurrency)]
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        manifest = mf.build_manifest(job.step, markers, metrics=job.metrics, software=software_stack(), created=created)
        data = mf.manifest_to_bytes(manifest)
        try:
            store.put(layout.manifest_path(job.step), data, mode="create")
        except WriteConflictError as exc:
            raise CheckpointConflictError(
                f"{store.url(layout.manifest_path(job.step))} was created by someone else while this job saved "
                f"step {job.step}: another job writes the same checkpoint root; give each job its own root"
            ) from exc
        self._phase("manifest")
        pointer = Pointer(step=job.step, path=sdir, manifest_checksum=checksum_bytes(data), save_id=save_id,
                          created=manifest.created)
        self._swap_pointer(pointer)
        self._phase("pointer")

    def _swap_pointer(self, pointer: Pointer) -> None:
        """Replace ``latest.json`` only if it is still the version this job last read or wrote."""
        store, expected, data = self.store, self._pointer_version, mf.pointer_to_bytes(pointer)
        try:
            if expected is _ABSENT:
                version = store.put(layout.LATEST, data, mode="create")
            elif expected is None:  # the store reports no versions: nothing to compare against
                version = store.put(layout.LATEST, data)
            else:
                version = store.put(layout.LATEST, data, if_match=expected)
        except (WriteConflictError, ObjectNotFoundError) as exc:
            was = "no pointer" if expected is _ABSENT else f"version {expected!r}"
            raise CheckpointConflictError(
                f"{store.url(layout.LATEST)} changed since this job last read it (expected {was}): another job "
                f"writes the same checkpoint root; step {pointer.step} is complete but not current. "
                f"Give each job its own root"
            ) from exc
        self._pointer_version = version

    def _check_step_free(self, step: int) -> None:
        path = layout.manifest_path(step)
        try:
            data = self.store.read(path)
        except FileNotFoundError:
            return
        if self._abandoned(data):
            log.warning(
                "%s was written by a save that never swapped %s (the job died in between) before this job "
                "resumed from an older step; it is removed so that step %d can be saved again",
                self.store.url(path), self.store.url(layout.LATEST), step,
            )
            self.store.delete(path)
            return
        raise CheckpointConflictError(
            f"step {step} is already committed at {self.store.url(layout.step_dir(step))}: another job writes this "
            f"root, or this job saves a step twice (save steps after the one restore() returned)"
        )

    def _abandoned(self, manifest_data: bytes) -> bool:
        """Whether a manifest in the way of a save is left from an earlier run's crashed save.

        It is if the pointer never named it (its step is past the pointer's) and it was written
        before this job restored: the job that wrote it died between the manifest and the
        pointer swap, and this job resumed from the previous checkpoint. Anything else (a
        manifest the pointer names, or one written after our restore: a live second job) stays
        a conflict.
        """
        if self._restored_at is None:
            return False
        try:
            found = mf.manifest_from_bytes(manifest_data)
        except ManifestError:
            return False
        try:
            created = datetime.fromisoformat(found.created)
        except ValueError:
            return False
        if created >= self._restored_at:
            return False
        pointed = pointed_step(self.store)
        return pointed is None or pointed < found.step

    def _check_uploaded(self, sdir: str, files: list[FileEntry]) -> None:
        if not files:
            return
        listed = {o.path: o.size for o in self.store.list(f"{sdir}/{layout.rank_dir(self.comm.rank)}")}
        for f in files:
            size = listed.get(f"{sdir}/{f.path}")
            if size != f.size:
                raise CheckpointError(
                    f"{self.store.url(f'{sdir}/{f.path}')} holds {size} bytes after upload, expected {f.size}: "
                    f"the store did not keep the part; the save is abandoned"
                )

    def _read_pointer_version(self) -> Any:
        """The pointer's version now: a token, ``None`` (store has none) or ``_ABSENT``."""
        try:
            return self.store.info(layout.LATEST).version
        except FileNotFoundError:
            return _ABSENT

    def _phase(self, name: str) -> None:
        if self._on_phase is not None:
            self._on_phase(name)
