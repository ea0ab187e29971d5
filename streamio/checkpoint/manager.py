"""``CheckpointManager``: parallel save/restore of a training state behind an atomic pointer.

Commit protocol (docs/design.md "Commit protocol"); at every instant ``latest.json`` names a complete
checkpoint, so a ``kill -9`` anywhere costs at most the save in progress:

1. ``save`` encodes each state object's ``state_dict()`` (JSON tree + tensors) and copies the
   tensors this rank writes into a reused host buffer (:class:`~.serialize.HostBuffer`). That
   copy is all the caller waits for (``SaveStats.blocked_s``); the rest runs in one background
   thread, at most one save in flight (the next ``save`` waits for it).
2. Each rank uploads its parts concurrently (a bounded pool of ``Store.put``, each thread also
   computing its part's CRC32C), checks their sizes in the
   store, then writes its done marker (create-only).
3. Barrier over a dedicated gloo group (an all-gather of each rank's outcome, so a rank that
   failed makes every rank fail instead of hanging).
4. Rank 0 assembles ``manifest.json`` from the markers and writes it create-only.
5. Rank 0 replaces ``latest.json`` in one PUT conditional on the version it read before the save
   began (``if_match``; ``mode="create"`` when there was none). If another job wrote it meanwhile
   the PUT fails and :class:`~streamio.errors.CheckpointConflictError` stops this job: two jobs
   can never interleave their pointers. Backends without conditional writes cannot detect this
   (the store's ``put`` documents which do: S3 ``If-Match``, GCS generation match, local/memory).
6. Only then retention runs (rank 0): obsolete steps lose their manifest first, then their parts.
   The step the pointer names is never deleted, so there is always a complete checkpoint.

Under ``torch.distributed``, state named in ``SaveOptions.per_rank`` (default ``"rng"``,
``"data"``) is saved by every rank; everything else is taken as replicated (DDP model, optimizer)
and its tensors are divided among ranks so each uploads a disjoint share of about equal bytes.
Replicated state must really be equal on every rank; the one known exception, module buffers
(BatchNorm statistics, which DDP re-broadcasts from rank 0 at each forward), is always taken from
rank 0, and JSON (non-tensor) replicated state is rank 0's.

Restore reads the pointer fresh (never a cached listing), checks the manifest against the
checksum the pointer recorded and against its own seal and step, reads every part this rank needs
with concurrent GETs, verifies sizes and CRC32C of files and tensors, decodes the whole state and
checks it against the live objects, and only then loads anything. If the pointer is missing,
corrupt or names a checkpoint that fails any of this, it walks back to the newest complete
checkpoint that verifies and logs why (explicit ``step=`` never walks back); a checkpoint that
verifies but does not fit the live objects (another model) raises, with nothing loaded.
"""

from __future__ import annotations

import concurrent.futures
import logging
import platform
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import torch

from streamio.checkpoint import manifest as mf
from streamio.checkpoint.manifest import (
    CheckpointRecord,
    DoneMarker,
    FileEntry,
    KeepLast,
    Manifest,
    ManifestError,
    Pointer,
    RetentionPolicy,
    Section,
)
from streamio.checkpoint.restore_plan import RestorePlan, apply, decode_state, mismatches
from streamio.checkpoint.serialize import (
    HostBuffer,
    StreamReader,
    assign_shares,
    decode_part,
    encode_part,
    plan_layout,
    tensor_entries,
    verify_file,
)
from streamio.checkpoint.tree import TreeEncoder, VerifiedTensor
from streamio.checksum import checksum_bytes
from streamio.errors import (
    CheckpointConflictError,
    CheckpointError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    CorruptDataError,
    ObjectNotFoundError,
    StorageError,
    WriteConflictError,
)
from streamio.storage import RetryPolicy, Store
from streamio.storage.store import gather

log = logging.getLogger(__name__)

# Test hook: called with the name of each commit phase as it completes ("parts", "markers",
# "manifest", "pointer", "delete" (a step's manifest deleted, its parts not yet), "retention");
# fault tests set it in a child process to kill -9 there.
_phase_hook: Callable[[str], None] | None = None

_FOREIGN = {
    ".metadata": "a torch.distributed.checkpoint directory: load it with torch.distributed.checkpoint",
    ".pt": "a torch.save file: load it with torch.load(weights_only=True)",
    ".pth": "a torch.save file: load it with torch.load(weights_only=True)",
    ".ckpt": "a Lightning/torch.save checkpoint: load it with its own tool",
    ".safetensors": "a safetensors file: load it with safetensors",
    "latest": "a DeepSpeed checkpoint directory: load it with DeepSpeed",
}


