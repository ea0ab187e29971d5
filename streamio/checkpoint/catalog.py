"""What a checkpoint root holds: its saves, verified manifests, the pointer; deleting a save.

The reads and deletes that the commit protocol (:mod:`.commit`), retention (:mod:`.pruning`),
the restore walk (:mod:`.restore`) and the CLI's maintenance verbs (:mod:`.admin`) share. Each
reads storage fresh (a listing or a GET), never a cached view: another job, or an earlier run of
this one, may have written the root since.

A *save* is one save directory (:func:`~.layout.save_dir`); it is *committed* iff its
``manifest.json`` exists. A step may have several saves, one per timeline that saved it
(:mod:`.timeline`); the pointer (``latest.json``) names the current one and the current
timeline. Deleting a save removes its manifest first, so a half-deleted save is never taken for
a complete one, and on a local root then the directories it leaves empty (:func:`remove_empty_dirs`:
a directory is removed only while empty, so what another writer has put there since stays; a
local put whose directory vanishes between its creation and the temporary file made in it makes
it again).
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

from streamio.checkpoint.format import layout
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format import pointer as ptr
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.notes import MAX_RECORD_BYTES, BadRecord, bad_from_bytes, bad_to_bytes
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.format.timeline import Tip, classify
from streamio.errors import CheckpointNotFoundError, ObjectTooLargeError, StreamioError
from streamio.limits import MAX_JSON_BYTES
from streamio.pool import run_parallel
from streamio.storage import ObjectInfo, Store

__all__ = [
    "ABSENT",
    "PhaseHook",
    "SaveRef",
    "committed_saves",
    "committed_steps",
    "delete_save",
    "delete_step",
    "detect_foreign",
    "places",
    "pointed_step",
    "pointer_version",
    "read_bad",
    "read_manifest",
    "read_manifests",
    "read_pointer",
    "record_bad",
    "remove_empty_dirs",
    "resolve_save",
]

log = logging.getLogger(__name__)

PhaseHook = Callable[[str], None]
"""Called with the name of each commit phase as it completes (see :mod:`.commit`)."""

ABSENT = "\0absent"
"""What :func:`pointer_version` returns when there is no pointer (no store's version looks so)."""

_FOREIGN = {
    ".metadata": "a torch.distributed.checkpoint directory: load it with torch.distributed.checkpoint",
    ".pt": "a torch.save file: load it with torch.load(weights_only=True)",
    ".pth": "a torch.save file: load it with torch.load(weights_only=True)",
    ".ckpt": "a Lightning/torch.save checkpoint: load it with its own tool",
    ".safetensors": "a safetensors file: load it with safetensors",
    "latest": "a DeepSpeed checkpoint directory: load it with DeepSpeed",
}


@dataclass(frozen=True)
class SaveRef:
    """One committed save, as a listing shows it.

    Attributes:
        step: its step.
        path: its save directory, relative to the root.
        bad: a restore rejected it (its directory holds ``bad.json``).
    """

    step: int
    path: str
    bad: bool = False


def committed_saves(store: Store, listing: Iterable[ObjectInfo] | None = None) -> list[SaveRef]:
    """Saves under ``store`` that have a manifest, by step then path (one fresh listing unless
    ``listing`` is given)."""
    manifests: set[tuple[int, str]] = set()
    bad: set[str] = set()
    for o in store.list() if listing is None else listing:
        head, _, tail = o.path.partition("/")
        parsed = layout.parse_save_dir(head)
        if parsed is None:
            continue
        if tail == layout.MANIFEST:
            manifests.add((parsed[0], head))
        elif tail == layout.BAD:
            bad.add(head)
    return [SaveRef(step, path, path in bad) for step, path in sorted(manifests)]


def committed_steps(store: Store) -> list[int]:
    """Steps under ``store`` that have at least one committed save, oldest first (one listing)."""
    return sorted({s.step for s in committed_saves(store)})


def read_document(store: Store, path: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The document ``path`` of the root (pointer, manifest, marker, record), read within
    ``max_bytes`` (:meth:`Store.read(max_bytes=) <streamio.storage.Store.read>`).

    Raises:
        ManifestError: it is larger than ``max_bytes`` (the rest as ``Store.read``).
    """
    try:
        return store.read(path, max_bytes=max_bytes)
    except ObjectTooLargeError as exc:
        raise ManifestError(str(exc)) from exc


def read_pointer(store: Store) -> Pointer | None:
    """``latest.json`` (read fresh), or ``None`` if there is none.

    Raises:
        ManifestError: it exists but is not a valid pointer (``unknown_version``: newer format).
    """
    try:
        data = read_document(store, ptr.LATEST, ptr.MAX_POINTER_BYTES)
    except FileNotFoundError:
        return None
    return ptr.pointer_from_bytes(data)


def pointer_version(store: Store) -> str | None:
    """The pointer's version now: the store's token, ``None`` (the store keeps none) or
    :data:`ABSENT` (no pointer). Read before the pointer itself, it is what a later
    compare-and-swap must find, so a pointer written in between makes that swap fail."""
    try:
        return store.info(ptr.LATEST).version
    except FileNotFoundError:
        return ABSENT


def pointed_step(store: Store) -> int | None:
    """The step ``latest.json`` names (read fresh), or ``None`` if there is no valid pointer."""
    try:
        pointer = read_pointer(store)
    except ManifestError as exc:
        log.warning("%s is unusable: %s", store.url(ptr.LATEST), exc)
        return None
    return None if pointer is None else pointer.step


def read_manifest(store: Store, step: int, *, path: str | None = None, checksum: str | None = None) -> Manifest:
    """Read, verify and parse the manifest of a save of ``step``.

    Args:
        path: the save directory; default: the one :func:`resolve_save` picks.
        checksum: what ``latest.json`` recorded for this manifest, when it names this save.

    Raises:
        CheckpointNotFoundError: no manifest (the step was never committed or was deleted).
        ManifestError: (a :class:`CheckpointFormatError`) an unknown format version
            (``unknown_version``), or a manifest that is invalid, claims another step, names a
            path outside its save directory, or does not match its own or ``checksum``.
    """
    manifest = layout.manifest_at(path if path is not None else resolve_save(store, step))
    try:
        data = read_document(store, manifest)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(
            f"{store.url(manifest)} does not exist: step {step} was never committed or was deleted"
        ) from exc
    try:
        return mf.manifest_from_bytes(data, step=step, checksum=checksum)
    except ManifestError as exc:
        prefix = f"{store.url(manifest)}:" if exc.unknown_version else f"{store.url(manifest)} is unusable:"
        raise ManifestError(f"{prefix} {exc}", unknown_version=exc.unknown_version) from exc


def read_manifests(
    store: Store, saves: Iterable[SaveRef], *, concurrency: int = 8
) -> dict[str, Manifest | StreamioError]:
    """Every save's manifest, read concurrently: save directory -> manifest, or the error that
    reading or parsing it raised (a save deleted meanwhile is a ``CheckpointNotFoundError``)."""
    todo = list(saves)

    def one(ref: SaveRef) -> Manifest | StreamioError:
        try:
            return read_manifest(store, ref.step, path=ref.path)
        except (CheckpointNotFoundError, ManifestError) as exc:
            return exc

    return dict(zip([r.path for r in todo], run_parallel(one, todo, concurrency=concurrency,
                                                         name="streamio-ckpt-manifests"), strict=True))


def resolve_save(store: Store, step: int) -> str:
    """The save directory meant by "step ``step``": the pointer's if it names that step, else
    the step's save on the current timeline, else its newest; the step's own directory if it
    has no committed save at all (reading it then says it does not exist)."""
    try:
        pointer = read_pointer(store)
    except ManifestError:
        pointer = None
    if pointer is not None and pointer.step == step:
        return pointer.path
    saves = [s for s in committed_saves(store) if s.step == step]
    if len(saves) <= 1:
        return saves[0].path if saves else layout.step_dir(step)
    found = read_manifests(store, saves)
    tip = None if pointer is None else Tip(pointer.timeline, pointer.step)

    def rank(ref: SaveRef) -> tuple[bool, str]:
        m = found[ref.path]
        if not isinstance(m, Manifest):
            return False, ""
        return tip is not None and classify(tip, m.line, m.step) == "current", m.created

    return max(saves, key=rank).path


def delete_save(store: Store, sdir: str, *, save_id: str | None = None, on_phase: PhaseHook | None = None) -> None:
    """Delete one save: its manifest first (so it is never seen half-deleted), then the rest.

    In a step's own directory, which other saves of the step may share, only the objects of
    ``save_id`` go (with the bad-save record); a suffixed directory is the save's alone.

    Args:
        save_id: the save's id; ``None`` (manifest unreadable): everything in the directory.
        on_phase: called with ``"delete"`` between the manifest and the rest (a test hook).
    """
    store.delete(layout.manifest_at(sdir))
    if on_phase is not None:
        on_phase("delete")
    parsed = layout.parse_save_dir(sdir)
    shared = save_id is not None and parsed is not None and parsed[1] == ""
    dirs = {sdir}
    for o in store.list(sdir + "/"):
        rest = o.path[len(sdir) + 1:]
        if not shared or rest == layout.BAD or layout.object_save_id(rest) == save_id:
            store.delete(o.path)
            dirs.add(posixpath.dirname(o.path))
    remove_empty_dirs(store, dirs)


def delete_step(store: Store, step: int, *, on_phase: PhaseHook | None = None) -> None:
    """Delete every save of ``step``: all their manifests first, then the rest."""
    sdirs = [s.path for s in committed_saves(store) if s.step == step] or [layout.step_dir(step)]
    for sdir in sdirs:
        store.delete(layout.manifest_at(sdir))
    if on_phase is not None:
        on_phase("delete")
    dirs = set(sdirs)
    for sdir in sdirs:
        for o in store.list(sdir + "/"):
            store.delete(o.path)
            dirs.add(posixpath.dirname(o.path))
    remove_empty_dirs(store, dirs)


def remove_empty_dirs(store: Store, paths: Iterable[str]) -> None:
    """On a local root, remove those of the directories ``paths`` that are empty, deepest first
    (elsewhere there are no directories). One that is not empty, or gone, is left as it is."""
    if not store.is_local:
        return
    for path in sorted(set(paths), key=lambda p: (-p.count("/"), p)):
        try:
            store.fs.rmdir(store.url(path))
        except OSError:  # not empty (another save's objects, a writer's temporary file) or gone
            continue


def record_bad(store: Store, sdir: str, step: int, reason: str) -> None:
    """Note in ``sdir`` that a restore rejected its save (logged, never raised: a restore that
    cannot write, e.g. with read-only credentials, still restores)."""
    recorded = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        if not store.exists(layout.manifest_at(sdir)):
            return  # nothing left to mark (the save was deleted)
        store.put(layout.bad_path(sdir), bad_to_bytes(BadRecord(step, reason, recorded)))
    except Exception as exc:  # a note for later runs; the restore goes on without it
        log.warning("could not record %s as bad (%s): %s", store.url(sdir), reason, exc)
        return
    log.warning("recorded checkpoint step %d at %s as bad: `streamio ckpt ls` flags it, retention and "
                "`streamio ckpt gc` remove it", step, store.url(sdir))


def read_bad(store: Store, sdir: str) -> BadRecord | None:
    """The bad-save record of ``sdir``, ``None`` if there is none (or it is unreadable)."""
    try:
        data = read_document(store, layout.bad_path(sdir), MAX_RECORD_BYTES)
        return bad_from_bytes(data, store.url(layout.bad_path(sdir)))
    except FileNotFoundError:
        return None
    except ManifestError as exc:  # still a record that a restore rejected the save
        parsed = layout.parse_save_dir(sdir)
        return BadRecord(parsed[0] if parsed else 0, f"unreadable record ({exc})")


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


def places(tip: Tip | None, manifests: Mapping[str, Manifest | StreamioError]) -> dict[str, str]:
    """Save directory -> ``"current"``, ``"ahead"``, ``"abandoned"`` (:mod:`.timeline`), or
    ``"unknown"`` (no tip, or the manifest could not be read)."""
    out: dict[str, str] = {}
    for path, m in manifests.items():
        out[path] = classify(tip, m.line, m.step) if tip is not None and isinstance(m, Manifest) else "unknown"
    return out
