"""Where a save goes and on which timeline: rank 0's view of where the job stands.

docs/design.md "Commit protocol" and docs/checkpoint-lifecycle.md. Every job saves on a timeline
of its own (:mod:`~..format.timeline`), continuing the save it restored (or, if it did not
restore, the one the pointer names), so a step saved again after a restore went back past it gets
a save directory of its own and supersedes the old save. :class:`Planner` keeps that state for
rank 0 (the other ranks follow its broadcast) and decides each save's :class:`SavePlan` before
anything is written. Refused then: a step this job already saved (or one before it) on its
timeline, and, for a job that never restored, a step at or before the pointer's or one that
already has a manifest (another job writes this root, or the job forgot ``restore()``).

*Offline* planning (a local tier's save while the root does not answer) reads nothing of the
root: it continues the job's own timeline (or the save it restored; a job that did neither starts
a new timeline and is told so) and always takes a save directory of its own
(``step-N-<save id>``), since whether the step's own directory is free cannot be asked.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from streamio.checkpoint import root
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.timeline import Point, Timeline, branch
from streamio.checkpoint.root import read_pointer, read_pointer_versioned
from streamio.errors import CheckpointConflictError, CheckpointError
from streamio.storage import Store

__all__ = ["Planner", "SavePlan", "current_point"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavePlan:
    """Rank 0's decisions for one save: where it goes and on which timeline.

    Attributes:
        step: the step saved.
        save_id: the save's id (in its part and marker names).
        sdir: its save directory.
        timeline: the timeline it extends.
        parent: the save directory this save follows (``""`` if none).
        prefixes: how many key prefixes the ranks' parts and markers are spread over.
        offline: planned without reading the root (it did not answer).
    """

    step: int
    save_id: str
    sdir: str
    timeline: Timeline
    parent: str
    prefixes: int = 1
    offline: bool = False

    @property
    def place(self) -> layout.Placement:
        """Where the save's objects go."""
        return layout.Placement(self.sdir, self.prefixes)


class Planner:
    """Rank 0's timeline state for one root (see the module docstring).

    Call order: :meth:`restored` after a restore (if any); then per save :meth:`plan`, and once
    the save is committed somewhere (the root, or a local tier) :meth:`committed`, or, when a
    commit failed past its manifest, :meth:`abandon`.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._parent: Point | None = None  # what the job's next new timeline continues
        self._restored = False  # restore() said where the job stands
        self._timeline: Timeline | None = None  # the job's timeline, once it committed on it
        self._last: Point | None = None  # the job's last commit

    def restored(self, point: Point | None) -> None:
        """This job has just restored the save ``point`` (``None``: there was none): its next
        save starts a new timeline continuing it."""
        self._restored, self._timeline, self._last = True, None, None
        self._parent = point

    def plan(self, step: int, *, offline: bool = False, own_dir: bool = False, prefixes: int = 1) -> SavePlan:
        """The save of ``step``: its id, directory and timeline.

        Args:
            offline: read nothing of the root (see the module docstring).
            own_dir: always a save directory of its own (``step-N-<save id>``): a save that
                also lives on a local tier, where the step's own directory may hold another
                save of the step than the root's.
            prefixes: how many key prefixes the ranks' objects are spread over.

        Raises:
            CheckpointConflictError: the step is not past this job's last save on its timeline,
                or (a job that never restored) not past the pointer's, or already has a manifest.
            CheckpointError: the pointer is unusable and this job never restored.
        """
        if self._timeline is not None and self._last is not None:
            if step <= self._last.step:
                what = ("is already committed by this job" if step == self._last.step
                        else f"comes before step {self._last.step}, which this job saved last")
                raise CheckpointConflictError(
                    f"step {step} {what} (at {self.store.url(self._last.path)}): another job writes this root, or "
                    f"this job saves a step twice (save steps after the one save() or restore() was given last)"
                )
            timeline, parent = self._timeline, self._last.path
        else:
            start = self._parent
            if start is None and not offline:
                start = _pointed_start(self.store, step, strict=not self._restored)
            elif start is None and not self._restored:
                log.warning("the checkpoint root %s does not answer and this job did not restore: step %d starts a "
                            "timeline of its own", self.store.root_url, step)
            try:
                timeline = branch(start.timeline if start else None, start.step if start else None,
                                  new_id=uuid.uuid4().hex[:12], first_step=step)
            except ValueError as exc:
                raise CheckpointError(f"cannot save step {step} under {self.store.root_url}: {exc}") from exc
            parent = start.path if start else ""
        save_id = layout.new_save_id(time.time(), uuid.uuid4().hex)
        taken = offline or own_dir or root.has_manifest(self.store, layout.step_dir(step))
        return SavePlan(step, save_id, layout.save_dir(step, save_id if taken else ""), timeline, parent, prefixes,
                        offline)

    def committed(self, plan: SavePlan) -> None:
        """``plan``'s save is committed: the job is on its timeline, and it is the job's last
        (unless a later save of the job committed first: a local tier's saves reach the root
        after the next ones reached the local tier)."""
        if self._last is not None and plan.timeline.id == self._last.timeline.id and plan.step < self._last.step:
            return
        self._timeline, self._last = plan.timeline, Point(plan.timeline, plan.step, plan.sdir)

    def compacted(self, timeline: Timeline) -> None:
        """Retention compacted the job's timeline (dropped branch points no save needs)."""
        self._timeline = timeline

    def abandon(self) -> None:
        """After a commit failed past the manifest, the next save starts a new timeline from this
        job's last commit, so it never shares ``(timeline, step)`` with the failed save."""
        if self._last is not None:
            self._parent, self._restored = self._last, True
        self._timeline = None


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


def current_point(store: Store) -> tuple[Point | None, str | None]:
    """The save the root's pointer names (``None``: no checkpoint yet) and the version of the pointer
    read (one read: :func:`~..root.read_pointer_versioned`): what a job that *adopts* the root's
    checkpoint continues (``adopt()``), and what its first swap expects.

    Raises:
        CheckpointError: the pointer is unusable (restore walks back; adopt cannot).
    """
    try:
        pointer, version = read_pointer_versioned(store)
    except ManifestError as exc:
        raise CheckpointError(
            f"{store.root_url} holds an unusable latest.json ({exc}): restore() walks back to the newest "
            f"complete checkpoint; or remove the root"
        ) from exc
    return (None if pointer is None else Point(pointer.timeline, pointer.step, pointer.path)), version