@dataclass(frozen=True)
class SaveOptions:
    """How checkpoints are cut and uploaded.

    Attributes:
        part_size: most raw bytes per part object (a tensor may span parts); bounds each PUT.
            Smaller states are cut finer, down to 4 MiB, so every upload thread has work.
        concurrency: parallel PUTs / GETs.
        compression: ``None`` or ``"zstd"`` (per part; pays off for sparse or low-entropy state).
        zstd_level: zstd level when compressing.
        per_rank: state names saved by every rank (RNG, data position); all others are
            replicated across ranks and divided among them for upload.
    """

    part_size: int = 64 << 20
    concurrency: int = 8
    compression: str | None = None
    zstd_level: int = 3
    per_rank: frozenset[str] = frozenset({"rng", "data"})

    def __post_init__(self) -> None:
        if self.part_size < 4096:
            raise ValueError(f"part_size must be at least 4096 bytes, got {self.part_size}")
        if self.compression not in (None, "zstd"):
            raise ValueError(f"compression must be None or 'zstd', got {self.compression!r}")
        object.__setattr__(self, "per_rank", frozenset(self.per_rank))


@dataclass(frozen=True)
class SaveStats:
    """What one save cost.

    Attributes:
        step: the step saved.
        blocked_s: seconds ``save`` blocked the caller (waiting for the previous save + snapshot).
        durable_s: seconds from the ``save`` call until the pointer named this step.
        bytes_written: stored bytes this rank uploaded.
        files: part objects this rank uploaded.
    """

    step: int
    blocked_s: float
    durable_s: float
    bytes_written: int
    files: int


@dataclass
class _Job:
    step: int
    started: float
    blocked_s: float
    stream: Any  # np.ndarray view of the host buffer
    layout_total: int
    per_rank: Section
    replicated_tree: Any
    metrics: dict[str, Any]
    entries: Callable[[], tuple[dict[str, mf.TensorEntry], dict[str, mf.TensorEntry]]] = field(repr=False, default=None)  # type: ignore[assignment]


