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
5. Only then pruning runs (rank 0, :mod:`.pruning`): saves of abandoned timelines and bad saves
   are retired, then the policy (:mod:`~..format.retention`) says which checkpoints of the current
   timeline to keep; deleted saves lose their manifest first, then their parts. The save the
   pointer names is never deleted, so there is always a complete checkpoint.

A save that fails before its manifest exists removes what each rank wrote (:mod:`.abandon`).

Timelines (:mod:`~..format.timeline`, docs/checkpoint-lifecycle.md): every job saves on a timeline of its
own, continuing the save it restored (or, if it did not restore, the one the pointer names), so
a step saved again after a restore went back past it does not collide with the old save: it
gets a save directory of its own (:func:`~..format.layout.save_dir`) and supersedes it. The pointer and
the manifest record the timeline. Two live jobs on one root are still stopped by the fencing
above: whichever swaps the pointer second finds it changed. Refused before anything is
uploaded: a step this job already saved (or one before it) on its timeline, and, for a job that
never restored, a step at or before the pointer's or one that already has a manifest (another
job writes this root, or the job forgot ``restore()``).

``on_phase`` is called with the name of each phase as it completes (:data:`PHASES`); the kill
tests use it to ``kill -9`` the process there.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import platform
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from streamio.checkpoint import root
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.format import layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.entries import FileEntry, Section
from streamio.checkpoint.format.manifest import DoneMarker, Manifest
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.format.retention import RetentionPolicy
from streamio.checkpoint.format.timeline import Point, Timeline, Tip, branch
from streamio.checkpoint.options import SaveOptions, SaveStats
from streamio.checkpoint.root import ABSENT, PhaseHook, pointer_version, read_pointer
from streamio.checkpoint.save.abandon import FailedShares, uncommitted, writing
from streamio.checkpoint.save.pruning import Pruner
from streamio.checkpoint.save.snapshot import Snapshot
from streamio.checkpoint.tensors.serialize import block_checksums, encode_part
from streamio.errors import CheckpointConflictError, CheckpointError, ObjectNotFoundError, WriteConflictError
from streamio.pool import gather
from streamio.storage import Store
from streamio.version import __version__

__all__ = ["PHASES", "Committer", "part_size_for", "software_stack"]

log = logging.getLogger(__name__)

PHASES = ("parts", "markers", "manifest", "pointer", "delete", "retention")
"""Phase names passed to ``on_phase``: "delete" is a step's manifest deleted, its parts not yet."""

_UNKNOWN = object()  # pointer version not read yet


