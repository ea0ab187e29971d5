"""Timelines: which saves of a root make up the job's history, and which were abandoned (PURE).

A restore defines where a job stands. When it restores step 40 of a root that also holds steps
50 and 60, its next saves continue from 40: 50 and 60 belong to an *abandoned* timeline, which
the job's first commit supersedes (they are retired after that pointer is committed, never
before; docs/checkpoint-lifecycle.md). So every job writes its own :class:`Timeline`: a random
id, and its *history*, the earlier timelines it continues, each with the last step it took from
them::

    timeline c1: 10 20 30 40 50 60                      (c1, history ())
                           \\
    timeline d2:            45 55                        (d2, history (("c1", 40),))
                           restore(step=40), then save 45, 55

A save is identified by ``(timeline id, step)``; the steps of one timeline strictly increase
(a job never saves a step twice without a restore in between). Given the pointer's timeline and
step (a :class:`Tip`) every save of the root is one of:

* **current**: the tip's own timeline at or before its step, or an earlier timeline of its
  history at or before the step taken from it (:func:`contains`). Restore walks back through
  these only, and retention ranks these only, in commit order (= step order here);
* **ahead**: past the tip on its timeline, or on a timeline that branched from it at or after
  the tip's step (:func:`descends`): a save whose pointer swap is still to come (in flight), or
  never came (its job died). Left alone: a live job may be about to commit it;
* **abandoned**: anything else (a timeline a restore went back past, a save that lost a race).

Why a new timeline per job and not per rollback: a job that died between its manifest and its
pointer leaves a manifest of ``(t, s)``; if the resumed job went on with timeline ``t`` its own
save of step ``s`` would be indistinguishable from the dead one. A fresh id per job makes every
save's identity unique, at the cost of one history entry per job start, which
:func:`compact` drops again once no checkpoint of that timeline remains.

Checkpoints written before timelines existed (format 1) are on the timeline ``""``.
Plain functions of their arguments: no torch, fsspec, storage, clock or randomness.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from streamio.checkpoint.format.checks import ManifestError, integer, short
from streamio.errors import CheckpointError

__all__ = [
    "MAX_HISTORY",
    "Place",
    "Point",
    "Timeline",
    "Tip",
    "branch",
    "classify",
    "compact",
    "contains",
    "descends",
    "newest",
    "retreat",
    "timeline_from_json",
    "timeline_to_json",
]

MAX_HISTORY = 1000
"""Earlier timelines a history may name (each still holding a checkpoint after :func:`compact`)."""

_ID_RE = re.compile(r"[0-9a-z]{0,32}")

Place = Literal["current", "ahead", "abandoned"]


@dataclass(frozen=True)
class Timeline:
    """One job's line of saves.

    Attributes:
        id: random, lower-case hex; ``""`` for checkpoints written before timelines.
        history: the earlier timelines this one continues, oldest first, each with the last
            step taken from it (strictly increasing).
    """

    id: str = ""
    history: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Tip:
    """Where a root stands: a timeline and the step its pointer names."""

    timeline: Timeline
    step: int


@dataclass(frozen=True)
class Point:
    """A save a job continues from (the one it restored): its timeline, step and directory."""

    timeline: Timeline
    step: int
    path: str


def contains(tip: Tip, timeline_id: str, step: int) -> bool:
    """Whether the save ``(timeline_id, step)`` is on the tip's timeline, at or before the tip."""
    if timeline_id == tip.timeline.id:
        return step <= tip.step
    return any(tid == timeline_id and step <= upto for tid, upto in tip.timeline.history)


def descends(tip: Tip, timeline: Timeline, step: int) -> bool:
    """Whether the save ``(timeline, step)`` lies ahead of the tip: later on its timeline, or on a
    timeline branched from it at or after the tip's step."""
    if timeline.id == tip.timeline.id:
        return step > tip.step
    return any(tid == tip.timeline.id and upto >= tip.step for tid, upto in timeline.history)


def classify(tip: Tip, timeline: Timeline, step: int) -> Place:
    """``"current"``, ``"ahead"`` or ``"abandoned"`` (see the module docstring)."""
    if contains(tip, timeline.id, step):
        return "current"
    return "ahead" if descends(tip, timeline, step) else "abandoned"


def branch(parent: Timeline | None, at: int | None, *, new_id: str, first_step: int) -> Timeline:
    """The timeline of a job that continues ``parent`` after its step ``at`` and saves
    ``first_step`` first.

    Saves of the parent's line at or after ``first_step`` are superseded: the history is cut
    below ``first_step``, so a job that restored step 40 and saves 40 again takes 39 and before.

    Args:
        parent: the timeline of the save the job restored (or found named by the pointer);
            ``None`` for a job that starts an empty root.
        at: that save's step.
        new_id: the new timeline's id.
        first_step: the step of the job's first save.

    Raises:
        ValueError: the history would name more than :data:`MAX_HISTORY` timelines.
    """
    if parent is None or at is None:
        return Timeline(new_id)
    cap = first_step - 1
    history: list[tuple[str, int]] = []
    prev = -1
    for tid, upto in (*parent.history, (parent.id, at)):
        upto = min(upto, cap)
        if upto > prev:
            history.append((tid, upto))
            prev = upto
    if len(history) > MAX_HISTORY:
        raise CheckpointError(
            f"the history of this root names {len(history)} timelines that still hold checkpoints, over "
            f"{MAX_HISTORY}: remove old checkpoints with `streamio ckpt rm` or start a new root"
        )
    return Timeline(new_id, tuple(history))


