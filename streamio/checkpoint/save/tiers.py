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
   of its own, one save at a time, in order. A save due while an upload runs waits in a queue of
   one; a newer due save replaces it there (the older one stays on the local tier only, its
   durability superseded), so the save thread never waits for the store: a slow or dead store
   delays durability, never training, and disk use stays bounded (the upload, the one queued, and
   ``keep``). Local retention keeps every save still to be uploaded.

An upload that fails (store down, throttled past the retry policy) logs a warning naming the step
and the cause and never raises: the local copy stands and the next save retries durability. Until
an upload succeeds again the saves are planned offline (:mod:`.plan`), so no save waits for the
root's answer either. A
conflict on the root's pointer (another job writes the root) is not transient: it is raised by the
next ``save``, ``wait`` or ``close``. :attr:`TieredSaves.durable_step` says which step the root
holds; ``close`` warns when the newest save never became durable.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

from streamio.checkpoint.comm import Comm
from streamio.checkpoint.options import SaveOptions, SaveStats
from streamio.checkpoint.save import inflight
from streamio.checkpoint.save.commit import Committer
from streamio.checkpoint.save.local import LocalCommitter, LocalSave
from streamio.checkpoint.save.plan import SavePlan
from streamio.checkpoint.save.snapshot import Snapshot
from streamio.errors import CheckpointConflictError, CheckpointError, StorageError

__all__ = ["TieredSaves"]

log = logging.getLogger(__name__)


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
        self._queue: list[LocalSave] = []  # due, not yet uploading (at most one)
        self._queued: concurrent.futures.Future[None] | None = None  # the upload task that will take it
        self._uploading: LocalSave | None = None
        self._root_down = False  # the root did not answer: plan offline until an upload succeeds
        self._lock = threading.Condition()
        self._uploads = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamio-ckpt-upload")

    # ------------------------------------------------------------------ the save thread
    def commit(self, job: Snapshot, durable: bool | None) -> SaveStats:
        """Commit ``job`` locally, and hand it to the upload thread if it is due (collective)."""
        self.raise_error()
        self._saves += 1
        due = durable if durable is not None else (self._saves % self.options.durable_every == 0)
        due = any(self.comm.all_gather(due or self._retry_durable))  # every rank uploads the same saves
        plan = self._plan(job.step)
        saved = self._commit_locally(job, plan)
        if saved is None:  # on the root alone, from the host buffer
            self.drain()
            stats = self.committer.commit(job, plan, comm=self.comm)
            self._durable(plan.step)
            return stats
        if self.comm.rank == 0:
            self.committer.planner.committed(plan)
        self.newest_step = plan.step
        local_s = time.perf_counter() - job.started
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

    def _commit_locally(self, job: Snapshot, plan: SavePlan) -> LocalSave | None:
        """The local commit, agreed: ``None`` unless every rank's copy committed (then every
        rank drops its copy of this save)."""
        try:
            saved: LocalSave | None = self.local.commit(job, plan)
        except CheckpointError as exc:
            log.warning("%s", exc)
            saved = None
        if all(self.comm.all_gather(saved is not None)):
            return saved
        if saved is not None:
            log.warning("another rank could not write its local copy of step %d: it goes to the root only", plan.step)
            self.local.drop(plan)
        return None

    def _protected(self) -> frozenset[str]:
        with self._lock:
            waiting = [*self._queue, *([self._uploading] if self._uploading is not None else [])]
        return frozenset(s.plan.sdir for s in waiting)

    def _enqueue(self, saved: LocalSave) -> None:
        """Queue ``saved`` for upload; it replaces a save still waiting there (never waits)."""
        root_url = self.committer.store.root_url
        with self._lock:
            if self._queue:  # its task has not taken it yet (it pops under this lock): it takes this one
                superseded, self._queue[0] = self._queue[0], saved
                assert self._queued is not None
                inflight.track(self._queued, saved.plan.step, root_url)  # the step the exit wait names
                log.info("checkpoint step %d replaces step %d in the upload queue (step %d stays on the local "
                         "tier only)", saved.plan.step, superseded.plan.step, superseded.plan.step)
                return
            self._queue.append(saved)
            future = self._queued = self._uploads.submit(self._upload_next)
        inflight.track(future, saved.plan.step, root_url)  # waited for at exit
        future.add_done_callback(inflight.forget)

    # ------------------------------------------------------------------ the upload thread
    def _upload_next(self) -> None:
        with self._lock:
            saved = self._queue.pop(0)
            self._uploading = saved
            self._lock.notify_all()
        step = saved.plan.step
        try:
            self.committer.upload(saved, comm=self.committer.comm)
        except CheckpointConflictError as exc:
            self._error = exc
        except (CheckpointError, StorageError) as exc:
            self._retry_durable = self._root_down = True
            log.warning("checkpoint step %d is committed locally but could not be made durable at %s (%s); "
                        "the local copy stands and the next save tries again", step, self.committer.store.root_url,
                        exc)
        else:
            self._durable(step)
        finally:
            with self._lock:
                self._uploading = None
                self._lock.notify_all()

    def _durable(self, step: int) -> None:
        self.durable_step = step if self.durable_step is None else max(self.durable_step, step)
        self._retry_durable = self._root_down = False

    # ------------------------------------------------------------------ waiting
    def drain(self) -> None:
        """Wait until no upload is queued or running."""
        with self._lock:
            while self._queue or self._uploading is not None:
                self._lock.wait()

    def raise_error(self) -> None:
        """Raise (once) the conflict an upload met."""
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the uploads, stop the upload thread, apply local retention to what uploads kept,
        and say if the newest save is not durable."""
        self.drain()
        self._uploads.shutdown(wait=True)
        self.local.prune()  # what the last saves kept while it was uploading
        if self.newest_step is not None and self.durable_step != self.newest_step:
            held = "no step" if self.durable_step is None else f"step {self.durable_step}"
            log.warning("the newest checkpoint, step %d, is on the local tier only; the root %s holds %s "
                        "(save(step, state, durable=True) makes a save durable)",
                        self.newest_step, self.committer.store.root_url, held)
