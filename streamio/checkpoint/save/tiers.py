"""A local tier and the durable root together: every save commits locally, some go to the root.

docs/design.md "Local tier". :meth:`TieredSaves.commit` runs in the manager's save thread, for one
snapshot (every rank alike):

1. Plan the save over the save thread's group (rank 0; offline, with a warning, when the root does
   not answer: :mod:`.plan`).
2. Commit it on the local tier (:mod:`.local`); every rank says whether its copy committed. If one
   did not (disk full, directory gone), every rank drops its copy of this save and the save goes to
   the root from the host buffer, as without a tier, with a warning.
3. If this save is due to become durable (every ``durable_every``-th save, ``save(durable=True)``,
   or any save after a durable one failed: agreed by all ranks), it is handed to the upload
   thread, which publishes it from the local files (:meth:`~.commit.Committer.upload`) over a group
   of its own, one save at a time, in order. Saves due while an upload runs wait; of those only
   the newest :data:`PENDING` stay (an older one stays on the local tier only, its durability
   superseded), and each upload takes the newest save every rank has waiting (agreed over the
   upload group: ranks see the queue at different moments). So the save thread never waits for
   the store: a slow or dead store delays durability, never training, and disk use stays bounded
   (the upload, the saves waiting, and ``keep``). Local retention keeps every save still to be
   uploaded.

An upload that fails (store down, throttled past the retry policy) logs a warning naming the step
and the cause and never raises: the local copy stands and the next save retries durability. Until
an upload succeeds again the saves are planned offline (:mod:`.plan`), so no save waits for the
root's answer either. A
conflict on the root's pointer (another job writes the root) is not transient: it is raised by the
next ``save``, ``wait`` or ``close``. :attr:`TieredSaves.durable_step` says which step the root
holds; ``close`` warns when the newest save never became durable.
"""

from __future__ import annotations

import logging
import threading
import time

from streamio import threads
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.options import SaveOptions, SaveStats
from streamio.checkpoint.save import inflight
from streamio.checkpoint.save.commit import Committer
from streamio.checkpoint.save.local import LocalCommitter, LocalSave
from streamio.checkpoint.save.plan import SavePlan
from streamio.checkpoint.save.snapshot import Snapshot
from streamio.errors import CheckpointConflictError, CheckpointError, StorageError
from streamio.metrics.catalog import CHECKPOINT_SECONDS

__all__ = ["TieredSaves"]

log = logging.getLogger(__name__)

PENDING = 2
"""Due saves each rank keeps waiting for upload (the newest; older ones are superseded)."""


