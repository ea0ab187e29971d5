"""A checkpoint root on storage: the one module that reads, writes, lists and deletes its documents.

A root's documents are the pointer (``latest.json``), each save's manifest and done markers, and
the root's notes (``bad.json`` beside a rejected save, ``retention.json``); their formats are
:mod:`.format` (:mod:`~.format.pointer`, :mod:`~.format.manifest`, :mod:`~.format.notes`). The
commit (:mod:`.save`), the restore walk (:mod:`.restore`), the DCP pair and ``streamio ckpt``
(:mod:`.admin`) touch them through the functions here only (a test checks that no other module
names the pointer). Parts: :mod:`.save.parts` writes, :mod:`.tensors.fetch` reads. A local tier's
root (docs/design.md "Local tier") is a root too, whose one writer swaps its pointer unconditionally.

Every read goes to storage fresh (a listing or a GET), never a cached view: another job, or an
earlier run of this one, may have written the root since; a document is read whole within a bound
(``Store.read(max_bytes=)``), and one larger is a :class:`~.format.checks.ManifestError`.

A *save* is one save directory (:func:`~.format.layout.save_dir`); it is *committed* iff its
``manifest.json`` exists. A step may have several saves, one per timeline that saved it
(:mod:`.format.timeline`); the pointer names the current one and the current timeline, and is
replaced by a compare-and-swap on the version read before it (:func:`swap_pointer`). A save's
manifest is deleted first (:func:`delete_save`), so a half-deleted save never looks complete.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from streamio.checkpoint.format import layout, notes
from streamio.checkpoint.format import manifest as mf
from streamio.checkpoint.format import pointer as ptr
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.manifest import DoneMarker, Manifest
from streamio.checkpoint.format.notes import BadRecord, RetentionRecord
from streamio.checkpoint.format.pointer import Pointer
from streamio.checkpoint.format.retention import RetentionPolicy
from streamio.checkpoint.format.timeline import Tip, classify
from streamio.checksum import checksum_bytes
from streamio.errors import CheckpointNotFoundError, ObjectTooLargeError, StreamioError
from streamio.limits import MAX_JSON_BYTES
from streamio.pool import run_parallel
from streamio.storage import ObjectInfo, Store

__all__ = [
    "ABSENT", "UNREAD", "PhaseHook", "SaveRef", "committed_saves", "committed_steps", "create_manifest",
    "delete_objects", "delete_save", "delete_share", "has_manifest", "has_pointer", "manifest_digest", "objects",
    "parse_manifest", "pointed_step", "pointer_url", "pointer_version", "read_bad", "read_manifest",
    "read_manifest_bytes", "read_manifest_digest", "read_manifests", "read_markers", "read_pointer",
    "read_pointer_versioned", "read_retention", "record_bad", "record_retention", "remove_empty_dirs", "resolve_save",
    "swap_pointer", "write_marker",
]

log = logging.getLogger(__name__)

PhaseHook = Callable[[str], None]
"""Called with the name of each commit phase as it completes (see :mod:`.save.commit`)."""

ABSENT = "\0absent"
"""What :func:`pointer_version` returns when there is no pointer (no store's version looks so)."""

UNREAD = "\0unread"  # a pointer version not read yet (the root did not answer): read before the next swap

_DELETES = 8  # in flight while delete_save removes a save's objects (a request each) after its manifest

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


# ------------------------------------------------------------------------------ listing
def objects(store: Store) -> list[ObjectInfo]:
    """Every object under the root, from one fresh listing (what ``gc`` and ``rm`` decide on)."""
    return store.list()


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


def _read(store: Store, path: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The document ``path`` of the root, read within ``max_bytes`` (larger: :class:`ManifestError`)."""
    try:
        return store.read(path, max_bytes=max_bytes)
    except ObjectTooLargeError as exc:
        raise ManifestError(str(exc)) from exc


# ------------------------------------------------------------------------------ the pointer
def pointer_url(store: Store) -> str:
    """The pointer's URL (what messages name)."""
    return store.url(ptr.LATEST)


def has_pointer(store: Store) -> bool:
    """Whether the root holds a pointer, valid or not (one HEAD)."""
    return store.exists(ptr.LATEST)


def read_pointer(store: Store) -> Pointer | None:
    """``latest.json`` (read fresh), or ``None`` if there is none. Raises ManifestError: it exists but
    is not a valid pointer (``unknown_version``: a newer format)."""
    return read_pointer_versioned(store)[0]


def read_pointer_versioned(store: Store) -> tuple[Pointer | None, Any]:
    """``latest.json`` (read fresh) and the version of the bytes read, what a swap of a pointer derived
    from it must expect (``None``, :data:`ABSENT`: as :func:`pointer_version`): one GET where the store's
    answer has it (docs/design.md "Commit protocol"). Raises ManifestError as :func:`read_pointer`."""
    try:
        data, version = store.read_versioned(ptr.LATEST, max_bytes=ptr.MAX_POINTER_BYTES)
    except FileNotFoundError:
        return None, ABSENT
    except ObjectTooLargeError as exc:
        raise ManifestError(str(exc)) from exc
    return ptr.pointer_from_bytes(data), version


def pointer_version(store: Store) -> str | None:
    """The pointer's version now: the store's token, ``None`` (the store keeps none) or :data:`ABSENT` (no
    pointer). Read before the pointer, it is what a later swap must find: a write in between fails it."""
    try:
        return store.info(ptr.LATEST).version
    except FileNotFoundError:
        return ABSENT


def pointed_step(store: Store) -> int | None:
    """The step ``latest.json`` names (read fresh), or ``None`` if there is no valid pointer."""
    try:
        pointer = read_pointer(store)
    except ManifestError as exc:
        log.warning("%s is unusable: %s", pointer_url(store), exc)
        return None
    return None if pointer is None else pointer.step


def swap_pointer(store: Store, pointer: Pointer, expected: Any) -> Any:
    """Replace ``latest.json`` with ``pointer`` only if it is still at version ``expected`` (what
    :func:`pointer_version` returned; :data:`ABSENT`: create it; ``None``: the store keeps no
    versions, replace it) and return the new version. Raises the store's ``WriteConflictError`` or
    ``ObjectNotFoundError`` when it changed since: the caller names the conflict."""
    data = ptr.pointer_to_bytes(pointer)
    if expected is ABSENT:
        return store.put(ptr.LATEST, data, mode="create")
    return store.put(ptr.LATEST, data, if_match=expected)  # None: no versions kept, replace it


# ------------------------------------------------------------------------------ manifests and markers
def has_manifest(store: Store, sdir: str) -> bool:
    """Whether the save directory ``sdir`` holds a manifest (one HEAD)."""
    return store.exists(layout.manifest_at(sdir))


def read_manifest(store: Store, step: int, *, path: str | None = None, checksum: str | None = None) -> Manifest:
    """Read, verify and parse the manifest of a save of ``step``.

    Args:
        path: the save directory; default: the one :func:`resolve_save` picks.
        checksum: what ``latest.json`` recorded for this manifest, when it names this save.

    Raises:
        CheckpointNotFoundError: no manifest (the step was never committed or was deleted).
        ManifestError: an unknown format version (``unknown_version``), or a manifest that is invalid,
            claims another step, names a path outside its save directory, or fails its checksums.
    """
    sdir = path if path is not None else resolve_save(store, step)
    return parse_manifest(store, step, sdir, read_manifest_bytes(store, step, sdir), checksum)


def read_manifest_digest(store: Store, step: int, path: str) -> tuple[Manifest, str]:
    """The manifest of ``step`` in ``path`` (:func:`read_manifest`) and its bytes' checksum (a pointer's)."""
    data = read_manifest_bytes(store, step, path)
    return parse_manifest(store, step, path, data, None), checksum_bytes(data)


def read_manifest_bytes(store: Store, step: int, sdir: str) -> bytes:
    """The stored bytes of the manifest in ``sdir``, unparsed and unverified (one rank reads them
    for all, each parses them: :func:`parse_manifest`); ``CheckpointNotFoundError`` if none."""
    manifest = layout.manifest_at(sdir)
    try:
        return _read(store, manifest)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(f"{store.url(manifest)} does not exist: step {step} was never committed or was "
                                      "deleted") from exc


def parse_manifest(store: Store, step: int, sdir: str, data: bytes | memoryview, checksum: str | None) -> Manifest:
    """``data``, the manifest of ``sdir`` under ``store``, verified and parsed (as :func:`read_manifest`)."""
    manifest = layout.manifest_at(sdir)
    try:
        return mf.manifest_from_bytes(bytes(data), step=step, checksum=checksum)
    except ManifestError as exc:
        prefix = f"{store.url(manifest)}:" if exc.unknown_version else f"{store.url(manifest)} is unusable:"
        raise ManifestError(f"{prefix} {exc}", unknown_version=exc.unknown_version) from exc


def manifest_digest(store: Store, sdir: str) -> str:
    """The checksum of the manifest's stored bytes in ``sdir`` (a pointer's); ``FileNotFoundError`` if none."""
    return checksum_bytes(_read(store, layout.manifest_at(sdir)))


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


def create_manifest(store: Store, sdir: str, manifest: Manifest) -> str:
    """Write ``manifest`` into ``sdir``, create-only, and return the checksum of its bytes (the
    store's ``WriteConflictError`` if one exists: the caller names the conflict)."""
    data = mf.manifest_to_bytes(manifest)
    store.put(layout.manifest_at(sdir), data, mode="create")
    return checksum_bytes(data)


def write_marker(store: Store, place: layout.Placement, marker: DoneMarker) -> None:
    """Write a rank's done marker of the save at ``place``, create-only."""
    store.put(place.marker(marker.rank, marker.save_id), mf.marker_to_bytes(marker), mode="create")


def read_markers(
    store: Store, place: layout.Placement, save_id: str, world: int, *, concurrency: int
) -> list[DoneMarker]:
    """Every rank's done marker of the save ``save_id`` at ``place``, parsed (index = rank)."""
    paths = [place.marker(r, save_id) for r in range(world)]
    found = run_parallel(functools.partial(_read, store), paths, concurrency=concurrency, name="streamio-markers")
    return [mf.marker_from_bytes(b) for b in found]


# ------------------------------------------------------------------------------ notes
def record_bad(store: Store, sdir: str, step: int, reason: str) -> None:
    """Note in ``sdir`` that a restore rejected its save (logged, never raised: a restore that
    cannot write, e.g. with read-only credentials, still restores)."""
    recorded = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        if not has_manifest(store, sdir):
            return  # nothing left to mark (the save was deleted)
        store.put(layout.bad_path(sdir), notes.bad_to_bytes(BadRecord(step, reason, recorded)))
    except Exception as exc:  # a note for later runs; the restore goes on without it
        log.warning("could not record %s as bad (%s): %s", store.url(sdir), reason, exc)
        return
    log.warning("recorded checkpoint step %d at %s as bad: `streamio ckpt ls` flags it, retention and "
                "`streamio ckpt gc` remove it", step, store.url(sdir))


def read_bad(store: Store, sdir: str) -> BadRecord | None:
    """The bad-save record of ``sdir``, ``None`` if there is none (or it is unreadable)."""
    try:
        data = _read(store, layout.bad_path(sdir), notes.MAX_RECORD_BYTES)
        return notes.bad_from_bytes(data, store.url(layout.bad_path(sdir)))
    except FileNotFoundError:
        return None
    except ManifestError as exc:  # still a record that a restore rejected the save
        parsed = layout.parse_save_dir(sdir)
        return BadRecord(parsed[0] if parsed else 0, f"unreadable record ({exc})")


def read_retention(store: Store) -> RetentionRecord:
    """The root's recorded retention policy (``retention.json``); ``FileNotFoundError`` if none is
    recorded, :class:`ManifestError` if the record is not valid."""
    data = _read(store, layout.RETENTION, notes.MAX_RECORD_BYTES)
    return notes.retention_from_bytes(data, store.url(layout.RETENTION))


def record_retention(store: Store, policy: RetentionPolicy, recorded: str) -> None:
    """Record ``policy`` as the root's retention policy (replacing the recorded one)."""
    store.put(layout.RETENTION, notes.retention_to_bytes(policy, recorded))


# ------------------------------------------------------------------------------ deleting
def delete_save(store: Store, sdir: str, *, save_id: str | None = None, prefixes: int | None = None,
                on_phase: PhaseHook | None = None) -> None:
    """Delete one save: its manifest first (so it is never seen half-deleted), then the rest.

    In a step's own directory, which other saves of the step may share, only the objects of
    ``save_id`` go (with the bad-save record); a suffixed directory is the save's alone.

    Args:
        save_id, prefixes: the save's id and key prefixes, as its manifest records them; ``None``
            (manifest unreadable): everything of the directory, found in one listing of the root.
        on_phase: called with ``"delete"`` between the manifest and the rest (a test hook).
    """
    store.delete(layout.manifest_at(sdir))
    if on_phase is not None:
        on_phase("delete")
    parsed = layout.parse_save_dir(sdir)
    shared = save_id is not None and parsed is not None and parsed[1] == ""  # the step's own directory
    listing = (store.list() if prefixes is None
               else [o for d in layout.Placement(sdir, prefixes).dirs() for o in store.list(d + "/")])
    dirs = {sdir}
    doomed: list[str] = []
    for o in listing:
        sdir_of, rest = layout.locate(o.path) or ("", "")
        if sdir_of == sdir and (not shared or rest == layout.BAD or layout.object_save_id(rest) == save_id):
            doomed.append(o.path)
            dirs.update(layout.parents(o.path))
    run_parallel(store.delete, doomed, concurrency=_DELETES, name="streamio-ckpt-delete")  # any order now
    remove_empty_dirs(store, dirs)


def delete_objects(store: Store, paths: Sequence[str], *, dirs: Iterable[str] = (),
                   on_deleted: Callable[[int], None] | None = None) -> None:
    """Delete ``paths`` in their order (manifests first: the caller orders them), then the
    directories above them and ``dirs`` that are left empty. ``on_deleted(n)`` after the n-th."""
    for n, path in enumerate(paths, 1):
        store.delete(path)
        if on_deleted is not None:
            on_deleted(n)
    remove_empty_dirs(store, {d for p in paths for d in layout.parents(p)} | set(dirs))


def delete_share(store: Store, place: layout.Placement, save_id: str, rank: int) -> None:
    """Delete ``rank``'s objects of the save ``save_id`` at ``place`` (parts, marker, unfinished uploads:
    the names carrying the save id below its rank directory), then the directories left empty."""
    ranks = place.rank_dir(rank)
    for o in store.list(ranks + "/"):
        if layout.save_id_at(o.path) == save_id:
            store.delete(o.path)
    for upload in store.incomplete_uploads(ranks + "/"):
        if layout.save_id_at(upload.path) == save_id:
            store.abort_upload(upload)
    remove_empty_dirs(store, [ranks, *layout.parents(ranks), place.sdir])


def remove_empty_dirs(store: Store, paths: Iterable[str]) -> None:
    """On a local root, remove those of the directories ``paths`` that are empty, deepest first
    (elsewhere there are no directories). One that is not empty, or gone, is left as it is."""
    if not store.is_local:
        return
    for path in sorted(set(paths), key=lambda p: (-p.count("/"), p)):
        with contextlib.suppress(OSError):  # not empty (another save's objects, a temporary file) or gone
            store.fs.rmdir(store.url(path))
