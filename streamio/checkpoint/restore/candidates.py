"""Which saves a restore tries, in what order (rank 0 decides, every rank follows).

* The pointer's save first, with the manifest checksum the pointer recorded, and nothing else
  read: the common case costs one GET of ``latest.json`` (which also gives the pointer's version,
  what the job's next swap expects: :func:`versioned_pointer`) and one read for a bad-save record.
* Only if that fails (or the pointer is missing, unusable, or names a save recorded bad), the
  root is listed and every committed save **of the current timeline** (:mod:`~..format.timeline`) is a
  candidate, newest first. The current timeline is the pointer's; without a usable pointer it
  is the timeline of the newest manifest (by commit time) that parses. Saves of abandoned
  timelines are never candidates, saves recorded bad (``bad.json``) are named but not tried,
  and a save whose manifest does not parse is tried (and named) when its step is not past the
  current one, so every damaged checkpoint appears in the final error.
* An explicit ``step=`` is the save :func:`~.root.resolve_save` picks, never a walk.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from streamio.checkpoint import root
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.format.timeline import Timeline, Tip, classify
from streamio.checkpoint.root import (
    SaveRef,
    committed_saves,
    pointer_version,
    read_bad,
    read_manifests,
    read_pointer,
    read_pointer_versioned,
    resolve_save,
)
from streamio.errors import CheckpointFormatError, StreamioError
from streamio.storage import Store

__all__ = ["Candidate", "detect_foreign", "explicit", "versioned_pointer", "walk"]

log = logging.getLogger(__name__)

_FOREIGN = {
    ".metadata": "a torch.distributed.checkpoint directory: load it with torch.distributed.checkpoint",
    ".pt": "a torch.save file: load it with torch.load(weights_only=True)",
    ".pth": "a torch.save file: load it with torch.load(weights_only=True)",
    ".ckpt": "a Lightning/torch.save checkpoint: load it with its own tool",
    ".safetensors": "a safetensors file: load it with safetensors",
    "latest": "a DeepSpeed checkpoint directory: load it with DeepSpeed",
}


@dataclass(frozen=True)
class Candidate:
    """A save a restore may load.

    Attributes:
        step: its step.
        path: its save directory.
        checksum: the manifest checksum the pointer recorded, when the pointer names it.
        skip: why it is not tried (a restore rejected it before); ``""``: try it.
        line: its timeline, where its pointer or manifest was read (``None``: not known).
        created: when its pointer was written (ISO-8601 UTC; ``""`` unless a pointer names it).
    """

    step: int
    path: str
    checksum: str | None = None
    skip: str = ""
    line: Timeline | None = None
    created: str = ""


def explicit(store: Store, step: int) -> list[Candidate]:
    """The one candidate of ``restore(state, step=step)``."""
    return [Candidate(step, resolve_save(store, step))]


def walk(store: Store, *, full: bool) -> tuple[list[Candidate], Any]:
    """The candidates of a restore without ``step=`` (see the module docstring).

    Args:
        full: list the root (the pointer's save failed); else the pointer's save alone when it
            is usable.

    Returns:
        The candidates, and the version of the pointer that chose them (:func:`versioned_pointer`).

    Raises:
        CheckpointFormatError: the pointer is of a newer format (no walk past what this
            streamio cannot read), or the root holds another tool's checkpoint.
    """
    latest = root.pointer_url(store)
    pointer, version = versioned_pointer(store)
    if pointer is not None and not full:
        bad = read_bad(store, pointer.path)
        if bad is None:
            return [Candidate(pointer.step, pointer.path, pointer.manifest_checksum, line=pointer.timeline,
                          created=pointer.created)], version
        log.warning("%s names step %d, which a restore rejected before (%s); falling back to the newest complete "
                    "checkpoint of its timeline", latest, pointer.step, bad.reason)
    saves = committed_saves(store)
    order: list[Candidate] = []
    if pointer is not None:
        named = [s for s in saves if s.path == pointer.path]
        if not named:
            log.warning("%s names step %d whose manifest is gone; falling back to the newest complete checkpoint",
                        latest, pointer.step)
        elif named[0].bad:
            order.append(_skipped(store, named[0]))
        else:
            order.append(Candidate(pointer.step, pointer.path, pointer.manifest_checksum, line=pointer.timeline,
                          created=pointer.created))
    rest = [s for s in saves if pointer is None or s.path != pointer.path]
    manifests = read_manifests(store, rest)
    tip = Tip(pointer.timeline, pointer.step) if pointer is not None else _newest(manifests)
    for ref in reversed(rest):
        if tip is not None and not _on(tip, ref, manifests.get(ref.path)):
            continue
        m = manifests.get(ref.path)
        line = m.line if isinstance(m, Manifest) else None
        order.append(_skipped(store, ref) if ref.bad else Candidate(ref.step, ref.path, line=line))
    if not order:
        foreign = detect_foreign(store)
        if foreign:
            raise CheckpointFormatError(f"{store.root_url} holds {foreign}; it is not a streamio checkpoint root")
    return order, version


def versioned_pointer(store: Store) -> tuple[Pointer | None, Any]:
    """The pointer (``None``: none, or unusable, with a warning) and its version, what the job's next
    swap expects: from the one GET that read it where the store's answer carries it (docs/design.md
    "Commit protocol"). An unusable pointer is read again after a HEAD, in that order: its refusal
    carries no version, and one read after the bytes could name a pointer another job wrote since
    (a swap against it would then succeed over that job's pointer, not fail).

    Raises:
        CheckpointFormatError: the pointer is of a newer format.
    """
    try:
        return read_pointer_versioned(store)
    except ManifestError as exc:
        _newer(store, exc)
    version = pointer_version(store)
    try:
        return read_pointer(store), version
    except ManifestError as exc:
        _newer(store, exc)
        log.warning("%s is unusable (%s); falling back to the newest complete checkpoint", root.pointer_url(store), exc)
        return None, version


def _newer(store: Store, exc: ManifestError) -> None:
    """Raise if ``exc`` says the pointer is of a newer format (no walk past what this streamio cannot read)."""
    if exc.unknown_version and "upgrade streamio" in str(exc):
        raise CheckpointFormatError(f"{root.pointer_url(store)}: {exc}") from exc


def detect_foreign(store: Store) -> str | None:
    """What another tool's checkpoint under ``store`` looks like, or ``None``."""
    try:
        listing = root.objects(store)
    except FileNotFoundError:
        return None
    url = store.root_url.lower()
    # the root URL is itself another tool's file (a prefix named x.ckpt is a streamio.lightning root)
    if len(listing) == 1 and _is_object(store):
        for suffix, what in _FOREIGN.items():
            if suffix.startswith(".") and url.endswith(suffix):
                return what
    for o in listing:
        name = o.path.rsplit("/", 1)[-1]
        for suffix, what in _FOREIGN.items():
            if name == suffix or (suffix.startswith(".") and name.endswith(suffix)):
                return what
    return None


def _is_object(store: Store) -> bool:
    """Whether the root URL names an object rather than a prefix or nothing."""
    try:
        return store.info("").size is not None
    except (FileNotFoundError, IsADirectoryError):
        return False


def _on(tip: Tip, ref: SaveRef, m: Manifest | StreamioError | None) -> bool:
    """Whether ``ref`` is a candidate under ``tip``: current, or unparsable and not past the tip."""
    if isinstance(m, Manifest):
        return classify(tip, m.line, m.step) == "current"
    if isinstance(m, ManifestError) and m.unknown_version:
        return True  # tried, and restore stops there ("upgrade streamio")
    return ref.step <= tip.step


def _newest(manifests: dict[str, Manifest | StreamioError]) -> Tip | None:
    """Without a pointer: the tip is the newest committed manifest that parses."""
    found = [m for m in manifests.values() if isinstance(m, Manifest)]
    if not found:
        return None
    newest = max(found, key=lambda m: (m.created, m.step))
    return Tip(newest.line, newest.step)


def _skipped(store: Store, ref: SaveRef) -> Candidate:
    bad = read_bad(store, ref.path)
    why = bad.reason if bad is not None else "recorded bad"
    where = store.url(layout.bad_path(ref.path))
    return Candidate(ref.step, ref.path, skip=f"rejected by an earlier restore ({where}): {why}")