@dataclass(frozen=True)
class _Plan:
    """Rank 0's decisions for one save: where it goes and on which timeline."""

    save_id: str
    sdir: str
    timeline: Timeline
    parent: str  # the save directory this save follows ("" if none)


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
    cuda = torch.version.cuda
    return {
        "streamio": __version__,
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
        retention: which committed checkpoints to keep (applied by :attr:`pruner`); ``None``: the
            policy the root records.
        on_phase: called with each phase name as it completes (:data:`PHASES`).
    """

    def __init__(
        self, store: Store, comm: Comm, *, options: SaveOptions, retention: RetentionPolicy | None,
        on_phase: PhaseHook | None = None,
    ) -> None:
        self.store, self.comm, self.options = store, comm, options
        self.pruner = Pruner(store, retention, on_phase=on_phase)
        self._failed = FailedShares(store, comm.rank)  # what failed saves of this rank left
        self._on_phase = on_phase
        self._pointer_version: Any = _UNKNOWN  # what the next pointer swap expects to replace
        # rank 0's view of where this job stands (the other ranks follow its broadcast):
        self._parent: Point | None = None  # what the job's next new timeline continues
        self._restored = False  # restore() said where the job stands
        self._timeline: Timeline | None = None  # the job's timeline, once it committed on it
        self._last: Point | None = None  # the job's last commit

    def restored(self, outcome: tuple[Point, Any] | None = None) -> None:
        """Note that this job has just restored the save ``outcome[0]``, reading the pointer's
        version ``outcome[1]`` (rank 0) before it read anything: its next save starts a new
        timeline continuing that save, and its pointer swap expects that version."""
        self._restored, self._timeline, self._last = True, None, None
        self._parent = outcome[0] if outcome is not None else None
        if self.comm.rank == 0:
            self._pointer_version = outcome[1] if outcome is not None else pointer_version(self.store)

    def commit(self, job: Snapshot) -> SaveStats:
        """Make ``job`` the current checkpoint (collective), then prune (rank 0).

        Raises:
            CheckpointConflictError: another job writes this root (or the step was saved).
            CheckpointError: any rank failed; the previous checkpoint stays current.
        """
        comm, store = self.comm, self.store
        self._failed.retry()
        plan, save_id, sdir = self._agreed_plan(job.step)
        failure: str | None = None
        own_exc: BaseException | None = None
        files: list[FileEntry] = []
        try:
            files = self._write_rank(job, save_id, sdir)
        except Exception as exc:  # reported to every rank below, then re-raised
            failure, own_exc = f"rank {comm.rank}: {type(exc).__name__}: {exc}", exc
        bad = [o for o in comm.all_gather(failure) if o is not None]  # the barrier
        if bad:  # every rank knows: no manifest of this save was or will be written
            self._failed.discard(sdir, save_id)
            if isinstance(own_exc, CheckpointError):
                raise own_exc
            raise CheckpointError(
                f"saving step {job.step} to {store.url(sdir)} failed on {len(bad)} rank(s): {bad[0]}; "
                f"the previous checkpoint stays current"
            ) from own_exc

        result: str | None = None
        commit_exc: BaseException | None = None
        manifest: Manifest | None = None
        discard = False
        if comm.rank == 0:
            assert plan is not None
            try:
                manifest = self._publish(job, plan)
            except Exception as exc:
                result, commit_exc = f"{type(exc).__name__}: {exc}", exc
                self._abandon_timeline()
                discard = uncommitted(store, job.step, sdir, save_id)
        result, discard = comm.broadcast((result, discard))
        if discard:
            self._failed.discard(sdir, save_id)
        if commit_exc is not None:
            raise commit_exc
        if result is not None:
            raise CheckpointError(f"rank 0 could not commit step {job.step} to {store.url(sdir)}: {result}")
        durable = time.perf_counter() - job.started
        if comm.rank == 0:
            assert plan is not None and manifest is not None
            self._committed(plan, manifest)
        log.info("checkpoint step %d durable at %s (%.3f s blocked, %.3f s to durable)",
                 job.step, store.url(sdir), job.blocked_s, durable)
        return SaveStats(job.step, job.blocked_s, durable, sum(f.size for f in files), len(files))

    def _agreed_plan(self, step: int) -> tuple[_Plan | None, str, str]:
        """Rank 0's :meth:`_plan` and, on every rank, its save id and directory (its error
        raised on every rank)."""
        plan, plan_exc = None, None
        if self.comm.rank == 0:
            try:
                plan = self._plan(step)
            except Exception as exc:  # reported to every rank, raised here
                plan_exc = exc
        shared = self.comm.broadcast((plan.save_id, plan.sdir) if plan else f"{type(plan_exc).__name__}: {plan_exc}")
        if plan_exc is not None:
            raise plan_exc
        if isinstance(shared, str):
            raise CheckpointError(f"rank 0 could not start saving step {step} under {self.store.root_url}: {shared}")
        return plan, shared[0], shared[1]

    def _committed(self, plan: _Plan, manifest: Manifest) -> None:
        """Rank 0, once the pointer names ``manifest``: the job is on ``plan``'s timeline; prune."""
        step = manifest.step
        self._timeline, self._last = plan.timeline, Point(plan.timeline, step, plan.sdir)
        self.pruner.committed(plan.sdir, manifest)
        compacted = self.pruner.prune(Tip(plan.timeline, step), plan.sdir)
        if compacted is not None:
            self._timeline = compacted

    def _plan(self, step: int) -> _Plan:
        """Rank 0, before anything is uploaded: the save's id, directory and timeline.

        Raises:
            CheckpointConflictError: the step is not past this job's last save on its timeline,
                or (a job that never restored) not past the pointer's, or already has a manifest.
            CheckpointError: the pointer is unusable and this job never restored.
        """
        store = self.store
        if self._pointer_version is _UNKNOWN:
            self._pointer_version = pointer_version(store)
        if self._timeline is not None and self._last is not None:
            if step <= self._last.step:
                what = ("is already committed by this job" if step == self._last.step
                        else f"comes before step {self._last.step}, which this job saved last")
                raise CheckpointConflictError(
                    f"step {step} {what} (at {store.url(self._last.path)}): another job writes this root, or this "
                    f"job saves a step twice (save steps after the one save() or restore() was given last)"
                )
            timeline, parent = self._timeline, self._last.path
        else:
            start = self._parent
            if start is None:
                start = _pointed_start(store, step, strict=not self._restored)
            try:
                timeline = branch(start.timeline if start else None, start.step if start else None,
                                  new_id=uuid.uuid4().hex[:12], first_step=step)
            except ValueError as exc:
                raise CheckpointError(f"cannot save step {step} under {store.root_url}: {exc}") from exc
            parent = start.path if start else ""
        save_id = layout.new_save_id(time.time(), uuid.uuid4().hex)
        taken = root.has_manifest(store, layout.step_dir(step))
        return _Plan(save_id, layout.save_dir(step, save_id if taken else ""), timeline, parent)

    def _abandon_timeline(self) -> None:
        """After a commit failed past the manifest, the next save starts a new timeline from this
        job's last commit, so it never shares ``(timeline, step)`` with the failed save."""
        if self._last is not None:
            self._parent, self._restored = self._last, True
        self._timeline = None

    def _write_rank(self, job: Snapshot, save_id: str, sdir: str) -> list[FileEntry]:
        """This rank's share: parts uploaded and checked in the store, then its done marker."""
        comm, store, opts = self.comm, self.store, self.options
        local = store.is_local
        ranges = layout.split_ranges(job.total, part_size_for(job.total, opts, local=local))

        def upload(i: int) -> FileEntry:
            # checksum (and compression) run here, in parallel, overlapping the other PUTs
            start, end = ranges[i]
            data, checksum = encode_part(job.stream[start:end], opts.compression, opts.zstd_level)
            path = layout.part_path(comm.rank, save_id, i)
            size = job.block_size if opts.compression is None else 0  # blocks: ranged reads of sharded state
            blocks = block_checksums(job.stream[start:end], size) if size else ()
            entry = FileEntry(path, comm.rank, start, end - start, len(data), checksum, opts.compression, size, blocks)
            with writing(store.url(f"{sdir}/{entry.path}")):
                store.put(f"{sdir}/{entry.path}", data)
            return entry

        threads = max(1, opts.concurrency)
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="streamio-ckpt-put") as pool:
            entries_future = pool.submit(job.entries)  # tensor checksums, beside the uploads
            files = gather(pool, upload, range(len(ranges)))
            rep_entries, rank_entries = entries_future.result()
        _check_uploaded(store, sdir, comm.rank, files)
        self._phase("parts")
        marker = DoneMarker(
            rank=comm.rank, save_id=save_id, files=tuple(files), replicated_tensors=rep_entries,
            per_rank=Section(tree=job.per_rank_tree, tensors=rank_entries), replicated_tree=job.replicated_tree,
            sharded=job.sharded,
        )
        with writing(store.url(f"{sdir}/{layout.marker_path(comm.rank, save_id)}")):
            root.write_marker(store, sdir, marker)
        self._phase("markers")
        return files

    def _publish(self, job: Snapshot, plan: _Plan) -> Manifest:
        """Rank 0: markers -> manifest (create-only) -> latest.json (compare-and-swap)."""
        store, sdir, save_id = self.store, plan.sdir, plan.save_id
        markers = root.read_markers(store, sdir, save_id, self.comm.world, concurrency=self.options.concurrency)
        created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        manifest = mf.build_manifest(job.step, markers, metrics=job.metrics, software=software_stack(), created=created)
        manifest = dataclasses.replace(manifest, timeline=plan.timeline, parent=plan.parent)
        try:
            with writing(store.url(layout.manifest_at(sdir))):
                digest = root.create_manifest(store, sdir, manifest)
        except WriteConflictError as exc:
            raise CheckpointConflictError(
                f"{store.url(layout.manifest_at(sdir))} was created by someone else while this job saved "
                f"step {job.step}: another job writes the same checkpoint root; give each job its own root"
            ) from exc
        self._phase("manifest")
        pointer = Pointer(step=job.step, path=sdir, manifest_checksum=digest, save_id=save_id,
                          created=manifest.created, timeline=plan.timeline)
        with writing(root.pointer_url(store)):
            self._swap_pointer(pointer)
        self._phase("pointer")
        return manifest

    def _swap_pointer(self, pointer: Pointer) -> None:
        """Replace ``latest.json`` only if it is still the version this job last read or wrote."""
        store, expected = self.store, self._pointer_version
        try:
            version = root.swap_pointer(store, pointer, expected)
        except (WriteConflictError, ObjectNotFoundError) as exc:
            was = "no pointer" if expected is ABSENT else f"version {expected!r}"
            raise CheckpointConflictError(
                f"{root.pointer_url(store)} changed since this job last read it (expected {was}): another job "
                f"writes the same checkpoint root; step {pointer.step} is complete but not current. "
                f"Give each job its own root"
            ) from exc
        self._pointer_version = version

    def _phase(self, name: str) -> None:
        if self._on_phase is not None:
            self._on_phase(name)


