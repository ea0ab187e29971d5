"""Replacing a dataset only once the new one is complete: a write's marker, its names, its commit, its cleanup.

A dataset is its ``index.json``: readers open what it names. A write (``DatasetWriter``,
``streamio shard``) may go over an existing dataset and may stop at any point (Ctrl-C, SIGTERM, a
crash, a lost connection), and object stores have no rename to move finished shards into place.
So a write never touches what the live index names, and switches in one PUT:

1. **Marker first** (:func:`begin`). Before any shard, the write puts the marker
   (:mod:`streamio.data.format.marker`; create-only: one write at a time per prefix), recording
   the names its shards will take. Shards that a marker claims and no index names are the
   leftovers of an interrupted write: ``inspect`` and ``ls`` say so (instead of suggesting
   ``streamio index``, which would make a partial dataset look whole), ``build_index`` refuses
   them, and the next write with ``overwrite=True`` removes them (and, on S3, the multipart
   uploads a killed writer left).
2. **Names that cannot collide.** The first write into a prefix takes the plain names
   (``data-000000.tar``, ...: the same samples give the same names and bytes); a write where
   anything is already named like that takes ``data-<generation>-000000.tar``, the generation 8
   random hex digits no object in the prefix starts with. Nothing the live index names is
   overwritten.
3. **The index is the commit** (:func:`commit`). ``index.json`` is written last, in one conditional
   PUT: create-only where there was none, compare-and-swap on the version seen at the start
   otherwise, so a writer that committed meanwhile is never silently replaced. Until that PUT every
   reader sees the old dataset, whole.
4. **Cleanup after.** Only then are the old dataset's shards and layout sidecars that the new
   index does not name deleted, and the marker last. A write stopped during cleanup leaves
   unreferenced objects, never a dataset naming a missing shard.

``overwrite=True`` says that no other write into the prefix is running: an interrupted write's
marker is then taken as stale and its leftovers removed.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from streamio.data.format.index import DatasetIndex, load_index, write_index
from streamio.data.format.layout import INDEX_NAME, WRITING_NAME, sidecar_path
from streamio.data.format.marker import Generation, encode_marker, read_marker
from streamio.errors import (
    DatasetError,
    IndexFormatError,
    IndexNotFoundError,
    StorageError,
    UnsupportedOperationError,
    WriteConflictError,
)
from streamio.storage import Store

__all__ = ["Previous", "begin", "commit", "discard", "occupied"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Previous:
    """The dataset a write replaces: the version its commit must find, and the objects it may delete after.

    Attributes:
        version: the version of ``index.json`` when the write began (None: there was none).
        paths: the old dataset's shards and sidecars below the prefix.
    """

    version: str | None
    paths: tuple[str, ...]


def occupied(store: Store) -> str | None:
    """Why a write without ``overwrite`` must not start at ``store``: it holds a dataset or the leftovers
    of an interrupted write. None when the prefix is free."""
    if store.exists(INDEX_NAME):
        return f"{store.url(INDEX_NAME)} exists: {store.root_url} already holds a dataset"
    marker = read_marker(store)
    if marker is not None:
        return (
            f"{store.root_url} holds the shards of a write that did not finish ({marker.pattern}, started "
            f"{marker.started}; {store.url(WRITING_NAME)} marks them): they are not a dataset"
        )
    return None


def begin(
    store: Store, prefix: str, *, overwrite: bool, clock: Callable[[], float] = time.time
) -> tuple[Generation, Previous]:
    """Start a write of shards named ``{prefix}-...`` at ``store`` (steps 1 and 2 of the module docstring).

    Raises:
        DatasetError: the prefix is occupied (:func:`occupied`) and ``overwrite`` is False, or
            another write put its marker meanwhile.
    """
    reason = occupied(store)
    if reason is not None and not overwrite:
        raise DatasetError(f"{reason}. Write to another prefix, or pass overwrite=True (`--overwrite`).")
    previous = _previous(store)
    stale = read_marker(store) if reason is not None else None
    listing = {o.path for o in store.list()}
    if stale is not None:
        _remove_leftovers(store, stale, listing - set(previous.paths))
        store.delete(WRITING_NAME)
        listing = {o.path for o in store.list()}
    tag = "" if not any(Generation(prefix, "", "").owns(p) for p in listing) else _fresh_tag(listing, prefix)
    generation = Generation(prefix, tag, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock())))
    try:
        store.put(WRITING_NAME, encode_marker(generation), mode="create")
    except WriteConflictError as exc:
        raise DatasetError(
            f"another write into {store.root_url} started meanwhile ({store.url(WRITING_NAME)} appeared): only one "
            f"write at a time may go to a prefix"
        ) from exc
    return generation, previous


def commit(
    store: Store, generation: Generation, previous: Previous, index: DatasetIndex, inline_limit: int,
    *, leftovers: Iterable[str] = (),
) -> None:
    """Write ``index.json`` in one conditional PUT, then delete what the old dataset named and the new one
    does not, then ``leftovers`` (this write's objects the index does not name), and the marker
    (steps 3 and 4 of the module docstring).

    Raises:
        DatasetError: the index changed since the write began (another writer committed): nothing
            was replaced; this write's shards are left for ``overwrite=True`` to remove.
    """
    try:
        _put_index(store, index, previous.version, inline_limit)
    except WriteConflictError as exc:
        raise DatasetError(
            f"{store.url(INDEX_NAME)} changed while this write ran (another write committed): it was not replaced. "
            f"This write's shards ({generation.pattern}) are left in {store.root_url}."
        ) from exc
    named = {s.path for s in index.shards} | {sidecar_path(s.path) for s in index.shards}
    for path in previous.paths:
        if path not in named:
            _delete(store, path)
    for path in leftovers:
        _delete(store, path)
    _delete(store, WRITING_NAME)


def discard(store: Store) -> None:
    """Remove the marker of a write that stored no shard (nothing else to clean); best effort."""
    _delete(store, WRITING_NAME)


def _put_index(store: Store, index: DatasetIndex, version: str | None, inline_limit: int) -> None:
    if version is None:
        write_index(store, index, inline_limit=inline_limit, mode="create")
        return
    try:
        write_index(store, index, inline_limit=inline_limit, if_match=version)
    except UnsupportedOperationError:  # a backend without compare-and-swap: the marker is the only guard
        write_index(store, index, inline_limit=inline_limit)


def _previous(store: Store) -> Previous:
    """The live dataset at ``store``: its index's version and the objects below the prefix it names."""
    try:
        version = store.info(INDEX_NAME).version
        old = load_index(store)
    except (IndexNotFoundError, FileNotFoundError):
        return Previous(None, ())
    except IndexFormatError as exc:  # a damaged index: replaced, but what it named is not known to delete
        log.warning("%s cannot be read (%s): the shards it names are left in place", store.url(INDEX_NAME), exc)
        return Previous(store.info(INDEX_NAME).version, ())
    if old.shards_url is not None:  # its shards are elsewhere: not this write's to delete
        return Previous(version, ())
    paths = [s.path for s in old.shards] + [sidecar_path(s.path) for s in old.shards]
    return Previous(version, tuple(paths))


def _fresh_tag(listing: set[str], prefix: str) -> str:
    while True:
        tag = secrets.token_hex(4)
        if not any(p.startswith(f"{prefix}-{tag}-") or p.startswith(f"_layout/{prefix}-{tag}-") for p in listing):
            return tag


def _remove_leftovers(store: Store, stale: Generation, candidates: set[str]) -> None:
    """Delete what an interrupted write stored (its shards, sidecars, dangling multipart uploads)."""
    gone = sorted(p for p in candidates if stale.owns(p))
    for path in gone:
        _delete(store, path)
    for upload in store.incomplete_uploads():
        if stale.owns(upload.path):
            _ignore(lambda upload=upload: store.abort_upload(upload), store.url(upload.path))
    log.warning(
        "removed %d objects left by a write into %s that did not finish (%s, started %s)",
        len(gone), store.root_url, stale.pattern, stale.started,
    )


def _delete(store: Store, path: str) -> None:
    _ignore(lambda: store.delete(path), store.url(path))


def _ignore(op: Callable[[], Any], url: str) -> None:
    """Cleanup never fails a write that committed: a leftover is logged, the next write removes it."""
    try:
        op()
    except StorageError as exc:
        log.warning("could not remove %s (%s): remove it by hand", url, exc)
