"""``Store``: one root URL on any fsspec filesystem, the only way streamio moves bytes.

A ``Store`` is ``(url, storage_options, retry policy)`` and nothing live: its backend is made
lazily, once per process, and it pickles without secrets (:mod:`~streamio.storage.connection`).
``root_url``, ``url()``, its repr and every message show the URL with its userinfo replaced by
``***``; streamio never writes a secret into a pickle, a log, a repr or an error message.

The store is a facade: what differs per protocol is its backend's
(:mod:`streamio.storage.backends`, picked once), and the store adds what is the same everywhere.
Paths are relative to the root (``store.read("index.json")``) and use ``/``. Every operation is
retried by the store's :class:`~streamio.storage.retry.RetryPolicy` on transient errors (the
libraries' own retries are configured down to one attempt, so attempts never multiply) and maps
permanent ones to :mod:`streamio.errors` classes naming the URL, at once.

"Nothing there" is only said of a root that is there: an unknown protocol fails when the Store
is made (:class:`~streamio.errors.UnsupportedProtocolError`); an endpoint that cannot be reached
raises :class:`~streamio.errors.StorageUnreachableError` (never "not found", never an empty
listing); and on stores with buckets a read, ``info``/``exists`` or write that finds nothing, and a
listing that comes back empty, are checked against the bucket itself (once per Store, see
:mod:`~streamio.storage.roots`): a missing bucket raises :class:`~streamio.errors.BucketNotFoundError`.

Reads: ``iter_bytes`` streams and resumes at the last byte received (:mod:`~streamio.storage.stream`);
``read`` is one whole-range request where the backend has one, else joins ``iter_bytes``.
Corruption: a flipped byte inside a body is NOT detected here (s3fs/gcsfs return wrong bytes with
no error on ranged reads); callers verify bytes with :mod:`streamio.checksum` against the index
or manifest.

Call order for writers: ``put`` (one atomic PUT or completed multipart; ``mode="create"`` or
``if_match=`` make it conditional); there is no rename and no multi-object transaction, so a
commit is the last single PUT of a pointer object. A conditional put whose first attempt succeeded
on the server but whose answer was lost is retried and then reports a conflict: callers that see
``WriteConflictError`` re-read the object (it may be their own write).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from streamio.errors import ConfigError, ObjectNotFoundError
from streamio.metrics.trace import span
from streamio.pool import run_parallel
from streamio.storage import backends
from streamio.storage.backends import TMP_SUFFIX, Backend, PutRequest, WriteMode
from streamio.storage.connection import Connection
from streamio.storage.pacing import Pacer, pacer_for
from streamio.storage.retry import RetryPolicy
from streamio.storage.roots import BucketCheck
from streamio.storage.stream import at_most, resuming, traced

__all__ = ["IncompleteUpload", "ObjectInfo", "Store", "WriteMode", "documented_write_rate", "store_at", "write_pacer"]

T = TypeVar("T")

MULTIPART_THRESHOLD = 64 << 20
PART_SIZE = 16 << 20


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing or ``info`` says of one object.

    Attributes:
        path: path relative to the store root.
        size: bytes.
        version: an opaque token that changes whenever the object does (S3 ETag, GCS
            generation, local inode-mtime_ns-size, memory content CRC); what
            ``put(..., if_match=)`` compares against.
    """

    path: str
    size: int
    version: str | None


@dataclass(frozen=True)
class IncompleteUpload:
    """A multipart upload that was started and never completed (see :meth:`Store.incomplete_uploads`).

    Attributes:
        path: the object it would have written, relative to the store root.
        upload_id: the store's id of the upload.
        initiated: when it started (a timezone-aware datetime), if the store says.
    """

    path: str
    upload_id: str
    initiated: Any


