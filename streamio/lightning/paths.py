"""Where a Lightning checkpoint path lives in streamio's layout, and which ``last`` checkpoint is newest.

Lightning names each checkpoint by one path (``s3://b/run/ckpt/epoch=0-step=50.ckpt``) and rebinds
some names to each new save (``last.ckpt``). Each such path is a checkpoint *root* of its own
(docs/design.md "Checkpoints"): the save's parts and manifest below it, and its pointer written
last, so the path holds a complete checkpoint or none, ``streamio ckpt ls|verify|inspect PATH``
read it, and ``ModelCheckpoint``'s top-k removal deletes exactly that root.

Lightning resolves ``ckpt_path="last"`` itself, before any plugin is called, by listing the
directory and taking the newest ``fs.modified()`` of the ``last*.ckpt`` it finds; a root is a
prefix, not an object, on S3/GCS (``modified`` raises there). :func:`newest_last` answers with the
newest *committed* ``last`` root's pointer instead, one object, and :func:`checkpoint_store`
takes that pointer's URL back to its root.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from streamio.checkpoint import root
from streamio.checkpoint.format.checks import ManifestError
from streamio.checkpoint.restore.candidates import detect_foreign
from streamio.errors import CheckpointFormatError, StorageError
from streamio.storage import Store

__all__ = ["LAST_NAME", "checkpoint_store", "newest_last", "remove_root"]

log = logging.getLogger(__name__)

LAST_NAME = re.compile(r"^last(-v?\d+)?\.ckpt$")
"""What ``ModelCheckpoint(save_last=True)`` names its last checkpoint (``last.ckpt``, ``last-v1.ckpt``)."""


def checkpoint_store(path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None) -> Store:
    """The root of the checkpoint ``path`` names: the path itself, or the root whose pointer it is.

    Raises:
        CheckpointFormatError: ``path`` is a local file, not a root (``torch.save``'s ``x.ckpt``).
    """
    url = os.fspath(path).rstrip("/")
    parent, sep, name = url.rpartition("/")
    if sep and parent:
        above = Store(parent, storage_options)
        if root.pointer_url(above) == above.url(name):
            return above
    store = Store(url, storage_options)
    if store.is_local and store.fs.exists(store.root_url) and not store.fs.isdir(store.root_url):
        what = (detect_foreign(store) if store.fs.isfile(store.root_url) else None) or "a file, not a directory"
        raise CheckpointFormatError(
            f"{url} holds {what}; it is not a checkpoint of streamio.lightning.CheckpointIO (save to another "
            f"dirpath, or move the file away)"
        )
    return store


def newest_last(dirpath: str, storage_options: Mapping[str, Any] | None) -> str | None:
    """The pointer URL of the newest committed ``last*.ckpt`` root directly under ``dirpath``.

    Newest by the pointer's commit time, then step. A root whose pointer is missing, unreadable or
    names a save without a manifest (half written, or half removed) is passed over.
    """
    parent = Store(dirpath, storage_options)
    try:
        names = [p.rstrip("/").rpartition("/")[2] for p in parent.fs.ls(parent.url(), detail=False, refresh=True)]
    except FileNotFoundError:
        return None
    found: list[tuple[str, int, str]] = []
    for name in sorted(n for n in names if LAST_NAME.match(n)):
        store = parent.child(name)
        try:
            pointer = root.read_pointer(store)
            if pointer is not None and root.has_manifest(store, pointer.path):
                found.append((pointer.created, pointer.step, root.pointer_url(store)))
        except (ManifestError, StorageError) as exc:
            log.warning("passing over %s for ckpt_path='last': %s", store.root_url, exc)
    return max(found)[2] if found else None


def remove_root(store: Store) -> None:
    """Delete the checkpoint root ``store``: each save's manifest first, then everything else."""
    listing = root.objects(store)
    for ref in root.committed_saves(store, listing):
        root.delete_save(store, ref.path)
    root.delete_objects(store, [o.path for o in root.objects(store)])