def compact(timeline: Timeline, present: Iterable[tuple[str, int]]) -> Timeline:
    """``timeline`` without the history entries whose timeline has no save left at or before the
    step taken from it (``present``: ``(timeline id, step)`` of every save in the root).

    Nothing can reappear there: a timeline's saves up to a branch point all existed before the
    branch was made. Membership of every remaining save is unchanged (:func:`contains` checks
    an upper bound only, and each timeline's own saves lie above its branch point).
    """
    lowest: dict[str, int] = {}
    for tid, step in present:
        lowest[tid] = min(step, lowest.get(tid, step))
    kept = tuple((tid, upto) for tid, upto in timeline.history if tid in lowest and lowest[tid] <= upto)
    return Timeline(timeline.id, kept)


def retreat(tip: Tip, timeline_id: str, step: int) -> Tip:
    """The tip that names the save ``(timeline_id, step)`` of the tip's timeline instead (moving a
    pointer back): the history of an earlier timeline is the part of the tip's before it.

    Raises:
        ValueError: the save is not on the tip's timeline.
    """
    if not contains(tip, timeline_id, step):
        raise ValueError(f"step {step} of timeline {timeline_id!r} is not on the current timeline")
    if timeline_id == tip.timeline.id:
        return Tip(tip.timeline, step)
    index = [tid for tid, _ in tip.timeline.history].index(timeline_id)
    return Tip(Timeline(timeline_id, tip.timeline.history[:index]), step)


def newest(tips: Iterable[Tip]) -> Tip | None:
    """Of several tips (a root's pointer and local tiers' pointers), the one every other came
    before, ``None`` when none is (their relation is not recorded: unrelated or compacted away).

    ``a`` came before ``b`` when ``a`` is on ``b``'s timeline at or before ``b`` (``b`` continues
    it), or when the two left a timeline they share at different steps and ``b`` left it first:
    ``b``'s job went back past ``a`` (a restore of an earlier step), abandoning it.
    """
    found = list(tips)
    for tip in found:
        if all(_not_older(tip, other) for other in found):
            return tip
    return None


def _not_older(a: Tip, b: Tip) -> bool:
    if contains(a, b.timeline.id, b.step):
        return True
    if contains(b, a.timeline.id, a.step):
        return False
    left_a = {**dict(a.timeline.history), a.timeline.id: a.step}  # timeline id -> the last step taken from it
    left_b = {**dict(b.timeline.history), b.timeline.id: b.step}
    earlier = [left_a[t] < left_b[t] for t in left_a.keys() & left_b.keys() if left_a[t] != left_b[t]]
    return bool(earlier) and all(earlier)


# ------------------------------------------------------------------------------ JSON
def timeline_to_json(t: Timeline) -> dict[str, Any]:
    return {"id": t.id, "history": [[tid, upto] for tid, upto in t.history]}


def timeline_from_json(d: Any, what: str) -> Timeline:
    """Parse and validate a timeline object of a manifest or pointer.

    Raises:
        ManifestError: not an object, an id that is not 0-32 characters of ``[0-9a-z]``, a
            history that is not a list of ``[id, step]`` with strictly increasing steps and
            distinct ids, or one longer than :data:`MAX_HISTORY`.
    """
    if not isinstance(d, dict):
        raise ManifestError(f"{what}: 'timeline' must be an object, got {type(d).__name__}")
    tid = _timeline_id(d.get("id"), f"{what}, timeline id")
    raw = d.get("history")
    if not isinstance(raw, list) or len(raw) > MAX_HISTORY:
        raise ManifestError(f"{what}: timeline history must be a list of at most {MAX_HISTORY} entries")
    history: list[tuple[str, int]] = []
    for i, entry in enumerate(raw):
        where = f"{what}, timeline history entry {i}"
        if not isinstance(entry, list) or len(entry) != 2:
            raise ManifestError(f"{where}: must be [timeline id, step], got {short(entry)}")
        entry_id = _timeline_id(entry[0], where)
        upto = integer({"step": entry[1]}, "step", where)
        if history and upto <= history[-1][1]:
            raise ManifestError(f"{where}: step {upto} does not follow step {history[-1][1]}")
        if entry_id == tid or any(entry_id == h for h, _ in history):
            raise ManifestError(f"{where}: timeline {entry_id!r} appears twice")
        history.append((entry_id, upto))
    return Timeline(tid, tuple(history))


def _timeline_id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise ManifestError(f"{what}: must be 0-32 characters of [0-9a-z], got {short(value)}")
    return value

