"""``CheckpointManager``: parallel save/restore of a training state behind an atomic pointer.

The facade users hold. It owns the host buffer a save is copied into and the one thread saves run
in; ``save`` blocks only for that copy (``SaveStats.blocked_s``) and the commit runs in the
background, at most one save in flight (the next ``save`` waits for it); ``restore`` walks from
the pointer back to the newest checkpoint that verifies and loads it all or nothing. The protocol
lives in :mod:`.save` and :mod:`.restore` (docs/design.md "Checkpoints").

Under ``torch.distributed`` every rank constructs the manager; state named in
``SaveOptions.per_rank`` (default ``"rng"``, ``"data"``) is saved by every rank, everything else
is taken as replicated and divided among ranks for upload (:mod:`.save.snapshot`).

Metrics (:mod:`streamio.metrics`): ``streamio_checkpoint_seconds`` observes ``blocked`` (the
snapshot's own measure, ``SaveStats.blocked_s``: :mod:`.save.snapshot`, with the span ``snapshot``)
once per ``save`` and ``restore`` once per successful ``restore`` (a restore that finds nothing or
fails is not a restore's time); ``local`` and ``durable`` are observed where those phases end
(:mod:`.save.tiers`, :mod:`.save.commit`), in the save thread for an async save.
"""

from __future__ import annotations

import concurrent.futures
import time
import warnings
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal

from streamio import threads
from streamio.checkpoint import owner
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.retention import RetentionPolicy
from streamio.checkpoint.options import LocalTier, SaveOptions, SaveStats
from streamio.checkpoint.restore.local import LocalCopies
from streamio.checkpoint.restore.walk import Restorer
from streamio.checkpoint.root import PhaseHook, committed_steps, pointed_step
from streamio.checkpoint.save import inflight
from streamio.checkpoint.save.commit import Committer
from streamio.checkpoint.save.local import LocalCommitter
from streamio.checkpoint.save.plan import current_point
from streamio.checkpoint.save.snapshot import Snapshot, take_snapshot
from streamio.checkpoint.save.tiers import TieredSaves
from streamio.checkpoint.tensors.serialize import HostBuffer
from streamio.deprecation import REMOVED_IN, keyword_only
from streamio.errors import ArgumentError, CheckpointError
from streamio.metrics.catalog import CHECKPOINT_SECONDS
from streamio.storage import RetryPolicy, Store

__all__ = ["CheckpointManager"]

LOCAL_ONLY = "local"
"""``save(durable=LOCAL_ONLY)``: this save stays on the local tier (a save option, not a protocol)."""