class _Comm:
    """The collectives the protocol needs, on a dedicated gloo group (or none, single process)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world = dist.get_world_size() if self.active else 1
        # A separate gloo group: the background thread's collectives never interleave with the
        # training loop's (NCCL or gloo) collectives on the default group.
        self._group = dist.new_group(backend="gloo") if self.active and self.world > 1 else None

    def all_gather(self, obj: Any) -> list[Any]:
        if self._group is None:
            return [obj]
        out: list[Any] = [None] * self.world
        self._dist.all_gather_object(out, obj, group=self._group)
        return out

    def broadcast(self, obj: Any) -> Any:
        if self._group is None:
            return obj
        box = [obj]
        self._dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]


_UNKNOWN = object()  # pointer version not read yet
_ABSENT = object()  # there was no pointer


class CheckpointManager:
    """Saves and restores training state under one root URL; see the module docstring.

    Args:
        root_url: any fsspec URL (``s3://bucket/run1/ckpt``, ``gs://...``, ``/local/dir``).
        retention: which committed checkpoints to keep (``KeepLast(2)`` by default; combine
            with ``|``, e.g. ``KeepLast(3) | KeepBest("val_loss")``).
        async_save: upload in a background thread (``save`` returns after the host snapshot).
        storage_options: fsspec options (endpoint, credentials); never logged or stored.
        options: part size, concurrency, compression, per-rank state names.
        retry: retry policy for transient storage errors.

    Call order: ``save``... (each waits for the previous), ``wait()`` to make the last one
    durable, ``close()``; ``restore`` at start. Under ``torch.distributed`` every rank constructs
    the manager and calls ``save``/``restore`` with the same steps (they are collective).
    """

    def __init__(
        self,
        root_url: str,
        *,
        retention: RetentionPolicy | None = None,
        async_save: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        options: SaveOptions | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.store = Store(root_url, storage_options, retry=retry)
        self._part_store = _part_reader(root_url, storage_options, retry, self.store)
        self.retention = retention if retention is not None else KeepLast(2)
        self.async_save = async_save
        self.options = options or SaveOptions()
        self._comm = _Comm()
        self._buffer = HostBuffer()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamio-ckpt")
        self._pending: concurrent.futures.Future[SaveStats] | None = None
        self._pointer_version: Any = _UNKNOWN
        self._metrics: dict[int, Mapping[str, Any]] = {}
        self._restored_at: datetime | None = None  # when restore() last succeeded
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

    # ------------------------------------------------------------------------------ save
    def save(self, step: int, state: Mapping[str, Any], *, metrics: Mapping[str, Any] | None = None) -> None:
        """Snapshot ``state`` and commit it as ``step`` (in the background if ``async_save``).

        Args:
            step: the training step (names the checkpoint; must not be committed already).
            state: name -> object with ``state_dict()`` (model, optimizer, scheduler, scaler,
                dataset, RNG state) or plain value (tensors, JSON-like values).
            metrics: numbers recorded in the manifest (what ``KeepBest`` ranks by).

        Raises:
            CheckpointError: the previous async save failed (raised here, once), or the state
                holds a value that cannot be saved without pickling.
            CheckpointConflictError: another job writes this root (also from the previous save).
        """
        if self._closed:
            raise CheckpointError(f"CheckpointManager for {self.store.root_url} is closed")
        mf.step_dir(step)  # validates
        t0 = time.perf_counter()
        self._wait_pending()
        job = self._snapshot(step, state, dict(metrics or {}), t0)
        if self.async_save:
            self._pending = self._executor.submit(self._commit, job)
        else:
            self.last_stats = self._commit(job)

    def wait(self) -> SaveStats | None:
        """Block until the save in flight is durable; raise its error if it failed.

        Returns:
            The stats of the last completed save (``None`` if none yet).
        """
        self._wait_pending()
        return self.last_stats

    def close(self) -> None:
        """Wait for the save in flight, then release the thread and host buffer."""
        if self._closed:
            return
        try:
            self._wait_pending()
        finally:
            self._closed = True
            self._executor.shutdown(wait=True)
            self._buffer = HostBuffer()

    def _wait_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self.last_stats = pending.result()  # re-raises the background error here

    def _snapshot(self, step: int, state: Mapping[str, Any], metrics: dict[str, Any], t0: float) -> _Job:
        comm, opts = self._comm, self.options
        rep_tensors: dict[str, torch.Tensor] = {}
        rank_tensors: dict[str, torch.Tensor] = {}
        rep_tree: dict[str, Any] = {}
        rank_tree: dict[str, Any] = {}
        buffers: set[str] = set()
        for name, obj in state.items():
            if not isinstance(name, str):
                raise CheckpointError(f"state names must be strings, got {name!r} while saving step {step}")
            if isinstance(obj, torch.nn.Module):
                buffers.update(f"{name}/{b}" for b, _ in obj.named_buffers())
            value = obj.state_dict() if callable(getattr(obj, "state_dict", None)) else obj
            if name in opts.per_rank:
                rank_tree[name] = TreeEncoder(rank_tensors).encode(value, name)
            else:
                rep_tree[name] = TreeEncoder(rep_tensors).encode(value, name)
        sizes = {k: t.numel() * t.element_size() for k, t in rep_tensors.items()}
        # Module buffers (BatchNorm statistics) differ between DDP ranks until the next forward
        # broadcasts rank 0's; parameters and optimizer state are identical, so they are shared.
        owner = assign_shares(sizes, comm.world, rank0=buffers)
        mine = [(k, rep_tensors[k]) for k in rep_tensors if owner[k] == comm.rank]
        ordered = mine + list(rank_tensors.items())
        layout = plan_layout(ordered)
        stream = self._buffer.snapshot(layout, dict(ordered))
        blocked = time.perf_counter() - t0
        rep_keys = {k for k, _ in mine}

        def entries() -> tuple[dict[str, mf.TensorEntry], dict[str, mf.TensorEntry]]:
            all_entries = tensor_entries(layout, stream, comm.rank)
            return ({k: e for k, e in all_entries.items() if k in rep_keys},
                    {k: e for k, e in all_entries.items() if k not in rep_keys})

        return _Job(
            step=step, started=t0, blocked_s=blocked, stream=stream, layout_total=layout.total,
            per_rank=Section(tree=rank_tree), replicated_tree=rep_tree if comm.rank == 0 else None,
            metrics=metrics, entries=entries,
        )

    def _commit(self, job: _Job) -> SaveStats:
        comm, store, opts = self._comm, self.store, self.options
        sdir = mf.step_dir(job.step)
        save_id = comm.broadcast(uuid.uuid4().hex[:12] if comm.rank == 0 else None)
        failure: str | None = None
        written = nfiles = 0
        try:
            if comm.rank == 0:
                self._check_step_free(job.step)
                if self._pointer_version is _UNKNOWN:
                    self._pointer_version = self._read_pointer_version()
            ranges = mf.split_ranges(job.layout_total, part_size_for(job.layout_total, opts, local=store.protocol == "file"))

            def upload(i: int) -> FileEntry:
                # checksum (and compression) run here, in parallel, overlapping the other PUTs
                start, end = ranges[i]
                data, checksum = encode_part(job.stream[start:end], opts.compression, opts.zstd_level)
                entry = FileEntry(mf.part_path(comm.rank, save_id, i), comm.rank, start, end - start, len(data), checksum, opts.compression)
                store.put(f"{sdir}/{entry.path}", data)
                return entry

            with concurrent.futures.ThreadPoolExecutor(max(1, opts.concurrency), thread_name_prefix="streamio-ckpt-put") as pool:
                entries_future = pool.submit(job.entries)  # tensor checksums, beside the uploads
                files = gather(pool, upload, range(len(ranges)))
                rep_entries, rank_entries = entries_future.result()
            self._check_uploaded(sdir, files)
            written, nfiles = sum(f.size for f in files), len(files)
            _phase("parts")
            marker = DoneMarker(
                rank=comm.rank, save_id=save_id, files=tuple(files), replicated_tensors=rep_entries,
                per_rank=Section(tree=job.per_rank.tree, tensors=rank_entries), replicated_tree=job.replicated_tree,
            )
            store.put(f"{sdir}/{mf.marker_path(comm.rank, save_id)}", mf.marker_to_bytes(marker), mode="create")
            _phase("markers")
        except Exception as exc:  # reported to every rank below, then re-raised
            failure = f"rank {comm.rank}: {type(exc).__name__}: {exc}"
            own_exc: BaseException | None = exc
        else:
            own_exc = None
        outcomes = comm.all_gather(failure)  # the barrier
        bad = [o for o in outcomes if o is not None]
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
        self._metrics[job.step] = job.metrics
        if comm.rank == 0:
            self._apply_retention(job.step)
        log.info("checkpoint step %d durable at %s (%.3f s blocked, %.3f s to durable)", job.step, store.url(sdir), job.blocked_s, durable)
        return SaveStats(job.step, job.blocked_s, durable, written, nfiles)

    def _publish(self, job: _Job, save_id: str) -> None:
        """Rank 0: markers -> manifest (create-only) -> latest.json (compare-and-swap)."""
        store, sdir = self.store, mf.step_dir(job.step)
        raw = store.read_many([f"{sdir}/{mf.marker_path(r, save_id)}" for r in range(self._comm.world)], concurrency=self.options.concurrency)
        markers = [mf.marker_from_bytes(b) for b in raw]
        manifest = mf.build_manifest(job.step, markers, metrics=job.metrics, software=software_stack(), created=_now())
        data = mf.manifest_to_bytes(manifest)
        try:
            store.put(mf.manifest_path(job.step), data, mode="create")
        except WriteConflictError as exc:
            raise CheckpointConflictError(
                f"{store.url(mf.manifest_path(job.step))} was created by someone else while this job saved step {job.step}: "
                f"another job writes the same checkpoint root; give each job its own root"
            ) from exc
        _phase("manifest")
        pointer = Pointer(step=job.step, path=sdir, manifest_checksum=checksum_bytes(data), save_id=save_id, created=manifest.created)
        expected = self._pointer_version
        try:
            if expected is _ABSENT:
                version = store.put(mf.LATEST, mf.pointer_to_bytes(pointer), mode="create")
            elif expected is None:  # the store reports no versions: nothing to compare against
                version = store.put(mf.LATEST, mf.pointer_to_bytes(pointer))
            else:
                version = store.put(mf.LATEST, mf.pointer_to_bytes(pointer), if_match=expected)
        except (WriteConflictError, ObjectNotFoundError) as exc:
            raise CheckpointConflictError(
                f"{store.url(mf.LATEST)} changed since this job last read it (expected {'no pointer' if expected is _ABSENT else f'version {expected!r}'}): another job "
                f"writes the same checkpoint root; step {job.step} is complete but not current. Give each job its own root"
            ) from exc
        self._pointer_version = version
        _phase("pointer")

    def _check_step_free(self, step: int) -> None:
        path = mf.manifest_path(step)
        try:
            data = self.store.read(path)
        except FileNotFoundError:
            return
        if self._abandoned(data):
            log.warning(
                "%s was written by a save that never swapped %s (the job died in between) before this job "
                "resumed from an older step; it is removed so that step %d can be saved again",
                self.store.url(path), self.store.url(mf.LATEST), step,
            )
            self.store.delete(path)
            return
        raise CheckpointConflictError(
            f"step {step} is already committed at {self.store.url(mf.step_dir(step))}: another job writes this "
            f"root, or this job saves a step twice (save steps after the one restore() returned)"
        )

    def _abandoned(self, manifest_data: bytes) -> bool:
        """Whether a manifest in the way of a save is left from an earlier run's crashed save.

        It is if the pointer never named it (its step is past the pointer's) and it was written
        before this manager restored: the job that wrote it died between the manifest and the
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
        pointed = self.latest_step()
        return pointed is None or pointed < found.step

    def _check_uploaded(self, sdir: str, files: list[FileEntry]) -> None:
        if not files:
            return
        listed = {o.path: o.size for o in self.store.list(f"{sdir}/{mf.rank_dir(self._comm.rank)}")}
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
            return self.store.info(mf.LATEST).version
        except FileNotFoundError:
            return _ABSENT

    # ------------------------------------------------------------------------------ retention
    def _apply_retention(self, current: int) -> None:
        try:
            records = self._records()
            for step in mf.steps_to_delete(self.retention, records, current=current):
                delete_step(self.store, step)
                self._metrics.pop(step, None)
                log.info("retention deleted checkpoint step %d under %s", step, self.store.root_url)
            _phase("retention")
        except Exception as exc:  # retention is housekeeping: the new checkpoint is committed
            log.warning("retention under %s failed after committing step %d: %s", self.store.root_url, current, exc)

    def _records(self) -> list[CheckpointRecord]:
        steps = committed_steps(self.store)
        unknown = [s for s in steps if s not in self._metrics]
        if unknown:
            for s, data in zip(unknown, self.store.read_many([mf.manifest_path(s) for s in unknown]), strict=True):
                try:
                    self._metrics[s] = mf.manifest_from_bytes(data).metrics
                except ManifestError:
                    self._metrics[s] = {}
        return [CheckpointRecord(s, self._metrics[s]) for s in steps]

    # ------------------------------------------------------------------------------ queries
    def latest_step(self) -> int | None:
        """The step ``latest.json`` names (read fresh), or ``None`` if there is no valid pointer."""
        try:
            return mf.pointer_from_bytes(self.store.read(mf.LATEST)).step
        except FileNotFoundError:
            return None
        except ManifestError as exc:
            log.warning("%s is unusable: %s", self.store.url(mf.LATEST), exc)
            return None

    def steps(self) -> list[int]:
        """Steps with a manifest (committed), oldest first."""
        return committed_steps(self.store)

    # ------------------------------------------------------------------------------ restore
    def restore(self, state: MutableMapping[str, Any], step: int | None = None) -> int:
        """Load a checkpoint into ``state`` in place and return its step.

        Objects with ``load_state_dict`` are loaded through it (tensors copied into the live
        ones where shapes match); plain values are replaced in ``state``. All or nothing: the
        manifest (against the pointer's checksum and its own), every part this rank needs, the
        decoding of the whole state and its fit with the live objects are all checked before
        the first live object changes (:mod:`.restore_plan`).

        Args:
            state: the same names as were saved.
            step: a specific step (no fallback); default: the pointer's, walking back to the
                newest complete checkpoint that verifies when it is unusable.

        Raises:
            CheckpointNotFoundError: no checkpoint under the root (or not ``step``).
            CheckpointFormatError: an unknown format version, a root written by another tool,
                or (with ``step``) a manifest or tree that does not verify or decode.
            CheckpointError: no checkpoint verifies, or the checkpoint does not fit ``state``
                (a name not saved, another model's keys, shapes or dtypes): nothing was loaded.
        """
        self._wait_pending()
        comm, explicit = self._comm, step is not None
        if explicit:
            candidates: list[tuple[int, str | None]] = [(step, None)]
        else:
            # the pointer alone first (no listing); the full list only if it fails
            candidates = comm.broadcast(self._candidates(full=False) if comm.rank == 0 else None)
            if isinstance(candidates, BaseException):
                raise candidates
        reasons: list[str] = []
        tried: set[int] = set()
        while candidates:
            s, expected = candidates.pop(0)
            tried.add(s)
            plan, bad = self._try_step(state, s, expected, explicit=explicit)
            if plan is not None:
                apply(plan, state, concurrency=self.options.concurrency, where=f"step {s} under {self.store.root_url}")
                log.info("restored checkpoint step %d from %s", s, self.store.url(mf.step_dir(s)))
                self._restored_at = datetime.now(timezone.utc)
                if self._pointer_version is _UNKNOWN and comm.rank == 0:
                    self._pointer_version = self._read_pointer_version()
                return s
            reasons.append(f"step {s}: {bad}")
            log.warning("checkpoint step %d under %s is unusable (%s); falling back to the previous complete "
                        "checkpoint", s, self.store.root_url, bad)
            if not candidates and not explicit and len(tried) == 1:
                more = comm.broadcast(self._candidates(full=True) if comm.rank == 0 else None)
                if isinstance(more, BaseException):
                    raise more
                candidates = [c for c in more if c[0] not in tried]
        if reasons:
            raise CheckpointError(f"no checkpoint under {self.store.root_url} verifies: {'; '.join(reasons)}")
        raise CheckpointNotFoundError(f"no checkpoint under {self.store.root_url}: nothing to restore (start from scratch)")

    def _try_step(
        self, state: Mapping[str, Any], s: int, expected: str | None, *, explicit: bool
    ) -> tuple[RestorePlan | None, str]:
        """Prepare step ``s`` on every rank and agree on the outcome (a collective).

        Returns:
            ``(plan, "")`` to load, or ``(None, why)`` to walk past a damaged checkpoint.

        Raises:
            every rank raises alike: this rank its own error where the failure is fatal (see
            :func:`_classify`), the others a ``CheckpointError`` naming it; ``CheckpointError``
            when the checkpoint does not fit the live state.
        """
        plan: RestorePlan | None = None
        own: BaseException | None = None
        outcome: tuple[str, str] | None = None
        try:
            plan = self._prepare(state, s, expected, explicit=explicit)
            mismatch = mismatches(plan)
            if mismatch is not None:
                outcome = ("mismatch", f"checkpoint step {s} under {self.store.root_url} does not fit the live state: "
                                       f"{mismatch}; nothing was loaded")
        except Exception as exc:  # classified, agreed on by every rank, then raised or walked past
            own, outcome = exc, (_classify(exc, explicit), str(exc))
        # kind -> the first rank's message of that kind
        outcomes = dict(reversed([o for o in self._comm.all_gather(outcome) if o is not None]))
        if "fatal" in outcomes:
            if own is None or outcome is None or outcome[0] != "fatal":
                raise CheckpointError(
                    f"restoring step {s} under {self.store.root_url} failed on another rank: {outcomes['fatal']}"
                )
            if explicit and isinstance(own, FileNotFoundError) and not isinstance(own, CheckpointError):
                raise CheckpointNotFoundError(
                    f"no complete checkpoint for step {s} under {self.store.root_url}: {own}"
                ) from own
            raise own
        if "bad" in outcomes:  # walked past before its fit with the live state is judged
            return None, outcomes["bad"]
        if "mismatch" in outcomes:
            raise CheckpointError(outcomes["mismatch"])
        return plan, ""

    def _candidates(self, *, full: bool) -> list[tuple[int, str | None]] | BaseException:
        """Rank 0: the pointer's step (if usable) with the manifest checksum it recorded, then
        (``full``, or no usable pointer) every committed step, newest first. Errors are returned,
        to be raised on every rank."""
        try:
            order: list[tuple[int, str | None]] = []
            try:
                pointer = mf.pointer_from_bytes(self.store.read(mf.LATEST))
                order.append((pointer.step, pointer.manifest_checksum))
            except FileNotFoundError:
                pass
            except ManifestError as exc:
                if exc.unknown_version and "upgrade streamio" in str(exc):
                    return CheckpointFormatError(f"{self.store.url(mf.LATEST)}: {exc}")
                log.warning("%s is unusable (%s); falling back to the newest complete checkpoint", self.store.url(mf.LATEST), exc)
            if order and not full:
                return order
            steps = committed_steps(self.store)
            if order and order[0][0] not in steps:
                log.warning("%s names step %d whose manifest is gone; falling back to the newest complete checkpoint",
                            self.store.url(mf.LATEST), order[0][0])
            order += [(s, None) for s in reversed(steps) if not order or s != order[0][0]]
            if not order:
                foreign = detect_foreign(self.store)
                if foreign:
                    return CheckpointFormatError(f"{self.store.root_url} holds {foreign}; it is not a streamio checkpoint root")
            return order
        except Exception as exc:
            return exc

    def _prepare(self, state: Mapping[str, Any], step: int, expected: str | None, *, explicit: bool) -> RestorePlan:
        """Everything of a restore that touches no live object: the manifest verified against
        ``expected`` (the pointer's checksum, if it names ``step``), its own seal and ``step``;
        every part this rank needs read and verified; the whole state decoded."""
        manifest = read_manifest(self.store, step, checksum=expected)
        if not manifest.checksum and expected is None:
            url = self.store.url(mf.manifest_path(step))
            if not explicit:
                raise CheckpointError(
                    f"{url} carries no checksum of its own (written by an older streamio) and {mf.LATEST} does not "
                    f"name it, so its JSON cannot be verified; restore it explicitly with step={step} if you trust it"
                )
            log.warning("%s carries no checksum of its own (written by an older streamio): its JSON is restored unverified",
                        url)
        rank, world = self._comm.rank, self._comm.world
        src_rank = rank % manifest.world_size
        wanted = dict(manifest.replicated.tensors)
        wanted.update(manifest.per_rank[src_rank].tensors)
        tensors = load_tensors(self._part_store, manifest, wanted, concurrency=self.options.concurrency)
        if world != manifest.world_size:
            log.warning("checkpoint step %d was saved by %d ranks and is restored by %d: rank %d gets rank %d's per-rank state",
                        step, manifest.world_size, world, rank, src_rank)
        return decode_state(state, manifest.replicated.tree, manifest.per_rank[src_rank].tree, tensors)


def _classify(exc: BaseException, explicit: bool) -> str:
    """How restore treats a failure before any live object changed: ``"bad"`` walks back to the
    previous checkpoint (damaged or missing objects, an invalid manifest or tree), ``"fatal"``
    raises on every rank (an explicit ``step=``, a format this streamio cannot read, a storage
    failure other than a missing object, anything unexpected)."""
    if explicit or getattr(exc, "unknown_version", False):
        return "fatal"
    if isinstance(exc, (CorruptDataError, CheckpointError)):
        return "bad"
    if isinstance(exc, FileNotFoundError):
        return "bad"
    return "fatal"


# ---------------------------------------------------------------------------------- helpers
def _part_reader(root_url: str, storage_options: Mapping[str, Any] | None, retry: RetryPolicy | None, store: Store) -> Store:
    """The Store that restore reads parts through: on S3, one whose client skips botocore's
    response-checksum pass (``response_checksum_validation="when_required"``), else ``store``.

    Why: that CRC32 is one more pass over every body (it cost ~0.12 s of s3fs's event-loop time
    per 300 MB when parts were read through s3fs; ``Store.read`` now runs it in the reading
    thread, :mod:`streamio.storage.s3sync`), while each part is checked anyway: its size and
    CRC32C are verified end to end (``verify_file``, GIL released) before any byte reaches a
    tensor. The manifest and the pointer keep the default client. A caller's own setting is kept.
    """
    if urllib.parse.urlsplit(root_url).scheme not in ("s3", "s3a"):
        return store
    opts = dict(storage_options or {})
    config = dict(opts.get("config_kwargs") or {})
    if "response_checksum_validation" in config:
        return store
    config["response_checksum_validation"] = "when_required"
    opts["config_kwargs"] = config
    return Store(root_url, opts, retry=retry)


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


def _phase(name: str) -> None:
    if _phase_hook is not None:
        _phase_hook(name)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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


def committed_steps(store: Store) -> list[int]:
    """Steps under ``store`` that have a manifest, oldest first (one fresh listing)."""
    steps = set()
    for o in store.list():
        head, _, tail = o.path.partition("/")
        if tail == mf.MANIFEST:
            s = mf.parse_step_dir(head)
            if s is not None:
                steps.add(s)
    return sorted(steps)


def read_manifest(store: Store, step: int, *, checksum: str | None = None) -> Manifest:
    """Read, verify and parse ``step``'s manifest.

    Args:
        checksum: what ``latest.json`` recorded for this manifest, when it names ``step``.

    Raises:
        CheckpointNotFoundError: no manifest (the step was never committed or was deleted).
        ManifestError: (a :class:`CheckpointFormatError`) an unknown format version
            (``unknown_version``), or a manifest that is invalid, claims another step, names a
            path outside its step directory, or does not match its own or ``checksum``.
    """
    path = mf.manifest_path(step)
    try:
        data = store.read(path)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(f"{store.url(path)} does not exist: step {step} was never committed or was deleted") from exc
    try:
        return mf.manifest_from_bytes(data, step=step, checksum=checksum)
    except ManifestError as exc:
        prefix = f"{store.url(path)}:" if exc.unknown_version else f"{store.url(path)} is unusable:"
        raise ManifestError(f"{prefix} {exc}", unknown_version=exc.unknown_version) from exc


def load_tensors(
    store: Store, manifest: Manifest, wanted: Mapping[str, mf.TensorEntry], *, concurrency: int = 8
) -> dict[str, VerifiedTensor]:
    """Read the parts holding ``wanted`` concurrently, verify every size and CRC32C.

    Nothing is returned unless every file and tensor verified; the bytes are copied into tensors
    only when loaded (``decode_tree``).
    """
    sdir = mf.step_dir(manifest.step)
    spans: dict[int, list[tuple[int, int]]] = {}
    for e in wanted.values():
        spans.setdefault(e.rank, []).append((e.offset, e.offset + e.nbytes))
    needed = [
        f for f in manifest.files
        if any(a < f.start + f.raw_size and f.start < b for a, b in spans.get(f.rank, ()))
    ]
    def fetch(f: FileEntry) -> bytes | memoryview:
        # verified in the reading thread: checksums overlap the other GETs (CRC32C drops the GIL)
        url = store.url(f"{sdir}/{f.path}")
        data = store.read_view(f"{sdir}/{f.path}")  # local: mapped, verified and copied from the page cache
        verify_file(data, f, url)
        return decode_part(data, f, url)

    parts: dict[int, dict[int, bytes | memoryview]] = {}
    with concurrent.futures.ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="streamio-ckpt-get") as pool:
        for f, raw in zip(needed, gather(pool, fetch, needed), strict=True):
            parts.setdefault(f.rank, {})[f.start] = raw
    readers = {r: StreamReader(p, r, store.url(sdir)) for r, p in parts.items()}

    def check(item: tuple[str, mf.TensorEntry]) -> VerifiedTensor:
        key, e = item
        if e.nbytes == 0:
            return StreamReader({}, e.rank, store.url(sdir)).tensor(key, e)
        if e.rank not in readers:
            raise CorruptDataError(f"tensor {key!r} of step {manifest.step} lives in rank {e.rank}'s parts, which the manifest does not list")
        # Every part holding this tensor passed its size and CRC32C check in fetch(), and the
        # tensor checksums were taken from the same snapshot bytes as the part checksums, so a
        # second pass over the bytes here would only re-prove it (it cost ~10% of a local
        # restore). The tensor's span is still checked against the parts (segments());
        # verify_checkpoint (``streamio ckpt verify``) checks both levels.
        return readers[e.rank].tensor(key, e, check=False)

    items = list(wanted.items())
    with concurrent.futures.ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="streamio-ckpt-crc") as pool:
        verified = gather(pool, check, items)
    return {key: v for (key, _), v in zip(items, verified, strict=True)}