class Store:
    """A root URL plus how to reach it; see the module docstring.

    Args:
        url: any fsspec URL or local path (``s3://bucket/prefix``, ``gs://...``, ``memory://x``,
            ``file:///data``, ``/data``).
        storage_options: passed to the fsspec filesystem (endpoint, credentials, ...). Never
            logged or persisted by streamio.
        retry: the retry policy for transient errors.

    Raises:
        UnsupportedProtocolError: fsspec knows no such protocol.
    """

    def __init__(
        self, url: str, storage_options: Mapping[str, Any] | None = None, *, retry: RetryPolicy | None = None
    ) -> None:
        self._conn = Connection(url, storage_options, retry or RetryPolicy())
        self._buckets = BucketCheck(self._conn.policy, self._conn.shown)  # shared with child stores

    def __reduce__(self) -> tuple[Any, ...]:
        return (_over, (self._conn,))  # the connection pickles without secrets

    def __repr__(self) -> str:
        return f"Store({self._conn.shown!r})"  # never the options, never the URL's userinfo

    @property
    def root_url(self) -> str:
        """The root URL this store was made with (no trailing slash; userinfo shown as ``***``)."""
        return self._conn.shown

    @property
    def retry(self) -> RetryPolicy:
        """The retry policy for transient errors."""
        return self._conn.policy

    @property
    def _options(self) -> dict[str, Any]:
        return self._conn.options

    @property
    def _backend(self) -> Backend:
        return self._conn.backend

    @property
    def fs(self) -> Any:
        """The fsspec filesystem for this process, created on first use (inner retries off)."""
        return self._backend.fs

    @property
    def protocol(self) -> str:
        """``s3``, ``gs``, ``file``, ``memory``, ... (for messages; creates the filesystem)."""
        return self._backend.protocol

    @property
    def is_local(self) -> bool:
        """Whether objects are files on this machine (no request latency, memory-mappable)."""
        return self._backend.is_local

    def url(self, path: str = "") -> str:
        """The full URL of ``path`` (for messages and for other tools)."""
        return f"{self.root_url}/{path}" if path else self.root_url

    def child(self, path: str) -> Store:
        """A store rooted at ``path`` below this one, with the same options and policy."""
        return _over(self._conn.derive(path), self._buckets)

    def for_verified_reads(self) -> Store:
        """This root, for objects the caller verifies end to end (size and checksum) itself.

        On S3, whole-object reads then skip botocore's response-checksum pass (one more pass over
        every body); elsewhere, or where the caller's options already decide it, ``self``.
        """
        options = backends.backend_class(self.root_url).options_for_verified_reads(self._options)
        return self if options is None else _over(self._conn.derive("", options), self._buckets)

    def _call(self, fn: Callable[[], T], url: str, *, pacer: Pacer | None = None) -> T:
        """``fn`` under the retry policy; a not-found is checked against the bucket (see module doc)."""
        try:
            return self.retry.call(fn, url, pacer=pacer)
        except ObjectNotFoundError as exc:
            self._buckets.ensure(self._backend, url, exc)
            raise

    # ---------------------------------------------------------------- reads
    def read(
        self, path: str, start: int | None = None, end: int | None = None, *, max_bytes: int | None = None
    ) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (whole object by default), length verified.

        One request where the backend reads whole ranges (local disk: one ``read(2)``; S3: one
        GET in the calling thread, so parallel reads scale past s3fs's event loop), retried from
        its start if a connection drops; elsewhere it joins :meth:`iter_bytes`. ``max_bytes``
        bounds a document (``index.json``, ``latest.json``) whatever the store sends.

        Raises:
            ObjectNotFoundError, BucketNotFoundError, StoragePermissionError: at once (one attempt).
            CorruptDataError: it ends before ``end``; ObjectTooLargeError: longer than ``max_bytes``.
            TransientStorageError: transient errors outlasted the policy.
        """
        if start is not None and end is not None and end <= start:
            return b""
        backend, full, url = self._backend, self._conn.full(path), self.url(path)
        if not backend.whole_reads:
            pieces = self.iter_bytes(path, start or 0, end, chunk_size=1 << 20)
            return b"".join(pieces) if max_bytes is None else at_most(pieces, max_bytes, url)
        return self._call(_fetch(lambda: backend.read(full, url, start or 0, end, max_bytes), url), url)

    def read_versioned(self, path: str, *, max_bytes: int | None = None) -> tuple[bytes, str | None]:
        """:meth:`read` of all of ``path`` and the version of the bytes read (what a compare-and-swap
        over them expects): one GET where its answer has it (S3 ETag, local ``fstat``), else ``info`` first."""
        backend, full, url = self._backend, self._conn.full(path), self.url(path)
        if backend.versioned_reads:
            return self._call(_fetch(lambda: backend.read_versioned(full, url, 0, None, max_bytes), url), url)
        version = self.info(path).version  # first: a write before the read makes a swap against it fail
        return self.read(path, max_bytes=max_bytes), version

    def read_view(self, path: str) -> bytes | memoryview:
        """The whole of an object never rewritten in place, read once: on local disk a read-only memory map
        (no copy into fresh memory: a restore verifies and copies parts from the page cache); else :meth:`read`."""
        backend, full = self._backend, self._conn.full(path)
        return self.retry.call(lambda: backend.map(full), self.url(path)) if backend.is_local else self.read(path)

    def iter_bytes(
        self, path: str, start: int = 0, end: int | None = None, *, chunk_size: int = 8 << 20
    ) -> Iterator[bytes]:
        """Stream ``[start, end)`` of ``path`` (``end`` None: to the end) as it arrives, resuming
        where a connection dropped; pieces of at most ``min(chunk_size, 1 MiB)`` bytes, the first
        one as soon as any bytes arrived; the total length is verified.

        Raises:
            ObjectNotFoundError, BucketNotFoundError, StoragePermissionError: at once.
            CorruptDataError: the object ends before ``end``.
            TransientStorageError: no progress within the retry policy.
        """
        url = self.url(path)
        piece = max(1, min(chunk_size, 1 << 20))
        budget = self.retry.budget()
        try:
            if end is None and start > 0:
                end = self.info(path).size
            if end is not None and end <= start:
                return
            opener = functools.partial(self._backend.open_stream, self._conn.full(path))
            yield from traced(resuming(opener, url, start, end, piece=piece, budget=budget), url)
        except ObjectNotFoundError as exc:
            self._buckets.ensure(self._backend, url, exc)
            raise

    def info(self, path: str) -> ObjectInfo:
        """Size and version of ``path``, read fresh (never from a cached listing), in one request."""
        backend, full = self._backend, self._conn.full(path)
        size, version = self._call(lambda: backend.info(full), self.url(path))
        return ObjectInfo(path=path, size=size, version=version)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists now (fresh; a missing bucket, permission and transient errors
        are raised: only a reachable root answers ``False``)."""
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object below ``prefix`` (recursive), fresh from the store, sorted by path.

        Empty only for a root that is there: a missing bucket raises
        :class:`~streamio.errors.BucketNotFoundError`, an unreachable endpoint
        :class:`~streamio.errors.StorageUnreachableError`.
        """
        backend, full = self._backend, self._conn.full(prefix)

        def op() -> list[ObjectInfo]:
            out = []
            for name, d in backend.find(full).items():
                if name.endswith(TMP_SUFFIX) or d.get("type") == "directory":
                    continue
                try:
                    version = backend.version_of(d)
                except FileNotFoundError:  # deleted between the listing and its stat: not there any more
                    continue
                out.append(ObjectInfo(self._conn.relative(name), int(d.get("size") or 0), version))
            return sorted(out, key=lambda o: o.path)

        found = self._call(op, self.url(prefix))
        if not found:
            self._buckets.ensure(self._backend, self.url(prefix))
        return found

    # ---------------------------------------------------------------- writes
    def put(
        self, path: str, data: bytes | bytearray | memoryview, *, mode: WriteMode = "overwrite",
        if_match: str | None = None, concurrency: int = 8, sync_dir: bool = True,
    ) -> str | None:
        """Write ``data`` to ``path`` in one atomic step and return the new version token.

        Args:
            path: object path below the root.
            data: the whole content (large objects go up in parallel parts where supported).
            mode: ``"overwrite"`` or ``"create"`` (fail if the object exists).
            if_match: a version from ``info``/``put``: fail if the object changed since.
            concurrency: parallel parts for a multipart upload.
            sync_dir: ``False``: on local disk the name is durable once a later put into its directory returns.

        Raises:
            WriteConflictError: the create-only or compare-and-swap condition failed.
            UnsupportedOperationError: ``if_match`` on a backend without compare-and-swap.
            StoragePermissionError, ObjectNotFoundError: at once (e.g. no bucket).
            TransientStorageError: transient errors outlasted the policy.
        """
        if mode not in ("overwrite", "create"):
            raise ConfigError(f"put mode must be 'overwrite' or 'create', got {mode!r}")
        if mode == "create" and if_match is not None:
            raise ConfigError("put takes mode='create' or if_match=, not both")
        backend, full, url = self._backend, self._conn.full(path), self.url(path)
        view = memoryview(data) if isinstance(data, bytes) else memoryview(data).cast("B")
        request = PutRequest(mode, if_match, concurrency, PART_SIZE, MULTIPART_THRESHOLD, sync_dir)
        return self._call(lambda: backend.put(full, url, view, request), url, pacer=_pacer(self))

    def delete(self, path: str) -> None:
        """Delete ``path``; deleting what is already gone is not an error."""
        backend, full = self._backend, self._conn.full(path)
        self.retry.call(lambda: backend.delete(full), self.url(path), pacer=_pacer(self))

    def incomplete_uploads(self, prefix: str = "") -> list[IncompleteUpload]:
        """Multipart uploads under ``prefix`` started and never completed or aborted (``[]`` where
        the backend has none): a killed writer leaves them behind, unlisted but billed on S3."""
        backend, full = self._backend, self._conn.full(prefix)
        found = self._call(lambda: backend.incomplete_uploads(full), self.url(prefix))
        return [IncompleteUpload(self._conn.relative(name), upload_id, when) for name, upload_id, when in found]

    def abort_upload(self, upload: IncompleteUpload) -> None:
        """Abort one upload from :meth:`incomplete_uploads` (its parts are deleted)."""
        backend, full = self._backend, self._conn.full(upload.path)
        self.retry.call(lambda: backend.abort_upload(full, upload.upload_id), self.url(upload.path))

    def put_many(self, items: Iterable[tuple[str, bytes]], *, concurrency: int = 8) -> None:
        """Upload many objects in parallel, at most ``concurrency`` at a time. The first error (naming its URL)
        is raised after the uploads in flight finish; those not started are cancelled. No memory per thread."""
        self._parallel(lambda item: self.put(*item), list(items), concurrency)

    def read_many(self, paths: Iterable[str], *, concurrency: int = 8) -> list[bytes]:
        """Download many objects in parallel; results in the order of ``paths``."""
        return self._parallel(self.read, list(paths), concurrency)

    def _parallel(self, fn: Callable[[Any], T], items: list[Any], concurrency: int) -> list[T]:
        if items:
            self._backend  # noqa: B018 - create the filesystem once, before the threads
        return run_parallel(fn, items, concurrency=concurrency, name="streamio-store")


def _fetch(read: Callable[[], T], url: str) -> Callable[[], T]:
    """``read`` (one attempt at reading an object whole) in a ``fetch`` span of the trace."""

    def fetch() -> T:
        with span("fetch", url=url):
            return read()
    return fetch


def _over(conn: Connection, buckets: BucketCheck | None = None) -> Store:
    """A Store on an existing connection (unpickling, ``child``), sharing ``buckets`` if given."""
    store = Store.__new__(Store)
    store._conn, store._buckets = conn, buckets or BucketCheck(conn.policy, conn.shown)
    return store


def write_pacer(store: Store) -> Pacer | None:
    """The pacer this process's writes to ``store``'s bucket go through (``None``: local files, or
    a retry policy that does not pace writes); see :mod:`streamio.storage.pacing`."""
    return _pacer(store) if store.retry.pace_writes else None


def store_at(target: Store | str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None, *,
             caller: str) -> Store:
    """The store a public function's ``target`` names: a URL or local path (with ``storage_options``),
    or a :class:`Store` as it is (it carries its own options: both together are refused).

    Raises:
        ConfigError: ``target`` is none of these, or a ``Store`` came with ``storage_options``.
    """
    if isinstance(target, Store):
        if storage_options is not None:
            raise ConfigError(f"{caller}({target.root_url!r}, storage_options=...): a Store carries its own "
                              f"options; pass the URL with storage_options, or the Store alone")
        return target
    if not isinstance(target, (str, os.PathLike)):
        raise ConfigError(f"{caller} takes a URL, a local path or a Store, got {type(target).__name__} {target!r}")
    return Store(os.fspath(target), storage_options)


def documented_write_rate(store: Store) -> float | None:
    """The writes per second the provider documents for a new prefix of ``store`` (AWS S3: 3,500;
    Google Cloud Storage: 1,000 per bucket at first); ``None`` for local files and other endpoints
    (MinIO, emulators), whose limits streamio cannot know."""
    return backends.backend_class(store.root_url).documented_write_rate(store._options)


def _pacer(store: Store) -> Pacer | None:
    """This process's write pacer of ``store``'s bucket (none for local files)."""
    return None if store.is_local else pacer_for(store.root_url, store._options)
