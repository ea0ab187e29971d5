"""Where a dataset URL's index and shards are: a prefix, an index URL, or an indexed shard pattern.

Users name a dataset three ways, and every reader (``StreamingDataset``, ``streamio ls / inspect /
verify / plan``) takes all three through :func:`open_dataset`:

* **a prefix holding ``index.json``** (``s3://b/ds``): the index and, unless it records
  ``shards_url``, the shards;
* **an index URL** (``s3://mine/indexes/web.json``, any name ending in ``.json``): the shards are
  where the index says (``shards_url``, written by ``streamio index SHARDS --index-url URL`` for
  shards in a bucket one can read but not write), or beside it;
* **a WebDataset shard pattern** (``s3://b/ds/shard-{000000..000999}.tar``, globs too), as
  webdataset users write them: once indexed, the pattern means the dataset whose ``index.json``
  is beside the shards, and it must name exactly the indexed shards (a pattern naming others is
  refused with the command that indexes them; silently reading a different set than the one
  named would be worse).

Under ``torch.distributed`` one rank reads for all (:mod:`streamio.data.sharing`):
:func:`fetch_dataset` is :func:`open_dataset` that also returns the index's bytes as read, and
:func:`parse_dataset` makes the same ``(store, index)`` of those bytes on another rank without
reading anything (every check that needs no storage made again).

The :class:`~streamio.storage.Store` returned is the one the index's shard paths are relative
to. An index is untrusted input, so where it may send a reader is limited: an index read from
local disk (or memory) may point anywhere, one read from remote storage only at the same kind of
storage (the same scheme; for http(s), the same host), so a planted index can neither make a
reader open local files nor carry this protocol's storage options to another server. Shard
paths stay plain relative names below that location (:mod:`streamio.data.format.index_schema`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from streamio.data.format.index import DatasetIndex, parse_index, read_index_bytes
from streamio.data.format.layout import (
    INDEX_NAME,
    WRITING_NAME,
    gzip_advice,
    gzip_glob,
    is_gzip_shard,
    shard_path_problem,
)
from streamio.data.format.marker import read_marker
from streamio.data.format.patterns import expand_patterns, gzip_shards, split_pattern
from streamio.errors import ConfigError, IndexFormatError, IndexNotFoundError, StorageError
from streamio.storage import Store
from streamio.storage.backends import is_file_url, pointer_scope
from streamio.storage.secrets import has_userinfo, strip_userinfo

__all__ = [
    "absolute_url", "fetch_dataset", "index_location", "is_index_url", "open_dataset", "parse_dataset", "same_location",
    "split_index_url",
]

_PATTERN_CHARS = "{*?["


def open_dataset(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Store, DatasetIndex]:
    """The store the shards are at and the dataset's index, for a prefix, an index URL or a pattern.

    Args:
        url: a prefix holding ``index.json``; an index URL (ends in ``.json``); or a shard pattern
            (``.../shard-{000000..000999}.tar``, globs) whose shards were indexed with
            ``streamio index`` (``index.json`` beside them).
        storage_options: fsspec options for the index's location and the shards' (one set: the
            same credentials reach both).

    Returns:
        ``(store, index)``: ``index.shards[i].path`` is relative to ``store``.

    Raises:
        IndexNotFoundError: no index there, or a pattern that names other shards than the
            indexed ones (the message gives the ``streamio index`` command).
        IndexFormatError: an invalid index, or one pointing where it may not (see the module
            docstring).
    """
    store, index, _ = fetch_dataset(url, storage_options)
    return store, index


def fetch_dataset(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[Store, DatasetIndex, bytes]:
    """:func:`open_dataset`, and the index's bytes as read: what the other ranks of a job take to
    :func:`parse_dataset` instead of reading it themselves.

    Raises:
        what :func:`open_dataset` raises.
    """
    return _open(url, storage_options, None)


def parse_dataset(url: str, storage_options: Mapping[str, Any] | None, data: bytes) -> tuple[Store, DatasetIndex]:
    """What :func:`open_dataset` returns for ``url``, from the bytes of its index that another
    process of the job read (and checked against the store) with :func:`fetch_dataset`.

    Nothing is read: the bytes are parsed and checked here exactly as if they had been read here
    (they are as untrusted), and every check that needs no storage is made again. The one check
    that does, that a pattern names exactly the indexed shards (a listing), is the reader's.

    Raises:
        IndexFormatError: an invalid index, or one pointing where it may not.
    """
    store, index, _ = _open(url, storage_options, data)
    return store, index


def _open(url: str, options: Mapping[str, Any] | None, data: bytes | None) -> tuple[Store, DatasetIndex, bytes]:
    """The shards' store, the index and its bytes; the index read here unless ``data`` is given."""
    directory, name, pattern = index_location(url)
    where = Store(directory, options)
    shown = strip_userinfo(url)
    if pattern is not None and is_gzip_shard(pattern):
        raise IndexNotFoundError(f"{shown!r} names gzip'd shards: {gzip_advice(shown)}")
    read_here = data is None
    if data is None:
        data = _read_index(where, name, pattern, shown)
    index = parse_index(data, url=where.url(name), layouts_at=where)
    if pattern is None:
        return _shards_store(index, where, options, where.url(name)), index, data
    _check_pattern(where, index, pattern, shown, list_shards=read_here)
    return where, index, data


