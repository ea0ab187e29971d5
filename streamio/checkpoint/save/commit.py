"""The commit protocol: what makes a snapshot a checkpoint, and what is kept afterwards.

docs/design.md "Commit protocol". At every instant ``latest.json`` names a complete checkpoint,
so a ``kill -9`` anywhere costs at most the save in progress. :meth:`Committer.commit` runs, for
one :class:`~.snapshot.Snapshot` (a step's bytes on this rank, in host memory):

1. Each rank uploads its parts concurrently (:mod:`.parts`: a bounded pool of ``Store.put``,
   each thread also computing its part's CRC32C), checks their sizes in the store, then writes its
   done marker (create-only). A save already committed on a local tier (:meth:`Committer.upload`)
   uploads its local files as they are instead, and its manifest is the local one.
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
With ``SaveOptions.save_timeout_s`` steps 1 and 3-4 run under the save's deadline (:mod:`.bound`):
a rank whose share is not done in time reports what it still waits for at the barrier instead of
its marker, and every rank raises :class:`~streamio.errors.SaveTimeoutError` naming it.

Where a save goes and on which timeline is rank 0's :class:`~.plan.Planner`'s (docs/checkpoint-
lifecycle.md); the pointer and the manifest record the timeline. Two live jobs on one root are
stopped by the fencing above: whichever swaps the pointer second finds it changed.

Metrics (:mod:`streamio.metrics`): the ``durable`` phase of ``streamio_checkpoint_seconds`` is
observed here, on every rank, once the pointer names the step (from the ``save()`` call, also for a
save published from a local tier); span ``commit`` covers steps 3-4 (``upload``, step 1: :mod:`.parts`).

``on_phase`` is called with the name of each phase as it completes (:data:`PHASES`); the kill
tests use it to ``kill -9`` the process there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from streamio.checkpoint import root
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.entries import FileEntry
from streamio.checkpoint.format.manifest import DoneMarker, Manifest
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.format.retention import RetentionPolicy
from streamio.checkpoint.format.timeline import Point, Tip
from streamio.checkpoint.options import SaveOptions, SaveStats
from streamio.checkpoint.root import ABSENT, UNREAD, PhaseHook, pointer_version
from streamio.checkpoint.save.abandon import FailedShares, discard_share, uncommitted, withdraw_manifest, writing
from streamio.checkpoint.save.bound import BoundExpired, SaveBound, Stuck, raise_if_timed_out
from streamio.checkpoint.save.local import LocalSave
from streamio.checkpoint.save.parts import assemble_manifest, copy_share, share_ranges, write_share
from streamio.checkpoint.save.plan import Planner, SavePlan
from streamio.checkpoint.save.pruning import Pruner
from streamio.checkpoint.save.rates import WriteCap, shared_write_rate
from streamio.checkpoint.save.snapshot import Snapshot
from streamio.errors import (
    CheckpointConflictError,
    CheckpointError,
    ObjectNotFoundError,
    StorageError,
    WriteConflictError,
)
from streamio.metrics.catalog import CHECKPOINT_SECONDS
from streamio.metrics.trace import span
from streamio.storage import Store

__all__ = ["PHASES", "Committer"]

log = logging.getLogger(__name__)

PHASES = ("parts", "markers", "manifest", "pointer", "delete", "retention")
"""Phase names passed to ``on_phase``: "delete" is a step's manifest deleted, its parts not yet."""