class CheckpointManager:
    """Saves and restores training state under one root URL; see the module docstring.

    Args:
        root_url: any fsspec URL (``s3://bucket/run1/ckpt``, ``gs://...``, ``/local/dir``).
        retention: which committed checkpoints to keep (combine with ``|``, e.g.
            ``KeepLast(3) | KeepBest("val_loss")``); recorded in the root. Default: the policy
            the root records, else ``KeepLast(2)`` (docs/checkpoint-lifecycle.md).
        async_save: upload in a background thread (``save`` returns after the host snapshot).
        storage_options: fsspec options (endpoint, credentials); never logged or stored.
        options: part size, concurrency, compression, per-rank state names.
        retry: retry policy for transient storage errors.
        on_phase: called with the name of each commit phase as it completes
            (:data:`~.save.commit.PHASES`); the fault tests kill the process there.
        local: a local tier (node-local disk or RAM): every save commits there first and every
            ``SaveOptions.durable_every``-th goes to the root in the background; restore takes
            the nearest good copy (docs/design.md "Local tier"). Its directory belongs to one root:
            the first job that uses it records its root there (:mod:`.owner`).

    Call order: ``save``... (each waits for the previous), ``wait()`` to make the last one
    durable, ``close()``; ``restore`` at start. A save still in flight when the interpreter exits
    is waited for there, with a warning (and exit status 1 if it fails: :mod:`.save.inflight`). Under
    ``torch.distributed`` every rank constructs the manager and calls ``save``/``restore`` with the
    same steps (they are collective: a rank that calls them alone gets a ``CheckpointError``
    naming the missing ranks after ``SaveOptions.collective_timeout_s``, see :mod:`.comm`).

    Raises:
        ConfigError: ``local``'s directory holds the copies of another root (:mod:`.owner`).
    """

    def __init__(  # noqa: PLR0913 - solo= is the one keyword a framework that saves on one rank needs
        self,
        root_url: str,
        *,
        retention: RetentionPolicy | None = None,
        async_save: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        options: SaveOptions | None = None,
        retry: RetryPolicy | None = None,
        on_phase: PhaseHook | None = None,
        local: LocalTier | None = None,
        solo: bool = False,
    ) -> None:
        self.store = Store(root_url, storage_options, retry=retry)
        self.async_save = async_save
        self.options = options or SaveOptions()
        self._comm = Comm(timeout_s=self.options.collective_timeout_s, solo=solo)
        # with a tier, uploads run in a thread of their own: their collectives need a group of their own
        uploads = self._comm if local is None else Comm(timeout_s=self.options.collective_timeout_s, solo=solo)
        self._committer = Committer(self.store, uploads, options=self.options, retention=retention, on_phase=on_phase)
        identity = owner.root_identity(self.store.root_url)
        if local is not None:  # this rank's local root is this job's, or refused (ConfigError)
            owner.claim(Store(local.rank_root(self._comm.rank)), self.store)
        local_commits = None if local is None else LocalCommitter(local, self._comm, owner=identity,
                                                                  options=self.options, on_phase=on_phase)
        self._tiers = None if local_commits is None else TieredSaves(self._committer, local_commits, self._comm,
                                                                     options=self.options)
        self._restorer = Restorer(self.store, self._comm, concurrency=self.options.concurrency,
                                  part_store=self.store.for_verified_reads(),
                                  local=None if local is None else LocalCopies(local, self._comm.rank, owner=identity),
                                  fanout=self.options.restore_fanout)
        self._buffer = HostBuffer()
        self._executor = threads.executor(1, "streamio-ckpt")
        self._pending: concurrent.futures.Future[SaveStats] | None = None
        self._closed = False
        self.last_stats: SaveStats | None = None

    def __repr__(self) -> str:
        return f"CheckpointManager({self.store.root_url!r}, rank={self._comm.rank}/{self._comm.world})"

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._comm.world

    @property
    def durable_step(self) -> int | None:
        """The newest step this manager made durable in the root (``None``: none yet). With a local
        tier, later saves may be on the local tier only (:attr:`SaveStats.durable_s` is ``None``)."""
        if self._tiers is not None:
            return self._tiers.durable_step
        return self.last_stats.step if self.last_stats is not None else None

    @property
    def retention(self) -> RetentionPolicy:
        """Which committed checkpoints the next save keeps (may be replaced between saves)."""
        return self._committer.pruner.policy

    @retention.setter
    def retention(self, policy: RetentionPolicy) -> None:
        self._committer.pruner.policy = policy

    # ------------------------------------------------------------------------------ save
    def save(
        self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, Any] | None = None,
        durable: bool | Literal["local"] | None = None,
    ) -> None:
        """Snapshot ``state`` and commit it as ``step`` (in the background if ``async_save``).

        Args:
            step: the training step, past the one this job last saved or restored (a step
                that a restore went back past is saved again: docs/checkpoint-lifecycle.md).
            state: name -> object with ``state_dict()`` (model, optimizer, scheduler, scaler,
                dataset, RNG state) or plain value (tensors, JSON-like values).
            metrics: numbers recorded in the manifest (what ``KeepBest`` ranks by).
            durable: with a local tier, ``None`` (the default) sends this save to the root if
                ``SaveOptions.durable_every`` says so, ``True`` sends it whatever that says, and
                ``"local"`` keeps it on the local tier only. ``False`` is deprecated: it still
                means ``"local"`` (a ``DeprecationWarning``), so ``durable=(step == last)`` kept
                every other save off the root; from streamio 0.3.0 it means the same as ``None``.
                Without a tier every save goes to the root. Pass the same on every rank.

        Raises:
            CheckpointError: the previous async save failed (raised here, once; e.g. a rank did
                not reach that save within ``SaveOptions.collective_timeout_s``), or the state
                holds a value that cannot be saved without pickling.
            CheckpointConflictError: another job writes this root (also from the previous save).
            ArgumentError: ``durable`` is not ``None``, ``True``, ``"local"`` or ``False``.
        """
        forced = _forced(durable)
        if self._closed:
            raise CheckpointError(f"CheckpointManager for {self.store.root_url} is closed")
        layout.step_dir(step)  # validates
        t0 = time.perf_counter()
        self._wait_pending()
        job = take_snapshot(step, state, comm=self._comm, per_rank=self.options.per_rank, buffer=self._buffer,
                            metrics=dict(metrics or {}), started=t0, block_size=self.options.block_size)
        if self.async_save:
            self._pending = self._executor.submit(self._commit, job, forced)
            inflight.track(self._pending, step, self.store.root_url)  # waited for at exit if nobody does
        else:
            self.last_stats = self._commit(job, forced)

    def _commit(self, job: Snapshot, forced: bool | None) -> SaveStats:
        """Every rank at this save (bounded wait: :meth:`~.comm.Comm.arrive`), then the commit."""
        self._comm.arrive("save", job.step, where=f"saving step {job.step} to {self.store.root_url}")
        if self._tiers is not None:
            return self._tiers.commit(job, forced)
        return self._committer.commit(job)

    def wait(self) -> SaveStats | None:
        """Block until the save in flight is committed (with a local tier: and every upload due is
        done); raise its error if it failed.

        Returns:
            The stats of the last completed save (``None`` if none yet).
        """
        self._wait_pending()
        if self._tiers is not None:
            self._tiers.drain()
            self._tiers.raise_error()
        return self.last_stats

    def close(self, *, timeout_s: float | None = None) -> None:
        """Wait for the save in flight, release the thread and host buffer (``timeout_s``: :func:`upload_bound`)."""
        bound = upload_bound(timeout_s)
        if self._closed:
            return
        try:
            self._wait_pending()
        finally:
            self._closed, self._buffer = True, HostBuffer()
            self._executor.shutdown(wait=True)
            if self._tiers is not None:
                self._tiers.close(timeout_s=bound)

    def _wait_pending(self) -> None:
        pending = self._pending
        if pending is None:
            return
        try:
            stats = pending.result()  # re-raises the background error here
        except Exception:
            self._pending = None
            inflight.forget(pending)
            raise
        # (an interrupt leaves it pending: the next call, or the exit wait, still sees it)
        self._pending, self.last_stats = None, stats
        inflight.forget(pending)

    # ------------------------------------------------------------------------------ queries
    def latest_step(self) -> int | None:
        """The step ``latest.json`` names (read fresh), or ``None`` if there is no valid pointer."""
        return pointed_step(self.store)

    def steps(self) -> list[int]:
        """Steps with a manifest (committed), oldest first."""
        return committed_steps(self.store)

    def adopt(self) -> int | None:
        """Continue the root's current checkpoint without loading it: the next save supersedes it.

        What a framework needs that saves to a name it rebinds (Lightning's ``last.ckpt``): after
        ``adopt()`` a save of any step becomes current (a step at or before the adopted one starts
        a new timeline from it), retention then retires the saves it superseded, and the pointer
        swap still fails if another job writes the root meanwhile.

        Returns:
            The step the pointer names (``None``: the root holds no checkpoint yet).

        Raises:
            CheckpointError: the pointer is unusable (restore first: it walks back).
        """
        self._wait_pending()
        point, version = current_point(self.store)
        self._committer.restored(None if point is None else (point, version))
        return None if point is None else point.step

    # ------------------------------------------------------------------------------ restore
    def restore(self, state: MutableMapping[str, Any], *moved: int | None, step: int | None = None) -> int:
        """Load a checkpoint into ``state`` in place and return its step.

        Objects with ``load_state_dict`` are loaded through it (tensors copied into the live
        ones where shapes match); plain values are replaced in ``state``. All or nothing: the
        manifest (against the pointer's checksum and its own), every part this rank needs, the
        decoding of the whole state and its fit with the live objects are all checked before
        the first live object changes (:mod:`.restore.plan`).

        Args:
            state: the same names as were saved.
            moved: ``step`` given positionally, as streamio 0.1 took it: deprecated (a
                ``DeprecationWarning``), removed in 0.3.0.
            step: a specific step (no fallback); default: the pointer's, walking back to the
                newest complete checkpoint that verifies when it is unusable.

        Raises:
            CheckpointNotFoundError: no checkpoint under the root (or not ``step``).
            CheckpointFormatError: an unknown format version, a root written by another tool,
                or (with ``step``) a manifest or tree that does not verify or decode.
            CheckpointError: no checkpoint verifies, or the checkpoint does not fit ``state``
                (a name not saved, another model's keys, shapes or dtypes), or a rank did not
                reach this restore within ``SaveOptions.collective_timeout_s``: nothing was loaded.
        """
        step, began = keyword_only("CheckpointManager.restore", "step", moved, step), time.perf_counter()
        self._wait_pending()
        where = f"restoring {'the newest step' if step is None else f'step {step}'} from {self.store.root_url}"
        self._comm.arrive("restore", step, where=where)
        restored = self._restorer.restore(state, step)
        self._committer.restored(self._restorer.outcome)
        CHECKPOINT_SECONDS.observe(time.perf_counter() - began, "restore")
        return restored


