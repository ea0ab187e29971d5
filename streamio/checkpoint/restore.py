"""The restore walk: which checkpoint to load, verified in full before any live object changes.

:meth:`Restorer.restore` reads the pointer fresh (never a cached listing), checks the manifest
against the checksum the pointer recorded and against its own seal and step, reads every part
this rank needs with concurrent GETs, verifies sizes and CRC32C of files and tensors
(:func:`load_tensors`), decodes the whole state and checks it against the live objects
(:mod:`.restore_plan`), and only then loads anything. If the pointer is missing, corrupt or names
a checkpoint that fails any of this, it walks back to the newest complete checkpoint that
verifies and logs why (explicit ``step=`` never walks back); a checkpoint that verifies but does
not fit the live objects (another model) raises, with nothing loaded.

Under ``torch.distributed`` every step of the walk is agreed on: rank 0 reads the candidates and
broadcasts them, and every rank reports its outcome for each candidate, so all ranks load the
same step or all raise.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from streamio.checkpoint import layout
from streamio.checkpoint import manifest as mf
from streamio.checkpoint.catalog import committed_steps, detect_foreign, read_manifest
from streamio.checkpoint.comm import Comm
from streamio.checkpoint.records import FileEntry, Manifest, TensorEntry
from streamio.checkpoint.restore_plan import RestorePlan, apply, decode_state, mismatches
from streamio.checkpoint.serialize import StreamReader, decode_part, verify_file
from streamio.checkpoint.tree import VerifiedTensor
from streamio.checkpoint.validate import ManifestError
from streamio.errors import CheckpointError, CheckpointFormatError, CheckpointNotFoundError, CorruptDataError
from streamio.pool import gather
from streamio.storage import Store

__all__ = ["Restorer", "load_tensors"]

log = logging.getLogger(__name__)

Candidate = tuple[int, str | None]  # (step, the manifest checksum the pointer recorded for it)


class Restorer:
    """Finds, verifies and loads a checkpoint under one root; see the module docstring.

    Args:
        store: the checkpoint root (manifests and the pointer are read through it).
        comm: the collectives (every rank calls :meth:`restore` alike).
        concurrency: parallel GETs and checks.
        part_store: the Store parts are read through (default ``store``; the manager passes
            ``store.for_verified_reads()``: every part is size- and CRC32C-checked here).
    """

    def __init__(self, store: Store, comm: Comm, *, concurrency: int, part_store: Store | None = None) -> None:
        self.store, self.comm, self.concurrency = store, comm, concurrency
        self.part_store = part_store if part_store is not None else store

    def restore(self, state: MutableMapping[str, Any], step: int | None = None) -> int:
        """Load a checkpoint into ``state`` in place, all or nothing, and return its step.

        See :meth:`~.manager.CheckpointManager.restore` (arguments, errors).
        """
        explicit, root = step is not None, self.store.root_url
        if step is not None:
            candidates: list[Candidate] = [(step, None)]
        else:
            # the pointer alone first (no listing); the full list only if it fails
            candidates = self._agreed_candidates(full=False)
        reasons: list[str] = []
        tried: set[int] = set()
        while candidates:
            s, expected = candidates.pop(0)
            tried.add(s)
            plan, bad = self._try_step(state, s, expected, explicit=explicit)
            if plan is not None:
                apply(plan, state, concurrency=self.concurrency, where=f"step {s} under {root}")
                log.info("restored checkpoint step %d from %s", s, self.store.url(layout.step_dir(s)))
                return s
            reasons.append(f"step {s}: {bad}")
            log.warning("checkpoint step %d under %s is unusable (%s); falling back to the previous complete "
                        "checkpoint", s, root, bad)
            if not candidates and not explicit and len(tried) == 1:
                candidates = [c for c in self._agreed_candidates(full=True) if c[0] not in tried]
        if reasons:
            raise CheckpointError(f"no checkpoint under {root} verifies: {'; '.join(reasons)}")
        raise CheckpointNotFoundError(f"no checkpoint under {root}: nothing to restore (start from scratch)")

    def _agreed_candidates(self, *, full: bool) -> list[Candidate]:
        """Rank 0's :meth:`_candidates` on every rank (its error raised on every rank)."""
        found = self.comm.broadcast(self._candidates(full=full) if self.comm.rank == 0 else None)
        if isinstance(found, BaseException):
            raise found
        return found

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
        root = self.store.root_url
        plan: RestorePlan | None = None
        own: BaseException | None = None
        outcome: tuple[str, str] | None = None
        try:
            plan = self._prepare(state, s, expected, explicit=explicit)
            mismatch = mismatches(plan)
            if mismatch is not None:
                outcome = ("mismatch", f"checkpoint step {s} under {root} does not fit the live state: "
                                       f"{mismatch}; nothing was loaded")
        except Exception as exc:  # classified, agreed on by every rank, then raised or walked past
            own, outcome = exc, (_classify(exc, explicit), str(exc))
        # kind -> the first rank's message of that kind
        outcomes = dict(reversed([o for o in self.comm.all_gather(outcome) if o is not None]))
        if "fatal" in outcomes:
            if own is None or outcome is None or outcome[0] != "fatal":
                raise CheckpointError(f"restoring step {s} under {root} failed on another rank: {outcomes['fatal']}")
            if explicit and isinstance(own, FileNotFoundError) and not isinstance(own, CheckpointError):
                raise CheckpointNotFoundError(f"no complete checkpoint for step {s} under {root}: {own}") from own
            raise own
        if "bad" in outcomes:  # walked past before its fit with the live state is judged
            return None, outcomes["bad"]
        if "mismatch" in outcomes:
            raise CheckpointError(outcomes["mismatch"])
        return plan, ""

    def _candidates(self, *, full: bool) -> list[Candidate] | BaseException:
        """Rank 0: the pointer's step (if usable) with the manifest checksum it recorded, then
        (``full``, or no usable pointer) every committed step, newest first. Errors are returned,
        to be raised on every rank."""
        try:
            order: list[Candidate] = []
            latest = self.store.url(layout.LATEST)
            try:
                pointer = mf.pointer_from_bytes(self.store.read(layout.LATEST))
                order.append((pointer.step, pointer.manifest_checksum))
            except FileNotFoundError:
                pass
            except ManifestError as exc:
                if exc.unknown_version and "upgrade streamio" in str(exc):
                    return CheckpointFormatError(f"{latest}: {exc}")
                log.warning("%s is unusable (%s); falling back to the newest complete checkpoint", latest, exc)
            if order and not full:
                return order
            steps = committed_steps(self.store)
            if order and order[0][0] not in steps:
                log.warning("%s names step %d whose manifest is gone; falling back to the newest complete checkpoint",
                            latest, order[0][0])
            order += [(s, None) for s in reversed(steps) if not order or s != order[0][0]]
            if not order:
                foreign = detect_foreign(self.store)
                if foreign:
                    return CheckpointFormatError(
                        f"{self.store.root_url} holds {foreign}; it is not a streamio checkpoint root"
                    )
            return order
        except Exception as exc:
            return exc

    def _prepare(self, state: Mapping[str, Any], step: int, expected: str | None, *, explicit: bool) -> RestorePlan:
        """Everything of a restore that touches no live object: the manifest verified against
        ``expected`` (the pointer's checksum, if it names ``step``), its own seal and ``step``;
        every part this rank needs read and verified; the whole state decoded."""
        manifest = read_manifest(self.store, step, checksum=expected)
        if not manifest.checksum and expected is None:
            url = self.store.url(layout.manifest_path(step))
            if not explicit:
                raise CheckpointError(
                    f"{url} carries no checksum of its own (written by an older streamio) and {layout.LATEST} does "
                    f"not name it, so its JSON cannot be verified; restore it explicitly with step={step} "
                    f"if you trust it"
                )
            log.warning("%s carries no checksum of its own (written by an older streamio): "
                        "its JSON is restored unverified", url)
        rank, world = self.comm.rank, self.comm.world
        src_rank = rank % manifest.world_size
        wanted = dict(manifest.replicated.tensors)
        wanted.update(manifest.per_rank[src_rank].tensors)
        tensors = load_tensors(self.part_store, manifest, wanted, concurrency=self.concurrency)
        if world != manifest.world_size:
            log.warning("checkpoint step %d was saved by %d ranks and is restored by %d: "
                        "rank %d gets rank %d's per-rank state", step, manifest.world_size, world, rank, src_rank)
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


def load_tensors(
    store: Store, manifest: Manifest, wanted: Mapping[str, TensorEntry], *, concurrency: int = 8
) -> dict[str, VerifiedTensor]:
    """Read the parts holding ``wanted`` concurrently, verify every size and CRC32C.

    Nothing is returned unless every file and tensor verified; the bytes are copied into tensors
    only when loaded (``decode_tree``).
    """
    sdir = layout.step_dir(manifest.step)
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

    def check(item: tuple[str, TensorEntry]) -> VerifiedTensor:
        key, e = item
        if e.nbytes == 0:
            return StreamReader({}, e.rank, store.url(sdir)).tensor(key, e)
        if e.rank not in readers:
            raise CorruptDataError(
                f"tensor {key!r} of step {manifest.step} lives in rank {e.rank}'s parts, "
                f"which the manifest does not list"
            )
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