def verify_checkpoint(store: Store, step: int, *, concurrency: int = 8) -> list[str]:
    """Every problem with ``step`` (each naming the object at fault); empty when it verifies.

    Reads every file the manifest lists, checks sizes and CRC32C, and every tensor's CRC32C.
    """
    try:
        manifest = read_manifest(store, step)
    except CheckpointError as exc:
        return [str(exc)]
    sdir = mf.step_dir(step)
    problems: list[str] = []
    parts: dict[int, dict[int, bytes | memoryview]] = {}
    for f in manifest.files:
        url = store.url(f"{sdir}/{f.path}")
        try:
            data = store.read_view(f"{sdir}/{f.path}")
            verify_file(data, f, url)
            parts.setdefault(f.rank, {})[f.start] = decode_part(data, f, url)
        except FileNotFoundError:
            problems.append(f"{url} is missing")
        except CorruptDataError as exc:
            problems.append(str(exc))
    if problems:
        return problems
    sections = [manifest.replicated, *manifest.per_rank]
    for section in sections:
        for key, e in section.tensors.items():
            try:
                StreamReader(parts.get(e.rank, {}), e.rank, store.url(sdir)).tensor(key, e)
            except (CorruptDataError, CheckpointFormatError) as exc:
                problems.append(str(exc))
    return problems


