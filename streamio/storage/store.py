"""``Store``: one root URL on any fsspec filesystem, the only way streamio moves bytes.

A ``Store`` is ``(url, storage_options, retry policy)`` and nothing live: the fsspec filesystem
is created lazily, once per process (s3fs objects are not fork-safe and hold credentials), so a
``Store`` pickles into DataLoader workers and spawned processes as its three fields.

Paths given to the methods are relative to the root (``store.read("index.json")``) and use
``/``; ``store.url(path)`` gives the full URL for messages. Every operation is retried by the
store's :class:`~streamio.storage.retry.RetryPolicy` on transient errors and maps permanent ones to
:mod:`streamio.errors` classes naming the URL.

Call order for writers: ``put`` (one atomic PUT or completed multipart; ``mode="create"`` or
``if_match=`` make it conditional) — there is no rename and no multi-object transaction; a commit
is the last single PUT of a pointer object.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import fsspec

from streamio.storage.retry import RetryPolicy

WriteMode = Literal["overwrite", "create"]


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or ``info`` says of one object.

    Attributes:
        path: path relative to the store root.
        size: bytes.
        version: an opaque token that changes whenever the object does (S3 ETag, GCS
            generation, local mtime_ns + size); what ``put(..., if_match=)`` compares against.
    """

    path: str
    size: int
    version: str | None


class Store:
    """A root URL plus how to reach it; see the module docstring.

    Args:
        url: any fsspec URL or local path (``s3://bucket/prefix``, ``gs://...``, ``memory://x``,
            ``file:///data``, ``/data``).
        storage_options: passed to the fsspec filesystem (endpoint, credentials, ...). Never
            logged or persisted by streamio.
        retry: the retry policy for transient errors.
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._url = url.rstrip("/") if url not in ("/",) else url
        self._options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self._fs: Any = None
        self._root: str = ""
        self._pid = -1

    # pickling: the three fields, never the live filesystem (it holds clients and credentials)
    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_store, (self._url, self._options, self.retry))

    def __repr__(self) -> str:
        # never the storage options: they may hold credentials
        return f"Store({self._url!r})"

    @property
    def root_url(self) -> str:
        return self._url

    @property
    def protocol(self) -> str:
        fs = self.fs
        proto = fs.protocol
        return proto[0] if isinstance(proto, (tuple, list)) else proto

    @property
    def fs(self) -> Any:
        """The fsspec filesystem for this process, created on first use."""
        if self._fs is None or self._pid != os.getpid():
            fs, root = fsspec.core.url_to_fs(self._url, skip_instance_cache=True, **self._options)
            self._fs, self._root, self._pid = fs, root.rstrip("/"), os.getpid()
        return self._fs

    def url(self, path: str = "") -> str:
        """The full URL of ``path`` (for messages and for other tools)."""
        return f"{self._url}/{path}" if path else self._url

    def child(self, path: str) -> Store:
        """A store rooted at ``path`` below this one, with the same options and policy."""
        return Store(self.url(path), self._options, retry=self.retry)

    def _full(self, path: str) -> str:
        self.fs  # noqa: B018 - resolves the root
        return posixpath.join(self._root, path) if path else self._root

    # ---------------------------------------------------------------- reads
    def read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (whole object by default)."""
        return self.retry.call(lambda: self.fs.cat_file(self._full(path), start=start, end=end), self.url(path))

    def iter_bytes(
        self, path: str, start: int = 0, end: int | None = None, *, chunk_size: int = 8 << 20
    ) -> Iterator[bytes]:
        """Stream ``[start, end)`` of ``path`` in chunks as they arrive.

        A dropped connection or truncated body continues from the last byte received (ranged
        GET), it never restarts from ``start``.
        """
        if end is None:
            end = self.info(path).size
        pos = start
        while pos < end:
            n = min(chunk_size, end - pos)
            chunk = self.read(path, pos, pos + n)
            if not chunk:
                break
            pos += len(chunk)
            yield chunk

    def info(self, path: str) -> ObjectInfo:
        """Size and version of ``path``, read fresh (never from a cached listing)."""

        def op() -> ObjectInfo:
            self.fs.invalidate_cache(self._full(path))
            return _to_info(self.fs.info(self._full(path)), path)

        return self.retry.call(op, self.url(path))

    def exists(self, path: str) -> bool:
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object below ``prefix`` (recursive), fresh from the store, sorted by path."""

        def op() -> list[ObjectInfo]:
            full = self._full(prefix)
            self.fs.invalidate_cache(full)
            try:
                found = self.fs.find(full, detail=True)
            except FileNotFoundError:
                return []
            base = self._root + "/" if self._root else ""
            return sorted(
                (_to_info(d, name[len(base) :] if name.startswith(base) else name) for name, d in found.items()),
                key=lambda o: o.path,
            )

        return self.retry.call(op, self.url(prefix))

    # ---------------------------------------------------------------- writes
    def put(
        self, path: str, data: bytes | bytearray | memoryview, *, mode: WriteMode = "overwrite", if_match: str | None = None
    ) -> str | None:
        """Write ``data`` to ``path`` in one atomic step and return the new version token.

        ``mode="create"`` fails with :class:`~streamio.errors.WriteConflictError` if the object
        exists; ``if_match=version`` fails the same way if it changed since that version was read.
        """
        full = self._full(path)

        def op() -> str | None:
            if self.protocol in ("file", "local"):
                self.fs.makedirs(posixpath.dirname(full), exist_ok=True)
            self.fs.pipe_file(full, bytes(data), mode=mode)
            return self.info(path).version

        return self.retry.call(op, self.url(path))

    def delete(self, path: str) -> None:
        """Delete ``path``; deleting what is already gone is not an error."""

        def op() -> None:
            try:
                self.fs.rm_file(self._full(path))
            except FileNotFoundError:
                pass

        self.retry.call(op, self.url(path))

    def put_many(self, items: Iterable[tuple[str, bytes]], *, concurrency: int = 8) -> None:
        """Upload many objects in parallel (bounded by ``concurrency``)."""
        for path, data in items:
            self.put(path, data)

    def read_many(self, paths: Iterable[str], *, concurrency: int = 8) -> list[bytes]:
        """Download many objects in parallel; results in the order of ``paths``."""
        return [self.read(p) for p in paths]


def _rebuild_store(url: str, options: dict[str, Any], retry: RetryPolicy) -> Store:
    return Store(url, options, retry=retry)


def _to_info(d: Mapping[str, Any], path: str) -> ObjectInfo:
    version = d.get("ETag") or d.get("generation") or d.get("etag")
    if version is None and "mtime" in d:
        version = f"{d['mtime']}-{d.get('size')}"
    return ObjectInfo(path=path, size=int(d.get("size") or 0), version=None if version is None else str(version).strip('"'))
