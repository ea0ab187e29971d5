"""Maintenance of a checkpoint root, as the CLI runs it: verify, check the pointer, collect garbage.

``streamio ckpt ls | inspect | verify | gc`` (cli/ckpt.py) call these; none of them is needed to
save or restore. They read storage fresh and report what they find by object URL:

* :func:`verify_checkpoint` reads every file a manifest lists and checks every size and CRC32C,
  of the files and of every tensor (a restore checks files and tensor spans only);
* :func:`check_pointer` checks ``latest.json`` against the manifest it names;
* :func:`collect_garbage` deletes what no committed checkpoint refers to (abandoned saves, a
  losing concurrent save's objects, on S3 old incomplete multipart uploads).

The root's catalog (:func:`committed_steps`, :func:`read_manifest`, :func:`delete_step`,
:func:`detect_foreign`) lives in :mod:`.catalog` and is re-exported here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from streamio.checkpoint import layout
from streamio.checkpoint import manifest as mf
from streamio.checkpoint.catalog import committed_steps, read_manifest
from streamio.checkpoint.catalog import delete_step as delete_step  # re-exported: catalog.py
from streamio.checkpoint.catalog import detect_foreign as detect_foreign
from streamio.checkpoint.serialize import StreamReader, decode_part, verify_file
from streamio.checkpoint.validate import ManifestError
from streamio.checksum import checksum_bytes
from streamio.errors import CheckpointError, CheckpointFormatError, CorruptDataError, StorageError
from streamio.storage import Store

__all__ = [
    "GarbageReport",
    "check_pointer",
    "collect_garbage",
    "committed_steps",
    "delete_step",
    "detect_foreign",
    "read_manifest",
    "verify_checkpoint",
]

log = logging.getLogger(__name__)


def verify_checkpoint(store: Store, step: int, *, concurrency: int = 8) -> list[str]:
    """Every problem with ``step`` (each naming the object at fault); empty when it verifies.

    Reads every file the manifest lists, checks sizes and CRC32C, and every tensor's CRC32C.
    Files are read one after another: ``concurrency`` is not used yet (kept for its callers).
    """
    try:
        manifest = read_manifest(store, step)
    except CheckpointError as exc:
        return [str(exc)]
    sdir = layout.step_dir(step)
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
    for section in [manifest.replicated, *manifest.per_rank]:
        for key, e in section.tensors.items():
            try:
                StreamReader(parts.get(e.rank, {}), e.rank, store.url(sdir)).tensor(key, e)
            except (CorruptDataError, CheckpointFormatError) as exc:
                problems.append(str(exc))
    return problems


def check_pointer(store: Store) -> tuple[int | None, list[str]]:
    """The step ``latest.json`` names and what is wrong with the pointer itself (if anything)."""
    url = store.url(layout.LATEST)
    try:
        data = store.read(layout.LATEST)
    except FileNotFoundError:
        return None, [f"{url} does not exist: no checkpoint was ever committed here (or it was deleted)"]
    try:
        pointer = mf.pointer_from_bytes(data)
    except ManifestError as exc:
        return None, [f"{url} is corrupt: {exc}"]
    manifest_url = store.url(layout.manifest_path(pointer.step))
    try:
        manifest_data = store.read(layout.manifest_path(pointer.step))
    except FileNotFoundError:
        return pointer.step, [f"{url} names step {pointer.step} but {manifest_url} does not exist"]
    if checksum_bytes(manifest_data) != pointer.manifest_checksum:
        return pointer.step, [f"{url} names step {pointer.step} with manifest checksum {pointer.manifest_checksum}, "
                              f"but {manifest_url} has {checksum_bytes(manifest_data)}"]
    return pointer.step, []


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
        pointer_step: int | None = mf.pointer_from_bytes(store.read(layout.LATEST)).step
    except (FileNotFoundError, ManifestError):
        pointer_step = None
    keep_files: dict[int, set[str]] = {}
    for s in committed:
        try:
            m = read_manifest(store, s)
        except CheckpointError:
            continue  # a corrupt manifest is for `verify` to report, not for gc to guess at
        markers = {layout.marker_path(r, m.save_id) for r in range(m.world_size)}
        keep_files[s] = {f.path for f in m.files} | {layout.MANIFEST} | markers
    doomed: list[Any] = []
    for o in listing:
        head, _, rest = o.path.partition("/")
        s = layout.parse_step_dir(head)
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