def delete_step(store: Store, step: int) -> None:
    """Delete a checkpoint: its manifest first (so it is never seen half-deleted), then the rest."""
    sdir = mf.step_dir(step)
    store.delete(mf.manifest_path(step))
    _phase("delete")
    for o in store.list(sdir + "/"):
        store.delete(o.path)


def detect_foreign(store: Store) -> str | None:
    """What another tool's checkpoint under ``store`` looks like, or ``None``."""
    url = store.root_url.lower()
    for suffix, what in _FOREIGN.items():
        if suffix.startswith(".") and url.endswith(suffix):
            return what
    try:
        listing = store.list()
    except FileNotFoundError:
        return None
    for o in listing:
        name = o.path.rsplit("/", 1)[-1]
        for suffix, what in _FOREIGN.items():
            if name == suffix or (suffix.startswith(".") and name.endswith(suffix)):
                return what
    return None


@dataclass(frozen=True)
class GarbageReport:
    """What ``collect_garbage`` found (and deleted unless ``dry_run``)."""

    objects: tuple[str, ...]
    bytes: int
    multipart_uploads: tuple[str, ...] = ()


def collect_garbage(store: Store, *, dry_run: bool = False, min_age_s: float = 3600.0) -> GarbageReport:
    """Delete what no committed checkpoint refers to.

    Orphans are: objects under a step prefix without a manifest when a newer step is committed
    (an abandoned save; a save in progress is always newer than every committed step), objects
    under a committed step that its manifest does not list (a losing concurrent save; markers of
    the committed save are kept), and, on S3, multipart uploads under the root older than
    ``min_age_s`` (a killed uploader's invisible, billed parts).
    """
    listing = store.list()
    committed = set(committed_steps(store))
    newest = max(committed) if committed else None
    try:
        pointer_step: int | None = mf.pointer_from_bytes(store.read(mf.LATEST)).step
    except (FileNotFoundError, ManifestError):
        pointer_step = None
    keep_files: dict[int, set[str]] = {}
    for s in committed:
        try:
            m = read_manifest(store, s)
        except CheckpointError:
            continue  # a corrupt manifest is for `verify` to report, not for gc to guess at
        keep_files[s] = {f.path for f in m.files} | {mf.MANIFEST} | {mf.marker_path(r, m.save_id) for r in range(m.world_size)}
    doomed: list[Any] = []
    for o in listing:
        head, _, rest = o.path.partition("/")
        s = mf.parse_step_dir(head)
        if s is None or not rest:
            continue
        if s in committed:
            if s in keep_files and rest not in keep_files[s]:
                doomed.append(o)
        elif newest is not None and s < newest and s != pointer_step:
            doomed.append(o)
    if not dry_run:
        for o in doomed:
            store.delete(o.path)
    uploads = _abandoned_uploads(store, dry_run=dry_run, min_age_s=min_age_s)
    return GarbageReport(tuple(o.path for o in doomed), sum(o.size for o in doomed), uploads)


