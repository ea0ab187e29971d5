"""The restore walk: which checkpoint to load, verified in full before any live object changes.

:meth:`Restorer.restore` reads the pointer fresh (never a cached listing), checks the manifest
against the checksum the pointer recorded and against its own seal and step, reads every part
this rank needs with concurrent GETs, verifies sizes and CRC32C of files and tensors
(:func:`~.tensors.fetch.load_tensors`), decodes the whole state and checks it against the live objects
(:mod:`.plan`), and only then loads anything. If the pointer is missing, corrupt or names
a checkpoint that fails any of this, it walks back to the newest complete checkpoint *of the
current timeline* that verifies (:mod:`.candidates`) and logs why (explicit ``step=`` never
walks back); a checkpoint that verifies but does not fit the live objects (another model)
raises, with nothing loaded. A save the walk rejected is recorded as bad in the root
(:func:`~.root.record_bad`, rank 0), so ``streamio ckpt ls`` flags it, later restores skip it
and retention and ``gc`` remove it. So it is judged on the store's bytes alone: bytes that do
not verify are read again from the store first (a byte flipped on the way is not the store's
fault: :func:`~.tensors.fetch.read_confirmed`, :meth:`~.sharing.SharedReads.verified`), bytes
another rank sent are never held against the save (:mod:`~.tensors.fanout`), and a failed
collective (a rank died) is raised as such, never classified.

Sharded tensors (DTensors) are bound to the live tensors while the state decodes, and then just
the boxes this rank holds now, in whatever sharding, are read with ranged, block-verified GETs
(:mod:`.tensors.resharding`), before anything is loaded, like every other part.

Under ``torch.distributed`` every step of the walk is agreed on: rank 0 reads the candidates and
broadcasts them, and every rank reports its outcome for each candidate, so all ranks load the
same step or all raise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from streamio.checkpoint.comm import Comm
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.timeline import Point, Tip
from streamio.checkpoint.restore import candidates
from streamio.checkpoint.restore.candidates import Candidate
from streamio.checkpoint.restore.local import LocalCopies, current_tip, merge, on_tip
from streamio.checkpoint.restore.plan import RestorePlan, apply, decode_state, mismatches
from streamio.checkpoint.restore.sharing import Found, SharedReads
from streamio.checkpoint.root import UNREAD, pointer_version, record_bad
from streamio.checkpoint.tensors.fanout import Key
from streamio.checkpoint.tensors.fetch import Received, load_tensors, places_of
from streamio.checkpoint.tensors.resharding import read_pending, sources_for
from streamio.errors import CheckpointError, CheckpointNotFoundError, CorruptDataError, StorageError
from streamio.storage import Store

__all__ = ["Restorer"]

log = logging.getLogger(__name__)


class _Unverified(CheckpointError):
    """A manifest without a seal that the pointer does not name: walked past, but not damaged
    (so not recorded bad)."""


class Restorer:
    """Finds, verifies and loads a checkpoint under one root; see the module docstring.

    Args:
        store: the checkpoint root (manifests and the pointer are read through it).
        comm: the collectives (every rank calls :meth:`restore` alike).
        concurrency: parallel GETs and checks.
        part_store: the Store parts are read through (default ``store``; the manager passes
            ``store.for_verified_reads()``: every part is size- and CRC32C-checked here).
        local: the local tier's copies, read first.
        fanout: under ``torch.distributed``, the parts several ranks need are read once per job
            and exchanged over the process group (:mod:`~..tensors.fanout`).

    Attributes:
        outcome: after a restore, the save it loaded and (rank 0) the pointer's version (what the
            job's next pointer swap expects): from the GET that read the pointer the walk started
            from (:func:`~.candidates.versioned_pointer`), or, for an explicit ``step``, read before
            anything else; ``None`` before.
    """

    def __init__(
        self, store: Store, comm: Comm, *, concurrency: int, part_store: Store | None = None,
        local: LocalCopies | None = None, fanout: bool = True,
    ) -> None:
        self.store, self.comm, self.concurrency = store, comm, concurrency
        self.part_store = part_store if part_store is not None else store
        self.local = local
        self.shared = SharedReads(store, comm, self.part_store, concurrency=concurrency, fanout=fanout)
        self.outcome: tuple[Point, Any] | None = None
        self._loaded: Manifest | None = None
        self._from_local = False  # the manifest loaded came from this rank's local copy
        self._tip: Tip | None = None  # with a local tier: the timeline restore stands on (:func:`.local.current_tip`)

    def restore(self, state: MutableMapping[str, Any], step: int | None = None) -> int:
        """Load a checkpoint into ``state`` in place, all or nothing, and return its step.

        See :meth:`~.manager.CheckpointManager.restore` (arguments, errors).
        """
        explicit, root = step is not None, self.store.root_url
        self.outcome, self._tip = None, None
        version: Any = self._version() if explicit and self.comm.rank == 0 else None  # before anything is read

        def first() -> list[Candidate]:  # rank 0: the pointer alone (no listing); the full list only if it fails
            nonlocal version
            found, read = self._root_candidates(step, full=False)
            version = version if explicit else read  # the walk's: from the GET that read the pointer
            return found

        todo = self._with_local(self._agreed(first), step)
        reasons: list[str] = []
        tried: set[str] = set()
        listed = explicit
        while todo:
            c = todo.pop(0)
            tried.add(c.path)
            if c.skip:
                reasons.append(f"step {c.step}: {c.skip}")
                log.warning("checkpoint step %d under %s is skipped: %s", c.step, root, c.skip)
            else:
                plan, bad = self._try_step(state, c, explicit=explicit)
                if plan is not None:
                    apply(plan, state, concurrency=self.concurrency, where=f"step {c.step} under {root}")
                    assert self._loaded is not None
                    self.outcome = (Point(self._loaded.line, c.step, c.path), version)
                    where = self.local.store if self._from_local else self.store
                    log.info("restored checkpoint step %d from %s", c.step, where.url(c.path))
                    return c.step
                reasons.append(f"step {c.step}: {bad}")
                log.warning("checkpoint step %d under %s is unusable (%s); falling back to the previous complete "
                            "checkpoint", c.step, root, bad)
            if not todo and not listed:
                listed = True
                todo = [c for c in self._agreed(lambda: self._root_candidates(None, full=True)[0])
                        if c.path not in tried and on_tip(self._tip, c)]
        if reasons:
            raise CheckpointError(f"no checkpoint under {root} verifies: {'; '.join(reasons)}")
        raise CheckpointNotFoundError(f"no checkpoint under {root}: nothing to restore (start from scratch)")

    def _version(self) -> Any:
        """The pointer's version (what the job's next swap expects); :data:`~.root.UNREAD` when the
        root does not answer and a local tier can restore (the next swap reads it then)."""
        try:
            return pointer_version(self.store)
        except StorageError:
            if self.local is None:
                raise
            return UNREAD

    def _root_candidates(self, step: int | None, *, full: bool) -> tuple[list[Candidate], Any]:
        """The root's candidates, and the version of the pointer the walk read (``None`` for an
        explicit ``step``, whose :meth:`_version` was read before); none, with a warning, when the
        root does not answer and a local tier can (the version then :data:`~.root.UNREAD`)."""
        try:
            if step is not None:
                return candidates.explicit(self.store, step), None
            return candidates.walk(self.store, full=full)
        except StorageError as exc:
            if self.local is None:
                raise
            log.warning("the checkpoint root %s does not answer (%s); restoring from the local tier",
                        self.store.root_url, exc)
            return [], UNREAD
        except CheckpointNotFoundError:
            if self.local is None:
                raise
            return [], None if step is not None else self._version()

    def _with_local(self, durable: list[Candidate], step: int | None) -> list[Candidate]:
        """``durable`` and every rank's local candidates, newest first (:mod:`.local`); for an
        explicit ``step``, its local saves first: the root's candidate is only the step's own
        directory when the root has no save of the step (a save on the local tier alone)."""
        if self.local is None:
            return durable
        found = self.comm.all_gather(self.local.candidates())
        merged = merge(durable, found)
        if step is None:  # the saves of the newest timeline, whichever tier holds them
            self._tip = current_tip(durable, found)
            return [c for c in merged if on_tip(self._tip, c)]
        local = {c.path for cs in found for c in cs}
        return sorted((c for c in merged if c.step == step), key=lambda c: c.path not in local)

    def _agreed(self, find: Callable[[], list[Candidate]]) -> list[Candidate]:
        """Rank 0's ``find()`` on every rank (its error raised on every rank)."""
        found: list[Candidate] | BaseException | None = None
        if self.comm.rank == 0:
            try:
                found = find()
            except Exception as exc:
                found = exc
        found = self.comm.broadcast(found)
        if isinstance(found, BaseException):
            raise found
        assert found is not None
        return found

    def _try_step(
        self, state: Mapping[str, Any], c: Candidate, *, explicit: bool
    ) -> tuple[RestorePlan | None, str]:
        """Prepare step ``s`` on every rank and agree on the outcome (a collective).

        Returns:
            ``(plan, "")`` to load, or ``(None, why)`` to walk past a damaged checkpoint.

        Raises:
            every rank raises alike: this rank its own error where the failure is fatal (see
            :func:`_classify`), the others a ``CheckpointError`` naming it; ``CheckpointError``
            when the checkpoint does not fit the live state.
        """
        root, s = self.store.root_url, c.step
        plan, own, outcome = self._attempt(state, c, explicit=explicit)
        # kind -> the first rank's message of that kind
        outcomes = dict(reversed([o for o in self.comm.all_gather(outcome) if o is not None]))
        if "fatal" in outcomes:
            if own is None or outcome is None or outcome[0] != "fatal":
                raise CheckpointError(f"restoring step {s} under {root} failed on another rank: {outcomes['fatal']}")
            if explicit and isinstance(own, FileNotFoundError) and not isinstance(own, CheckpointError):
                raise CheckpointNotFoundError(f"no complete checkpoint for step {s} under {root}: {own}") from own
            raise own
        if "unverified" in outcomes:
            return None, outcomes["unverified"]
        if "bad" in outcomes:  # walked past before its fit with the live state is judged
            if self.comm.rank == 0:
                record_bad(self.store, c.path, s, outcomes["bad"])
            return None, outcomes["bad"]
        if "mismatch" in outcomes:
            raise CheckpointError(outcomes["mismatch"])
        return plan, ""

    def _attempt(
        self, state: Mapping[str, Any], c: Candidate, *, explicit: bool
    ) -> tuple[RestorePlan | None, BaseException | None, tuple[str, str] | None]:
        """This rank's part of trying ``c``: its plan, or its error and how it is classified
        (``(kind, message)``; ``"mismatch"`` when the plan does not fit the live state)."""
        found: Found | None = None
        failed: Exception | None = None
        nearest = self._nearest(c)
        try:
            shared = self.shared.manifest(c, need=nearest is None)  # a collective: every rank, every attempt
            found = self._find(c, nearest or shared, explicit=explicit)
        except Exception as exc:
            failed = exc
        if failed is not None and failed is self.comm.failure:
            raise failed  # a rank died or stopped mid-collective: nothing can be agreed on any more
        try:  # classified, agreed on by every rank, then raised or walked past
            fetched = self.shared.parts(found, c)  # a collective: also on a rank that failed above
            if failed is not None:
                raise failed
            assert found is not None
            plan = self._prepare(state, c, found, fetched)
        except Exception as exc:
            if self.comm.failure is not None:
                raise  # as above: never classified (a lost rank says nothing of the checkpoint)
            return None, exc, (_classify(exc, explicit), str(exc))
        mismatch = mismatches(plan)
        if mismatch is not None:
            return plan, None, ("mismatch", f"checkpoint step {c.step} under {self.store.root_url} does not fit the "
                                            f"live state: {mismatch}; nothing was loaded")
        return plan, None, None

    def _nearest(self, c: Candidate) -> Manifest | None:
        """``c``'s manifest from this rank's local tier, verified; None if it has none that verifies."""
        try:
            return self.local.manifest(c) if self.local is not None else None
        except Exception as exc:  # noqa: BLE001 - the root's copy is read instead
            log.warning("the local copy of step %d's manifest is unusable (%s); reading the root's", c.step, exc)
            return None

    def _find(self, c: Candidate, nearest: Manifest | bytes | memoryview | None, *, explicit: bool) -> Found:
        """The save's manifest (``nearest``: this rank's local copy, or the root's bytes another
        rank read; else read here), verified against the pointer's checksum (if it names this
        save), its own seal and step, and where this rank reads its parts."""
        step, expected = c.step, c.checksum
        self._from_local = isinstance(nearest, Manifest)
        manifest = nearest if isinstance(nearest, Manifest) else self.shared.verified(c, nearest)
        if not manifest.checksum and expected is None:
            url = self.store.url(layout.manifest_at(c.path))
            if not explicit:
                raise _Unverified(
                    f"{url} carries no checksum of its own (written by an older streamio) and latest.json does "
                    f"not name it, so its JSON cannot be verified; restore it explicitly with step={step} "
                    f"if you trust it"
                )
            log.warning("%s carries no checksum of its own (written by an older streamio): "
                        "its JSON is restored unverified", url)
        src_rank = self.comm.rank % manifest.world_size
        wanted = dict(manifest.replicated.tensors)
        wanted.update(manifest.per_rank[src_rank].tensors)
        parts = self.local.places(self.part_store) if self.local is not None else places_of(self.part_store)
        return Found(manifest, wanted, parts, src_rank)

    def _prepare(self, state: Mapping[str, Any], c: Candidate, found: Found,
                 fetched: Mapping[Key, Received]) -> RestorePlan:
        """Everything of a restore that touches no live object: every part this rank needs read
        (or taken from ``fetched``) and verified; the whole state decoded."""
        manifest, wanted, parts, src_rank = found.manifest, found.wanted, found.parts, found.src_rank
        step, rank, world = c.step, self.comm.rank, self.comm.world
        tensors = load_tensors(parts, manifest, wanted, concurrency=self.concurrency, sdir=c.path, fetched=fetched)
        if world != manifest.world_size:
            log.warning("checkpoint step %d was saved by %d ranks and is restored by %d: "
                        "rank %d gets rank %d's per-rank state", step, manifest.world_size, world, rank, src_rank)
        self._loaded = manifest
        sources, pending = sources_for(manifest.sharded)  # DTensors: bound to the live ones while decoding
        plan = decode_state(state, manifest.replicated.tree, manifest.per_rank[src_rank].tree, {**tensors, **sources})
        if pending:  # read and verify just the boxes this rank holds now (any sharding), before loading
            plan.copies.extend(read_pending(parts, manifest.files, pending, place=manifest.place(c.path),
                                            concurrency=self.concurrency))
        return plan


def _classify(exc: BaseException, explicit: bool) -> str:
    """How restore treats a failure before any live object changed: ``"bad"`` walks back to the
    previous checkpoint (damaged or missing objects, an invalid manifest or tree), ``"fatal"``
    raises on every rank (an explicit ``step=``, a format this streamio cannot read, a storage
    failure other than a missing object, anything unexpected)."""
    if explicit or getattr(exc, "unknown_version", False):
        return "fatal"
    if isinstance(exc, _Unverified):
        return "unverified"
    if isinstance(exc, (CorruptDataError, CheckpointError)):
        return "bad"
    if isinstance(exc, FileNotFoundError):
        return "bad"
    return "fatal"
