"""``streamio ckpt gc``: delete what no current checkpoint needs (docs/checkpoint-lifecycle.md).

:func:`collect_garbage` deletes saves a restore rejected (``bad.json``) unless the pointer names
them, committed saves of abandoned timelines, objects of saves that never committed, a losing
concurrent save's objects, and on S3 old incomplete multipart uploads. What a live job may still
be writing is kept until it is ``min_age_s`` old. It reads the root fresh and deletes through
:mod:`..root` (manifests first).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from streamio.checkpoint import root
from streamio.checkpoint.format import layout
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.format.manifest import Manifest
from streamio.checkpoint.format.timeline import Tip, classify
from streamio.checkpoint.root import (
    SaveRef,
    committed_saves,
    read_manifests,
    read_pointer,
)
from streamio.errors import StorageError, StreamioError
from streamio.storage import Store

__all__ = ["GarbageReport", "collect_garbage"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GarbageReport:
    """What ``collect_garbage`` found (and deleted unless ``dry_run``).

    Attributes:
        objects: the paths deleted (manifests of whole saves first).
        bytes: their size.
        multipart_uploads: the incomplete uploads aborted.
        kept: saves that would be garbage but were kept, each with why (``latest.json`` names it).
    """

    objects: tuple[str, ...]
    bytes: int
    multipart_uploads: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


def collect_garbage(
    store: Store, *, dry_run: bool = False, min_age_s: float = 3600.0, now: float | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> GarbageReport:
    """Delete what no current checkpoint needs (see the module docstring).

    Garbage is:

    * every object of a committed save that a restore rejected (``bad.json``), unless
      ``latest.json`` names it (then kept and named in ``kept``: the next save supersedes it,
      or ``streamio ckpt rm --force`` moves the pointer back first);
    * every object of a committed save of an abandoned timeline (:mod:`~..format.timeline`), committed
      at least ``min_age_s`` ago (younger: a job that restored may be about to swap the pointer
      to it). Not judged without a usable pointer;
    * objects in a save directory without a manifest (a save that never committed) whose save
      id says it started at least ``min_age_s`` ago; for older save ids, which do not say, those
      of steps older than the newest committed one, other than the pointer's step;
    * objects under a committed save that its manifest does not list (a losing concurrent save;
      the committed save's markers and ``bad.json`` are kept);
    * on S3, multipart uploads under the root older than ``min_age_s`` (a killed uploader's
      invisible, billed parts).

    Whole saves lose their manifest first, so a half-deleted save is never taken for complete.
    ``progress(done, total, nbytes)`` is called after each deletion (objects deleted of ``total``).
    """
    now = time.time() if now is None else now
    listing = root.objects(store)
    saves = committed_saves(store, listing)
    manifests = read_manifests(store, saves)
    try:
        pointer = read_pointer(store)
    except ManifestError:
        pointer = None
    tip = None if pointer is None else Tip(pointer.timeline, pointer.step)
    newest = max((s.step for s in saves), default=None)
    committed = {s.path for s in saves}
    whole: set[str] = set()
    kept: list[str] = []
    keep_files: dict[str, set[str]] = {}
    for ref in saves:
        m = manifests[ref.path]
        verdict = _judge(ref, m, tip, pointer.path if pointer else None, now - min_age_s)
        if verdict == "whole":
            whole.add(ref.path)
        elif verdict == "kept":
            kept.append(f"{store.url(ref.path)} (step {ref.step}) was rejected by a restore but latest.json names "
                        f"it: the next save supersedes it, or `streamio ckpt rm --force` moves the pointer back")
        if isinstance(m, Manifest):
            markers = {layout.marker_path(r, m.save_id) for r in range(m.world_size)}
            keep_files[ref.path] = {f.path for f in m.files} | {layout.MANIFEST, layout.BAD} | markers
    pointed = pointer.step if pointer else None
    doomed = [o for o in listing if _doomed(o.path, whole, committed, keep_files,
                                            lambda p, rest: _unfinished_is_garbage(p, rest, now, min_age_s, newest,
                                                                                   pointed))]
    doomed.sort(key=lambda o: (o.path.rsplit("/", 1)[-1] != layout.MANIFEST, o.path))
    if not dry_run:
        report = progress or (lambda done, total, nbytes: None)
        sizes = [0, *itertools.accumulate(o.size for o in doomed)]
        root.delete_objects(store, [o.path for o in doomed], on_deleted=lambda n: report(n, len(doomed), sizes[n]))
    uploads = _abandoned_uploads(store, dry_run=dry_run, min_age_s=min_age_s)
    return GarbageReport(tuple(o.path for o in doomed), sum(o.size for o in doomed), uploads, tuple(kept))


def _doomed(
    path: str, whole: set[str], committed: set[str], keep_files: dict[str, set[str]],
    unfinished: Callable[[tuple[int, str], str], bool],
) -> bool:
    """Whether the object at ``path`` is garbage (see :func:`collect_garbage`)."""
    found = layout.locate(path)
    if found is None:
        return False
    head, rest = found
    parsed = layout.parse_save_dir(head)
    if parsed is None:
        return False
    if head in whole:
        return True
    if head in committed:  # a corrupt manifest (no keep list) is for `verify` to report, not for gc to guess at
        return head in keep_files and rest not in keep_files[head]
    return unfinished(parsed, rest)


def _judge(ref: SaveRef, m: Manifest | StreamioError, tip: Tip | None, named: str | None, before: float) -> str:
    """``"whole"``: the committed save is garbage; ``"kept"``: it would be, but the pointer names
    it; ``""``: it stays (``before``: abandoned saves committed after it may still be in use)."""
    abandoned = (isinstance(m, Manifest) and tip is not None and classify(tip, m.line, m.step) == "abandoned"
                 and _committed_at(m.created) <= before)
    if not (ref.bad or abandoned):
        return ""
    return "kept" if ref.path == named else "whole"


def _committed_at(created: str) -> float:
    """Unix time of an ISO-8601 time (-inf when it does not parse: an old save)."""
    try:
        return datetime.fromisoformat(created).timestamp()
    except ValueError:
        return float("-inf")


def _unfinished_is_garbage(
    parsed: tuple[int, str], rest: str, now: float, min_age_s: float, newest: int | None, pointed: int | None
) -> bool:
    """Whether an object of a save directory without a manifest is left from a dead save."""
    save_id = layout.object_save_id(rest) or parsed[1]
    started = layout.save_started(save_id) if save_id else None
    if started is not None:
        return now - started >= min_age_s
    return newest is not None and parsed[0] < newest and parsed[0] != pointed


def _abandoned_uploads(store: Store, *, dry_run: bool, min_age_s: float) -> tuple[str, ...]:
    """Incomplete uploads under the root older than ``min_age_s`` (S3 multipart uploads, local temp
    files of a killed writer), aborted."""
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