def _check_uploaded(store: Store, sdir: str, rank: int, files: list[FileEntry]) -> None:
    """Every part of ``rank`` in ``sdir`` is listed with the size it was uploaded with."""
    if not files:
        return
    listed = {o.path: o.size for o in store.list(f"{sdir}/{layout.rank_dir(rank)}")}
    for f in files:
        size = listed.get(f"{sdir}/{f.path}")
        if size != f.size:
            raise CheckpointError(
                f"{store.url(f'{sdir}/{f.path}')} holds {size} bytes after upload, expected {f.size}: "
                f"the store did not keep the part; the save is abandoned"
            )


def _pointed_start(store: Store, step: int, *, strict: bool) -> Point | None:
    """Where a job stands that restored nothing: at the pointer; ``strict`` (it never called
    restore()): only if its first step is past the pointer's and has no manifest yet."""
    try:
        pointer = read_pointer(store)
    except ManifestError as exc:
        raise CheckpointError(
            f"{root.pointer_url(store)} is unusable ({exc}) and this job did not restore: call restore() "
            f"first (it walks back to the newest complete checkpoint), then save"
        ) from exc
    if pointer is None:
        return None
    if strict and (step <= pointer.step or root.has_manifest(store, layout.step_dir(step))):
        raise CheckpointConflictError(
            f"step {step} is already committed under {store.root_url} (latest.json names step "
            f"{pointer.step}): another job writes this root, or this job did not call restore() "
            f"(restore first; restore(state, step=...) goes back to an earlier step)"
        )
    return Point(pointer.timeline, pointer.step, pointer.path)