def upload_bound(timeout_s: object) -> float | None:
    """``close(timeout_s=...)``: with a local tier, wait at most this long for the uploads that make
    the saves durable (``Preemption.remaining_s``: a preemption's grace period). Past it a WARNING
    names the step that is on the local tier only and where; the upload goes on in the background
    until the process ends (``Preemption.exit()`` ends it at once; a normal interpreter exit waits
    for it). The save in flight is always waited for: it is what commits the local copy (without a
    tier, the root's). ``None``: no bound.

    Raises:
        ArgumentError: ``timeout_s`` is not ``None`` or a number >= 0.
    """
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s >= 0:
        raise ArgumentError(f"close(timeout_s={timeout_s!r}): give a number of seconds >= 0, or None to wait "
                            f"for the uploads however long they take")
    return float(timeout_s)


def _forced(durable: object) -> bool | None:
    """``save(durable=...)`` as the tier takes it: ``True`` to the root, ``False`` local only,
    ``None`` as ``durable_every`` says (see :meth:`CheckpointManager.save`)."""
    if durable is None or durable is True:
        return durable
    if isinstance(durable, str) and durable == LOCAL_ONLY:
        return False
    if durable is False:
        warnings.warn(
            f"save(durable=False) keeps the save on the local tier only, whatever SaveOptions.durable_every says; "
            f"that spelling is deprecated and means the same as durable=None from streamio {REMOVED_IN}: pass "
            f"durable='local' to keep a save off the root, or durable=None (the default) to follow durable_every",
            DeprecationWarning,
            stacklevel=3,
        )
        return False
    raise ArgumentError(
        f"save(durable={durable!r}): durable must be None (as SaveOptions.durable_every says), True (to the root) "
        f"or 'local' (the local tier only), e.g. durable=True if step == last else None"
    )