def _read_index(where: Store, name: str, pattern: str | None, shown: str) -> bytes:
    """The index's bytes; without one, what to do about it (index the pattern's shards, finish or
    convert the shards found instead)."""
    try:
        return read_index_bytes(where, name)
    except IndexNotFoundError as exc:
        if pattern is not None:
            raise IndexNotFoundError(
                f"the shards of {shown!r} are not indexed: no {INDEX_NAME} at {where.url(INDEX_NAME)}; index them "
                f"once with `streamio index '{shown}'`, then open the same URL"
            ) from exc
        if name != INDEX_NAME:  # an index URL named outright: nothing to guess about the prefix
            raise
        raise IndexNotFoundError(_unfinished_instead(where) or _gzip_instead(where) or str(exc)) from exc


def _unfinished_instead(store: Store) -> str | None:
    """What to say of a prefix without an index that holds an unfinished write's shards: never to index
    them (a partial dataset would look whole), and how to clean up."""
    try:
        marker = read_marker(store)
        count = sum(1 for o in store.list() if marker is not None and marker.owns(o.path))
    except (StorageError, IndexFormatError):
        return None
    if marker is None:
        return None
    return (
        f"no {INDEX_NAME} at {store.url(INDEX_NAME)}: the {count} shards there ({marker.pattern}) were left by a "
        f"`streamio shard` that did not finish (started {marker.started}; {store.url(WRITING_NAME)} marks them). "
        f"They are not a dataset and must not be indexed: write it again with `streamio shard SRC {store.root_url} "
        f"--overwrite`, which removes them first, or delete the prefix"
    )


def _gzip_instead(store: Store) -> str | None:
    """What to say of a prefix without an index that holds gzip'd shards (one listing, on failure only)."""
    try:
        gzipped = gzip_shards(store)
    except StorageError:
        return None  # the plain message is still right
    if not gzipped:
        return None
    return (
        f"no {INDEX_NAME} at {store.url(INDEX_NAME)}, and {len(gzipped)} gzip'd shard{'s' if len(gzipped) > 1 else ''} "
        f"({gzipped[0]}{', ...' if len(gzipped) > 1 else ''}): {gzip_advice(gzip_glob(store.root_url, gzipped))}"
    )


def index_location(url: str) -> tuple[str, str, str | None]:
    """Where :func:`open_dataset` looks for the index of ``url``: ``(directory, name, pattern)``.

    ``"s3://b/ds"`` -> ``("s3://b/ds", "index.json", None)``; ``"s3://b/i/web.json"`` ->
    ``("s3://b/i", "web.json", None)``; ``"s3://b/ds/s-{0..9}.tar"`` -> ``("s3://b/ds", "index.json",
    "s-{0..9}.tar")``.
    """
    if is_index_url(url):
        return (*split_index_url(url), None)
    root, pattern = split_pattern(url)
    return root, INDEX_NAME, pattern


def is_index_url(url: str) -> bool:
    """Whether ``url`` names an index file (its last component ends in ``.json``, no pattern)."""
    last = url.rstrip("/").rsplit("/", 1)[-1]
    return last.endswith(".json") and not any(c in last for c in _PATTERN_CHARS)