class TieredSaves:
    """Local commits and background uploads for one manager (see the module docstring).

    Args:
        committer: the durable root's commit protocol (its own group serves the uploads).
        local: the local tier's commit.
        comm: the save thread's collectives (plans, the local commit, the agreements).
        options: ``durable_every``.
    """

    def __init__(self, committer: Committer, local: LocalCommitter, comm: Comm, *, options: SaveOptions) -> None:
        self.committer, self.local, self.comm, self.options = committer, local, comm, options
        self.durable_step: int | None = None
        self.newest_step: int | None = None
        self._saves = 0
        self._retry_durable = False  # an upload failed: the next save is durable
        self._error: BaseException | None = None  # a conflict an upload met, raised once
        self._waiting: dict[int, LocalSave] = {}  # due, not yet uploading, by step (the newest PENDING)
        self._tasks = 0  # upload tasks submitted and not finished (one per due save, on every rank)
        self._uploading: LocalSave | None = None
        self._root_down = False  # the root did not answer: plan offline until an upload succeeds
        self._lock = threading.Condition()
        self._uploads = threads.executor(1, "streamio-ckpt-upload")

    # ------------------------------------------------------------------ the save thread
    def commit(self, job: Snapshot, durable: bool | None) -> SaveStats:
        """Commit ``job`` locally, and hand it to the upload thread if it is due (collective)."""
        self.raise_error()
        self._saves += 1
        wants = durable if durable is not None else (self._saves % self.options.durable_every == 0)
        plan = self._plan(job.step)
        saved, due = self._commit_locally(job, plan, wants)
        if saved is None:  # on the root alone, from the host buffer
            self.drain()
            stats = self.committer.commit(job, plan, comm=self.comm)
            self.newest_step = plan.step  # the newest save, whichever tier holds it
            self._durable(plan.step)
            return stats
        if self.comm.rank == 0:
            self.committer.planner.committed(plan)
        self.newest_step = plan.step
        local_s = time.perf_counter() - job.started
        CHECKPOINT_SECONDS.observe(local_s, "local")
        log.info("checkpoint step %d committed locally at %s (%.3f s blocked, %.3f s to local)",
                 plan.step, saved.store.url(plan.sdir), job.blocked_s, local_s)
        if due:
            self._enqueue(saved)
        self.local.prune(keep_also=self._protected() | {plan.sdir})  # after the clock: not part of the commit
        files = saved.share.files
        return SaveStats(plan.step, job.blocked_s, None, sum(f.size for f in files), len(files), local_s)

    def _plan(self, step: int) -> SavePlan:
        """The save's plan; offline when the root does not answer now (with a warning) or did not
        at the last upload (rank 0 decides, :meth:`~.commit.Committer.plan`)."""
        plan = self.committer.plan(step, own_dir=True, offline=True if self._root_down else None, comm=self.comm)
        if plan.offline:
            self._root_down = True  # (only a successful upload clears it: it may be the upload thread's too)
        return plan

    def _commit_locally(self, job: Snapshot, plan: SavePlan, wants: bool) -> tuple[LocalSave | None, bool]:
        """The local commit, agreed: ``None`` unless every rank's copy committed (then every
        rank drops its copy of this save); and whether the save is due for the root (``wants``
        on some rank, or an upload failed: every rank uploads the same saves). One all-gather
        says both: each collective costs every rank the slowest one's latency."""
        try:
            saved: LocalSave | None = self.local.commit(job, plan)
        except CheckpointError as exc:
            log.warning("%s", exc)
            saved = None
        votes = self.comm.all_gather((saved is not None, wants or self._retry_durable))
        due = any(v[1] for v in votes)
        if all(v[0] for v in votes):
            return saved, due
        if saved is not None:
            log.warning("another rank could not write its local copy of step %d: it goes to the root only", plan.step)
            self.local.drop(plan)
        return None, due

    def _protected(self) -> frozenset[str]:
        with self._lock:
            waiting = [*self._waiting.values(), *([self._uploading] if self._uploading is not None else [])]
        return frozenset(s.plan.sdir for s in waiting)

    def _enqueue(self, saved: LocalSave) -> None:
        """Hand ``saved`` to the upload thread (never waits); of the saves waiting there only the
        newest :data:`PENDING` stay (the older ones stay on the local tier only)."""
        with self._lock:
            self._waiting[saved.plan.step] = saved
            for step in sorted(self._waiting)[:-PENDING]:
                log.info("checkpoint step %d is superseded in the upload queue by step %d: it stays on the local "
                         "tier only", step, saved.plan.step)
                del self._waiting[step]
            self._tasks += 1
            future = self._uploads.submit(self._upload_next)
        inflight.track(future, saved.plan.step, self.committer.store.root_url)  # waited for at exit
        future.add_done_callback(inflight.forget)

    # ------------------------------------------------------------------ the upload thread
    def _upload_next(self) -> None:
        """One task per due save, on every rank alike: the ranks agree on the newest save every one
        of them has waiting, and upload it; the older ones are superseded. (A rank's save thread is
        at most one due save ahead of another's, so with :data:`PENDING` saves waiting each, a
        common one exists; if a task finds none, an earlier one uploaded it.)"""
        try:
            with self._lock:
                mine = sorted(self._waiting)
            try:
                common = set.intersection(*(set(w) for w in self.committer.comm.all_gather(mine)))
            except CheckpointError as exc:  # a rank died: this upload, like the collectives after it, fails
                self._failed_upload(max(mine, default=-1), exc)
                return
            if not common:
                return
            with self._lock:
                saved = self._waiting[max(common)]
                for step in [s for s in self._waiting if s <= saved.plan.step]:
                    del self._waiting[step]
                self._uploading = saved
            self._upload(saved)
        finally:
            with self._lock:
                self._tasks -= 1
                self._uploading = None
                self._lock.notify_all()

    def _upload(self, saved: LocalSave) -> None:
        step = saved.plan.step
        try:
            self.committer.upload(saved, comm=self.committer.comm)
        except CheckpointConflictError as exc:
            self._error = exc
        except (CheckpointError, StorageError) as exc:
            self._failed_upload(step, exc)
        else:
            self._durable(step)

    def _failed_upload(self, step: int, exc: BaseException) -> None:
        self._retry_durable = self._root_down = True
        log.warning("checkpoint step %d is committed locally but could not be made durable at %s (%s); "
                    "the local copy stands and the next save tries again", step, self.committer.store.root_url, exc)

    def _durable(self, step: int) -> None:
        self.durable_step = step if self.durable_step is None else max(self.durable_step, step)
        self._retry_durable = self._root_down = False

    # ------------------------------------------------------------------ waiting
    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until no upload is queued or running, at most ``timeout_s``; whether none is."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._tasks:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(None if left is None else min(left, threading.TIMEOUT_MAX))  # (1e10 s: OverflowError)
        return True

    def raise_error(self) -> None:
        """Raise (once) the conflict an upload met."""
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self, timeout_s: float | None = None) -> None:
        """Wait for the uploads (at most ``timeout_s``), stop the upload thread, apply local
        retention to what uploads kept, and say if the newest save is not durable.

        Past ``timeout_s`` the uploads are left running (the process's end stops them) and
        nothing local is pruned: the save being uploaded stays where a restart finds it."""
        if not self.drain(timeout_s):
            self._uploads.shutdown(wait=False, cancel_futures=True)
            log.warning("checkpoint step %d is committed on the local tier at %s but was not made durable at %s "
                        "within %.1f s; the root holds %s: a restart on this node resumes from the local copy, a "
                        "restart elsewhere from the root's pointer. Give the upload more time (a longer grace period: "
                        "Preemption(grace_s=...) and the scheduler's) or save durably more often",
                        self.newest_step, self.local.store.root_url, self.committer.store.root_url, timeout_s,
                        self._held())
            return
        self._uploads.shutdown(wait=True)
        self.local.prune()  # what the last saves kept while it was uploading
        if self.newest_step is not None and (self.durable_step is None or self.durable_step < self.newest_step):
            log.warning("the newest checkpoint, step %d, is on the local tier only; the root %s holds %s "
                        "(save(step, state, durable=True) makes a save durable)",
                        self.newest_step, self.committer.store.root_url, self._held())

    def _held(self) -> str:
        if self.durable_step is None:
            return "no save of this job (what it held before, if anything)"
        return f"step {self.durable_step}"
