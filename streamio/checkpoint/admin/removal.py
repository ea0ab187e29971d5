"""``streamio ckpt rm ROOT STEP``: remove every save of a step, never leaving the pointer dangling.

Two phases, so the CLI can refuse before anything changes: :func:`plan_removal` reads the root
and decides; :func:`remove` carries it out.

* A step ``latest.json`` names is refused unless forced. Forced, the pointer is first moved
  back (compare-and-swap on the version of the very pointer read, so a job that commits
  meanwhile makes the move fail instead of being overwritten) to the newest *complete* save of
  the current timeline (:mod:`~..format.timeline`): its manifest parses, every file it lists is there
  with its size, and no restore rejected it. Without one the removal is refused: a root whose
  pointer names nothing is worse than a root with a bad checkpoint. The pointer is the new
  tip's: saves after it on its timeline become abandoned, superseded by the next save.
* Then every save of the step loses its manifest (all of them first), then the rest of its
  objects; a save directory of the step without a manifest (an unfinished save) goes too.

Moving the pointer of a root a job is writing makes that job's next save fail with a conflict
(its compare-and-swap finds the pointer changed): the fencing working as meant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamio.checkpoint import root
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.format.timeline import Tip, contains, retreat
from streamio.checkpoint.root import SaveRef, committed_saves, read_manifest_digest
from streamio.errors import CheckpointConflictError, CheckpointNotFoundError, ConfigError, WriteConflictError
from streamio.storage import ObjectInfo, Store

__all__ = ["Removal", "plan_removal", "remove"]


@dataclass(frozen=True)
class Removal:
    """What :func:`remove` will do.

    Attributes:
        step: the step removed.
        dirs: its save directories (committed or not).
        objects: every object in them, manifests first.
        pointer: the pointer to write first (the old one named the step), else ``None``.
        version: the pointer's version when it was read (what the move expects).
        refusal: why nothing will be done (``""``: go ahead).
    """

    step: int
    dirs: tuple[str, ...]
    objects: tuple[str, ...]
    pointer: Pointer | None = None
    version: Any = None
    refusal: str = ""


def plan_removal(store: Store, step: int, *, force: bool = False) -> Removal:
    """Decide how to remove every save of ``step`` (see the module docstring).

    Raises:
        CheckpointNotFoundError: the root holds no object of ``step``.
    """
    try:
        pointer, version = root.read_pointer_versioned(store)  # one GET: the version of the pointer read
    except ManifestError:
        pointer, version = None, None  # names nothing that could dangle: no swap
    listing = root.objects(store)
    dirs = sorted({_save_of(o)[0] for o in listing if _step_of(o) == step})
    if not dirs:
        raise CheckpointNotFoundError(
            f"no checkpoint of step {step} under {store.root_url}: `streamio ckpt ls {store.root_url}` lists the "
            f"committed steps"
        )
    objects = sorted((o.path for o in listing if _step_of(o) == step),
                     key=lambda p: (not p.endswith("/" + layout.MANIFEST), p))
    removal = Removal(step, tuple(dirs), tuple(objects), version=version)
    if pointer is None or pointer.path not in dirs:
        return removal
    latest = root.pointer_url(store)
    if not force:
        return _refuse(removal, f"{latest} names step {step}: pass --force to move the pointer back to the newest "
                                f"complete checkpoint of the current timeline first")
    target = _fallback(store, Tip(pointer.timeline, pointer.step), listing, set(dirs))
    if target is None:
        return _refuse(removal, f"{latest} names step {step} and no other complete checkpoint of the current timeline "
                                f"exists to move it to: removing it would leave the root without a checkpoint")
    return Removal(step, removal.dirs, removal.objects, target, version)


def remove(store: Store, removal: Removal) -> None:
    """Carry out ``removal``: move the pointer if needed, then delete (manifests first).

    Raises:
        CheckpointConflictError: ``latest.json`` changed since it was read (a job is writing
            this root); nothing was deleted.
        ValueError: the removal was refused (``removal.refusal``).
    """
    if removal.refusal:
        raise ConfigError(removal.refusal)
    if removal.pointer is not None:
        try:
            root.swap_pointer(store, removal.pointer, removal.version)
        except (WriteConflictError, FileNotFoundError) as exc:
            raise CheckpointConflictError(
                f"{root.pointer_url(store)} changed while removing step {removal.step}: a job is writing this root; "
                f"nothing was removed"
            ) from exc
    root.delete_objects(store, removal.objects, dirs=removal.dirs)


def _refuse(removal: Removal, why: str) -> Removal:
    return Removal(removal.step, removal.dirs, removal.objects, refusal=why)


def _save_of(o: ObjectInfo) -> tuple[str, str]:
    """The save directory ``o`` belongs to and its path within the save (``("", "")``: none)."""
    return layout.locate(o.path) or ("", "")


def _step_of(o: ObjectInfo) -> int | None:
    parsed = layout.parse_save_dir(_save_of(o)[0])
    return parsed[0] if parsed is not None else None


def _fallback(store: Store, tip: Tip, listing: list[ObjectInfo], removed: set[str]) -> Pointer | None:
    """A pointer naming the newest complete save of ``tip``'s timeline outside ``removed``."""
    sizes = {o.path: o.size for o in listing}
    for ref in reversed(committed_saves(store, listing)):
        if ref.path in removed or ref.bad or ref.step > tip.step:
            continue
        pointer = _complete(store, ref, sizes, tip)
        if pointer is not None:
            return pointer
    return None


def _complete(store: Store, ref: SaveRef, sizes: dict[str, int], tip: Tip) -> Pointer | None:
    try:
        m, digest = read_manifest_digest(store, ref.step, ref.path)
    except (FileNotFoundError, ManifestError):
        return None
    if not contains(tip, m.line.id, m.step):
        return None
    place = m.place(ref.path)
    if any(sizes.get(place.path(f.rank, f.path)) != f.size for f in m.files):
        return None
    at = retreat(tip, m.line.id, m.step)
    return Pointer(m.step, ref.path, digest, m.save_id, m.created, at.timeline)