_UNKNOWN = UNREAD  # pointer version not read yet (also after a restore the root did not answer)


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
        self.planner = Planner(store)  # rank 0's view of the job's timeline (the others follow it)
        self._failed = FailedShares(store, comm.rank)  # what failed saves of this rank left
        self._phase: PhaseHook = on_phase or _no_phase
        self._pointer_version: Any = _UNKNOWN  # what the next pointer swap expects to replace
        self._cap = WriteCap(options.write_rate, store)  # the job's cap on its saves' writes (:mod:`.rates`)

    def restored(self, outcome: tuple[Point, Any] | None = None) -> None:
        """Note that this job has just restored the save ``outcome[0]``, reading the pointer's
        version ``outcome[1]`` (rank 0) before it read anything: its next save starts a new
        timeline continuing that save, and its pointer swap expects that version (unknown when
        the root did not answer: it is read before the next swap)."""
        self.planner.restored(outcome[0] if outcome is not None else None)
        if self.comm.rank == 0:
            self._pointer_version = outcome[1] if outcome is not None else pointer_version(self.store)

    def commit(self, job: Snapshot, plan: SavePlan | None = None, *, comm: Comm | None = None) -> SaveStats:
        """Make ``job`` the current checkpoint (collective), then prune (rank 0).

        Args:
            plan: where it goes, if :meth:`plan` decided it already (default: decided here).
            comm: the collectives to run over (default: this committer's).

        Raises:
            CheckpointConflictError: another job writes this root (or the step was saved).
            SaveTimeoutError: a rank did not finish within ``SaveOptions.save_timeout_s`` (named).
            CheckpointError: any rank failed; the previous checkpoint stays current.
        """
        comm = comm or self.comm
        bound = SaveBound(self.options.save_timeout_s, job.started, rank=comm.rank)
        plan = plan if plan is not None else self.plan(job.step, comm=comm)
        writes = len(share_ranges(self.store, job, self.options, world=comm.world)) + 1  # and the marker
        files = self._all_ranks(plan, lambda: self._write_rank(job, plan, comm, bound), comm, writes, bound)
        self._finish(plan, lambda: _assemble(self.store, self.options, job, plan, comm.world, bound), comm, bound)
        CHECKPOINT_SECONDS.observe(durable := time.perf_counter() - job.started, "durable")
        log.info("checkpoint step %d durable at %s (%.3f s blocked, %.3f s to durable)",
                 job.step, self.store.url(plan.sdir), job.blocked_s, durable)
        return SaveStats(job.step, job.blocked_s, durable, sum(f.size for f in files), len(files))

    def upload(self, save: LocalSave, *, comm: Comm | None = None) -> SaveStats:
        """Publish a save committed on a local tier to this root (collective; docs/design.md
        "Local tier"): each rank uploads its local files and marker as they are, then rank 0
        writes the same manifest and swaps the pointer, then prunes.

        Raises:
            as :meth:`commit`; ``SaveOptions.save_timeout_s`` counts from the upload's start.
        """
        comm = comm or self.comm
        began = time.perf_counter()
        bound = SaveBound(self.options.save_timeout_s, began, rank=comm.rank)
        self._all_ranks(save.plan, lambda: self._upload_rank(save, bound), comm, len(save.share.files) + 1, bound)
        self._finish(save.plan, lambda: save.manifest, comm, bound)
        CHECKPOINT_SECONDS.observe(time.perf_counter() - (began if save.started is None else save.started), "durable")
        log.info("checkpoint step %d durable at %s (uploaded from the local tier in %.3f s)",
                 save.plan.step, self.store.url(save.plan.sdir), time.perf_counter() - began)
        files = save.share.files
        return SaveStats(save.plan.step, 0.0, time.perf_counter() - began, sum(f.size for f in files), len(files))

    def plan(
        self, step: int, *, offline: bool | None = False, own_dir: bool = False, comm: Comm | None = None
    ) -> SavePlan:
        """Rank 0's :meth:`Planner.plan`, on every rank (its error raised on every rank).

        Args:
            offline: plan without reading the root (a local tier's save while it does not answer);
                ``None``: read it, and plan offline with a warning if it does not answer (rank 0
                decides; :attr:`SavePlan.offline` says which it did).
            own_dir: always a save directory of its own (a save that also lives on a local tier).
            comm: the collectives to agree over (default: this committer's; a local tier's saves
                plan over the group of the thread they run in).
        """
        comm = comm or self.comm
        plan: SavePlan | None = None
        plan_exc: BaseException | None = None
        if comm.rank == 0:
            try:
                plan = self._plan_here(step, offline, own_dir, prefixes=min(self.options.key_prefixes, comm.world))
            except Exception as exc:  # reported to every rank, raised here
                plan_exc = exc
        shared = comm.broadcast(plan if plan is not None else f"{type(plan_exc).__name__}: {plan_exc}")
        if plan_exc is not None:
            raise plan_exc
        if isinstance(shared, str):
            raise CheckpointError(f"rank 0 could not start saving step {step} under {self.store.root_url}: {shared}")
        return shared  # type: ignore[no-any-return]

    def _plan_here(self, step: int, offline: bool | None, own_dir: bool, *, prefixes: int) -> SavePlan:
        """Rank 0: the plan, online or offline as ``offline`` says (``None``: offline if the root
        does not answer)."""
        if offline is None:
            try:
                return self._plan_here(step, False, own_dir, prefixes=prefixes)
            except StorageError as exc:
                log.warning("the checkpoint root %s does not answer (%s): step %d is planned from the local tier",
                            self.store.root_url, exc, step)
                offline = True
        self._self_fenced(offline)
        return self.planner.plan(step, offline=offline, own_dir=own_dir, prefixes=prefixes)

    def _self_fenced(self, offline: bool) -> None:
        """Read the pointer's version once, before the first save (what its swap must find)."""
        if self._pointer_version == _UNKNOWN and not offline:
            self._pointer_version = pointer_version(self.store)

    def _all_ranks(
        self, plan: SavePlan, write: Callable[[], list[FileEntry]], comm: Comm, writes: int, bound: SaveBound
    ) -> list[FileEntry]:
        """Every rank's ``write()`` of ``writes`` objects, paced as one job (:mod:`.rates`) within
        ``bound`` (:mod:`.bound`), then the barrier: one rank's failure is every rank's error (and
        what the failed save wrote is removed)."""
        store = self.store
        self._failed.retry()
        failure: str | Stuck | None = None
        own_exc: BaseException | None = None
        files: list[FileEntry] = []
        try:
            with shared_write_rate(store, comm, writes, self._cap, prefixes=plan.prefixes):
                files = bound.run(write, doing="uploading its share",
                                  on_abandoned=lambda: discard_share(store, plan.place, plan.save_id, comm.rank))
        except BoundExpired as exc:
            failure, own_exc = exc.stuck, exc
        except Exception as exc:  # reported to every rank below, then re-raised
            failure, own_exc = f"rank {comm.rank}: {type(exc).__name__}: {exc}", exc
        bad = [o for o in comm.all_gather(failure) if o is not None]  # the barrier
        if bad:  # every rank knows: no manifest of this save was or will be written
            self._failed.discard(plan.place, plan.save_id)
            raise_if_timed_out(plan.step, bound, store.url(plan.sdir), bad, own_exc, pointer=root.pointer_url(store))
            if isinstance(own_exc, CheckpointError):
                raise own_exc
            raise CheckpointError(
                f"saving step {plan.step} to {store.url(plan.sdir)} failed on {len(bad)} rank(s): {bad[0]}; "
                f"the previous checkpoint stays current"
            ) from own_exc
        return files

    def _finish(self, plan: SavePlan, manifest_of: Callable[[], Manifest], comm: Comm, bound: SaveBound) -> None:
        """Rank 0 publishes the manifest and swaps the pointer within ``bound``; every rank learns the outcome."""
        store = self.store
        result: str | Stuck | None = None
        commit_exc: BaseException | None = None
        manifest: Manifest | None = None
        discard = False
        if comm.rank == 0:
            try:
                with span("commit", step=plan.step):  # steps 3-4 (rank 0)
                    manifest = bound.run(lambda: self._publish(plan, manifest_of(), bound),
                                         doing="publishing the manifest and the pointer")
            except Exception as exc:  # out of time: the outcome is unknown (a write may still land), keep all
                late = isinstance(exc, BoundExpired)
                result, commit_exc = exc.stuck if late else f"{type(exc).__name__}: {exc}", exc  # type: ignore[union-attr]
                self.planner.abandon()
                discard = not late and uncommitted(store, plan.step, plan.sdir, plan.save_id)
        result, discard = comm.broadcast((result, discard))
        if discard:
            self._failed.discard(plan.place, plan.save_id)
        raise_if_timed_out(plan.step, bound, store.url(plan.sdir), [result], commit_exc,
                           pointer=root.pointer_url(store))
        if commit_exc is not None:
            raise commit_exc
        if result is not None:
            raise CheckpointError(f"rank 0 could not commit step {plan.step} to {store.url(plan.sdir)}: {result}")
        if comm.rank == 0:
            assert manifest is not None
            self._committed(plan, manifest)

    def _committed(self, plan: SavePlan, manifest: Manifest) -> None:
        """Rank 0, once the pointer names ``manifest``: the job is on ``plan``'s timeline; prune."""
        self.planner.committed(plan)
        self.pruner.committed(plan.sdir, manifest)
        compacted = self.pruner.prune(Tip(plan.timeline, plan.step), plan.sdir, continued=plan.parent)
        if compacted is not None:
            self.planner.compacted(compacted)

    def _write_rank(self, job: Snapshot, plan: SavePlan, comm: Comm, bound: SaveBound) -> list[FileEntry]:
        """This rank's share: parts uploaded and checked in the store, then its done marker."""
        share = write_share(self.store, job, plan, comm.rank, self.options, world=comm.world, bound=bound)
        self._phase("parts")
        self._write_marker(plan, share.marker, bound)
        return list(share.files)

    def _upload_rank(self, save: LocalSave, bound: SaveBound) -> list[FileEntry]:
        """This rank's share of a local save: its files uploaded as they are, then its marker."""
        copy_share(save.store, self.store, save.plan.place, save.share, concurrency=self.options.concurrency,
                   bound=bound)
        self._phase("parts")
        self._write_marker(save.plan, save.share.marker, bound)
        return list(save.share.files)

    def _write_marker(self, plan: SavePlan, marker: DoneMarker, bound: SaveBound) -> None:
        url = self.store.url(plan.place.marker(marker.rank, plan.save_id))
        with bound.request(url), writing(url):
            root.write_marker(self.store, plan.place, marker)
        self._phase("markers")

    def _publish(self, plan: SavePlan, manifest: Manifest, bound: SaveBound) -> Manifest:
        """Rank 0: the manifest (create-only), then latest.json (compare-and-swap)."""
        store, sdir = self.store, plan.sdir
        try:
            with bound.request(store.url(layout.manifest_at(sdir))), writing(store.url(layout.manifest_at(sdir))):
                digest = root.create_manifest(store, sdir, manifest)
        except WriteConflictError as exc:
            raise CheckpointConflictError(
                f"{store.url(layout.manifest_at(sdir))} was created by someone else while this job saved "
                f"step {plan.step}: another job writes the same checkpoint root; give each job its own root"
            ) from exc
        self._phase("manifest")
        pointer = Pointer(step=plan.step, path=sdir, manifest_checksum=digest, save_id=plan.save_id,
                          created=manifest.created, timeline=plan.timeline)

        def late() -> None:  # the bound ran out before the swap was sent: the manifest is taken back
            withdraw_manifest(store, plan.step, sdir, plan.save_id)

        with bound.request(root.pointer_url(store), refused=late), writing(root.pointer_url(store)):
            self._swap_pointer(pointer)
        self._phase("pointer")
        return manifest

    def _swap_pointer(self, pointer: Pointer) -> None:
        """Replace ``latest.json`` only if it is still the version this job last read or wrote
        (read now if the root did not answer before: a save planned offline)."""
        if self._pointer_version == _UNKNOWN:
            self._pointer_version = pointer_version(self.store)
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


def _assemble(
    store: Store, options: SaveOptions, job: Snapshot, plan: SavePlan, world: int, bound: SaveBound
) -> Manifest:
    """Rank 0: the manifest from every rank's marker in the root."""
    with bound.request(store.url(plan.sdir)):
        markers = root.read_markers(store, plan.place, plan.save_id, world, concurrency=options.concurrency)
    return assemble_manifest(plan, markers, job)


def _no_phase(name: str) -> None:
    """No ``on_phase`` hook."""