def _abandoned_uploads(store: Store, *, dry_run: bool, min_age_s: float) -> tuple[str, ...]:
    """Incomplete multipart uploads under the root older than ``min_age_s`` (S3 only), aborted."""
    try:
        uploads = store.incomplete_uploads()
    except StorageError as exc:
        log.warning("could not list multipart uploads under %s: %s", store.root_url, exc)
        return ()
    now = datetime.now(timezone.utc)
    found: list[str] = []
    for upload in uploads:
        if upload.initiated is not None and (now - upload.initiated).total_seconds() < min_age_s:
            continue
        found.append(f"{store.url(upload.path)} (upload {upload.upload_id})")
        if not dry_run:
            store.abort_upload(upload)
    return tuple(found)


def check_pointer(store: Store) -> tuple[int | None, list[str]]:
    """The step ``latest.json`` names and what is wrong with the pointer itself (if anything)."""
    url = store.url(mf.LATEST)
    try:
        data = store.read(mf.LATEST)
    except FileNotFoundError:
        return None, [f"{url} does not exist: no checkpoint was ever committed here (or it was deleted)"]
    try:
        pointer = mf.pointer_from_bytes(data)
    except ManifestError as exc:
        return None, [f"{url} is corrupt: {exc}"]
    try:
        manifest_data = store.read(mf.manifest_path(pointer.step))
    except FileNotFoundError:
        return pointer.step, [f"{url} names step {pointer.step} but {store.url(mf.manifest_path(pointer.step))} does not exist"]
    if checksum_bytes(manifest_data) != pointer.manifest_checksum:
        return pointer.step, [f"{url} names step {pointer.step} with manifest checksum {pointer.manifest_checksum}, "
                              f"but {store.url(mf.manifest_path(pointer.step))} has {checksum_bytes(manifest_data)}"]
    return pointer.step, []