def split_index_url(url: str) -> tuple[str, str]:
    """``"s3://b/idx/web.json"`` -> ``("s3://b/idx", "web.json")``; a URL not ending in ``.json``
    names a prefix: ``("s3://b/idx", "index.json")``.

    Raises:
        ConfigError: the name cannot be an object name below the directory (control characters,
            backslashes: :func:`~streamio.data.format.layout.shard_path_problem`).
    """
    url = url.rstrip("/") or url
    if not is_index_url(url):
        return url, INDEX_NAME
    head, sep, name = url.rpartition("/")
    head = head if sep else "."  # a bare "web.json": the current directory
    reason = shard_path_problem(name)
    if reason:
        raise ConfigError(f"{strip_userinfo(url)!r} cannot name an index: {name!r} {reason}")
    return head, name


def absolute_url(url: str) -> str:
    """``url`` as an index records it: ``scheme://...`` without a trailing ``/``; local paths
    become absolute ``file://`` URLs.

    Raises:
        ConfigError: the URL holds a user name or password (an index never records credentials:
            give them with storage options or the environment).
    """
    if has_userinfo(url):
        raise ConfigError(
            f"{strip_userinfo(url)} holds a user name or password; an index never records credentials: give "
            f"them as storage options (-o KEY=VALUE) or in the environment"
        )
    return _normalize(url)


def same_location(a: str, b: str) -> bool:
    """Whether two URLs name the same place (local paths compared absolute, trailing ``/`` ignored)."""
    return _normalize(a) == _normalize(b)


def _normalize(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "file://" + os.path.abspath(url)
    if is_file_url(url):
        return "file://" + os.path.abspath(rest or "/")
    return url.rstrip("/")


def _shards_store(index: DatasetIndex, where: Store, options: Mapping[str, Any] | None, index_url: str) -> Store:
    """The store the shards of ``index`` (read at ``where``) are at; checks where it may point."""
    if index.shards_url is None:
        return where
    scope = pointer_scope(where.root_url)
    if scope is not None and pointer_scope(index.shards_url) != scope:
        protocol, host = scope
        raise IndexFormatError(
            f"{index_url} says its shards are at {index.shards_url}, but an index read from {protocol}:// storage may "
            f"only point at shards in {protocol}:// storage{'' if host is None else ' on ' + host}. "
            f"Rebuild it with `streamio index SHARDS --index-url {strip_userinfo(where.root_url)}` if you trust it."
        )
    return Store(index.shards_url, options)


def _check_pattern(store: Store, index: DatasetIndex, pattern: str, shown: str, *, list_shards: bool) -> None:
    """Refuse a pattern unless the index beside the shards it names indexes exactly those shards.

    The fix a refusal suggests never drops an indexed shard: without an index, index the named
    shards beside them; when they include every indexed one, replace the index (``--overwrite``);
    otherwise index them apart (``--index-url``), leaving the index that is there as it is.
    ``list_shards=False``: the shards were listed by the process that read the index.
    """
    fix = (
        f"to read only these shards, index them apart with `streamio index '{shown}' --index-url "
        f"{store.root_url}/subset.json` and open that URL"
    )
    if index.shards_url is not None:
        raise IndexNotFoundError(
            f"{store.url(INDEX_NAME)} indexes the shards at {index.shards_url}, not those {shown!r} names; {fix}, "
            f"or open {store.root_url} for the dataset it indexes"
        )
    if not list_shards:
        return
    named = expand_patterns(store, pattern)
    indexed = [s.path for s in index.shards]
    named_set, indexed_set = set(named), set(indexed)
    if named_set != indexed_set:
        unindexed = [p for p in named if p not in indexed_set]
        unnamed = [p for p in indexed if p not in named_set]
        if not unnamed:  # a superset: re-indexing beside them drops nothing
            fix = f"index them with `streamio index '{shown}' --overwrite` (it names every indexed shard)"
        raise IndexNotFoundError(
            f"{shown!r} names {len(named)} shards but {store.url(INDEX_NAME)} indexes {len(indexed)}: "
            f"{len(unindexed)} named are not indexed{_first(unindexed)}, {len(unnamed)} indexed are not named"
            f"{_first(unnamed)}; {fix}, or open {store.root_url} for the indexed ones"
        )


def _first(paths: list[str], n: int = 3) -> str:
    if not paths:
        return ""
    more = f", ... (+{len(paths) - n})" if len(paths) > n else ""
    return f" ({', '.join(paths[:n])}{more})"
