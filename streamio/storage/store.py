"""``Store``: one root URL on any fsspec filesystem, the only way streamio moves bytes.

A ``Store`` is ``(url, storage_options, retry policy)`` and nothing live: the fsspec filesystem
is created lazily, once per process (s3fs objects are not fork-safe and hold credentials), so a
``Store`` pickles into DataLoader workers and spawned processes as its three fields — with every
secret replaced by an opaque reference into this process's memory. Every option value is a
secret unless its key is on a short allow-list of non-secret settings, and so is the userinfo
of the URL (``http://user:pass@host``): see :mod:`~streamio.storage.redact`. A forked child (the
DataLoader default on Linux) resolves the references; a spawned process or another machine
cannot, and gets a clear error at first use: give it credentials the way the library takes them
from its environment (``AWS_ACCESS_KEY_ID``..., ``GOOGLE_APPLICATION_CREDENTIALS``) or build the
Store there. streamio never writes a secret into a pickle, a log, a repr or an error message:
``root_url``, ``url()`` and every message show the URL with its userinfo replaced by ``***``.

Paths given to the methods are relative to the root (``store.read("index.json")``) and use
``/``; ``store.url(path)`` gives the full URL for messages. Every operation is retried by the
store's :class:`~streamio.storage.retry.RetryPolicy` on transient errors (the libraries' own
retries are configured down to one attempt, so attempts never multiply) and maps permanent ones
to :mod:`streamio.errors` classes naming the URL, at once.

"Nothing there" is only said of a root that is there: an unknown protocol fails when the Store
is made (:class:`~streamio.errors.UnsupportedProtocolError`); an endpoint that cannot be reached
raises :class:`~streamio.errors.StorageUnreachableError` (never "not found", never an empty
listing); and on S3 and GCS a read, ``info``/``exists`` or write that finds nothing, and a listing
that comes back empty, are checked against the bucket itself (once per Store, see
:mod:`~streamio.storage.roots`): a missing bucket raises :class:`~streamio.errors.BucketNotFoundError`.

Reads: ``read`` joins ``iter_bytes``. ``iter_bytes`` is one streaming GET whose
body is yielded as it arrives; when the connection drops or the body ends short, it continues
with a ranged GET from the last byte received (never from the start), and it verifies that
exactly ``end - start`` bytes arrived. A failure after progress starts a fresh attempt series.

Corruption: a flipped byte inside a body is NOT detected here (s3fs/gcsfs return wrong bytes
with no error on ranged reads; botocore checks a stored full-object checksum only on some whole
GETs). Callers verify bytes with :mod:`streamio.checksum` against the index / manifest.

Call order for writers: ``put`` (one atomic PUT or completed multipart; ``mode="create"`` or
``if_match=`` make it conditional) — there is no rename and no multi-object transaction; a commit
is the last single PUT of a pointer object. Per-backend guarantees: see
:mod:`streamio.storage.backends`. A conditional put whose first attempt succeeded on the server
but whose answer was lost is retried and then reports a conflict: callers that see
``WriteConflictError`` re-read the object (it may be their own write).
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from streamio.errors import CorruptDataError, ObjectNotFoundError, StoragePermissionError
from streamio.storage import backends, redact, roots, s3sync
from streamio.storage.failures import has_code
from streamio.storage.redact import SecretRef
from streamio.storage.retry import RetryPolicy, TruncatedBodyError, classify

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)

WriteMode = Literal["overwrite", "create"]

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
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
    ) -> None:
        real = url.rstrip("/") if url not in ("/",) else url
        self._url = redact.strip_userinfo(real)  # what is shown; the real one only reaches fsspec
        self._real_url: str | SecretRef = real
        roots.check_protocol(real, self._url)
        redact.guard_library_logs()
        self._options = dict(storage_options or {})
        self._sealed = redact.seal(self._options)  # now: its secrets are known to redact.scrub
        if self._url != real:
            redact.seal_value(real)
        self.retry = retry or RetryPolicy()
        self._fs: Any = None
        self._root: str = ""
        self._proto: str = ""
        self._pid = -1
        self._lock = threading.Lock()
        self._buckets = roots.BucketCheck()  # shared with child stores

    # pickling: the three fields with secrets replaced by references, never the live filesystem
    def __reduce__(self) -> tuple[Any, ...]:
        real = None if self._real_url == self._url else redact.seal_value(self._real_url)
        return (_rebuild_store, (self._url, real, self._sealed, self.retry))

    def __repr__(self) -> str:
        # never the storage options, never the URL's userinfo: they may hold credentials
        return f"Store({self._url!r})"

    @property
    def root_url(self) -> str:
        """The root URL this store was made with (no trailing slash; userinfo shown as ``***``)."""
        return self._url

    @property
    def protocol(self) -> str:
        """``s3``, ``gs``, ``file``, ``memory``, ... (creates the filesystem on first use)."""
        self.fs  # noqa: B018
        return self._proto

    @property
    def fs(self) -> Any:
        """The fsspec filesystem for this process, created on first use (inner retries off)."""
        if self._fs is None or self._pid != os.getpid():
            with self._lock:
                if self._fs is None or self._pid != os.getpid():
                    missing = redact.missing(self._options)
                    if isinstance(self._real_url, SecretRef):
                        missing.insert(0, "the URL's user:password@")
                    if missing:
                        raise StoragePermissionError(
                            f"the Store for {self._url} was unpickled in a process that does not hold its "
                            f"secrets ({', '.join(missing)}): streamio never pickles secrets. Give this "
                            f"process credentials through its environment or create the Store in it"
                        )
                    try:
                        fs, root = backends.make_fs(str(self._real_url), self._options)
                    except ImportError as exc:
                        raise roots.missing_package(self._url, exc) from exc
                    redact.guard_library_logs()  # the loggers of the modules it just imported
                    self._fs, self._root, self._proto = fs, root, backends.protocol_of(fs)
                    self._pid = os.getpid()
        return self._fs

    def url(self, path: str = "") -> str:
        """The full URL of ``path`` (for messages and for other tools)."""
        return f"{self._url}/{path}" if path else self._url

    def child(self, path: str) -> Store:
        """A store rooted at ``path`` below this one, with the same options and policy."""
        real = self._real_url
        out = Store(f"{real}/{path}" if isinstance(real, str) else self.url(path), self._options, retry=self.retry)
        if not isinstance(real, str):
            out._real_url = real  # unresolved here (unpickled elsewhere): the child is as unusable
        out._buckets = self._buckets
        return out

    def _call(self, fn: Callable[[], T], url: str) -> T:
        """``fn`` under the retry policy; a not-found is checked against the bucket (see module doc)."""
        try:
            return self.retry.call(fn, url)
        except ObjectNotFoundError as exc:
            self._buckets.ensure(self, url, exc)
            raise

    def _full(self, path: str) -> str:
        self.fs  # noqa: B018 - resolves the root
        return posixpath.join(self._root, path) if path else self._root

    # ---------------------------------------------------------------- reads
    def read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (whole object by default).

        One GET (a whole-object read without ``start`` needs no HEAD first), length verified. A
        connection dropped mid-body is retried under the policy: on S3 the read runs in the
        calling thread and starts the range again (:mod:`~streamio.storage.s3sync`: parallel
        reads scale past s3fs's event loop); elsewhere it resumes like :meth:`iter_bytes`. For
        objects too large to hold, stream them with :meth:`iter_bytes`.

        Raises:
            ObjectNotFoundError: no such object or bucket (one attempt).
            StoragePermissionError: access refused (one attempt).
            TransientStorageError: transient errors outlasted the policy.
        """
        if start is not None and end is not None and end <= start:
            return b""
        if self.protocol == "file":  # one read(2) into the result: no 1 MiB pieces to join (restore speed)
            full = self._full(path)
            return self.retry.call(lambda: backends.read_local(full, self.url(path), start or 0, end), self.url(path))
        if self.protocol == "s3" and "session" not in self._options:  # in this thread, not on s3fs's loop (s3sync)
            full, url = self._full(path), self.url(path)
            return self._call(lambda: s3sync.read(self.fs, full, start or 0, end, url), url)
        return b"".join(self.iter_bytes(path, start or 0, end, chunk_size=1 << 20))

    def read_view(self, path: str) -> bytes | memoryview:
        """The whole of an object that is never rewritten in place, for reading once.

        On local disk a read-only memory map (no copy into fresh memory: a checkpoint restore
        verifies and copies parts straight from the page cache); elsewhere :meth:`read`.
        """
        if self.protocol != "file":
            return self.read(path)
        full, url = self._full(path), self.url(path)
        return self.retry.call(lambda: backends.map_local(full), url)

    def iter_bytes(
        self, path: str, start: int = 0, end: int | None = None, *, chunk_size: int = 8 << 20
    ) -> Iterator[bytes]:
        """Stream ``[start, end)`` of ``path`` as it arrives, resuming where a connection dropped.

        Pieces are at most ``min(chunk_size, 1 MiB)`` bytes; the first one is handed over as
        soon as any bytes arrived. A reset or a short body continues with a ranged GET from the
        last byte received. The total length is verified.

        Args:
            path: object path below the root.
            start: first byte.
            end: one past the last byte (None: to the end of the object).
            chunk_size: upper bound of one piece.

        Raises:
            ObjectNotFoundError, BucketNotFoundError, StoragePermissionError: at once.
            TransientStorageError: no progress within the retry policy.
        """
        try:
            yield from self._stream(path, start, end, chunk_size)
        except ObjectNotFoundError as exc:
            self._buckets.ensure(self, self.url(path), exc)
            raise

    def _stream(self, path: str, start: int, end: int | None, chunk_size: int) -> Iterator[bytes]:
        url = self.url(path)
        piece = max(1, min(chunk_size, 1 << 20))
        budget = self.retry.budget()
        if end is None and start > 0:
            end = self.info(path).size
        if end is not None and end <= start:
            return
        pos = start
        bound: list[int | None] = [end]

        def on_end(absolute: int) -> None:
            if bound[0] is None:
                bound[0] = absolute
            elif absolute < bound[0]:
                raise backends.shorter_than_expected(url, absolute, bound[0])

        while bound[0] is None or pos < bound[0]:
            stream = backends.open_stream(self.fs, self._full(path), pos, bound[0], piece, on_end)
            try:
                for data in stream:
                    limit = bound[0]
                    if limit is not None and pos + len(data) > limit:
                        data = data[: limit - pos]
                    if not data:
                        continue
                    pos += len(data)
                    budget.progress()
                    yield data
                if bound[0] is None:  # a stream that never said its length: it ended, so we are done
                    return
                if pos < bound[0]:
                    raise TruncatedBodyError(f"{url}: body ended at byte {pos}, expected {bound[0]}")
            except CorruptDataError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified and re-raised by the budget
                budget.failed(exc, url)
                log.debug("resuming %s at byte %d", url, pos)
            finally:
                stream.close()  # also when the consumer stops early: the connection is released now

    def info(self, path: str) -> ObjectInfo:
        """Size and version of ``path``, read fresh (never from a cached listing), in one request."""

        def op() -> ObjectInfo:
            size, version = backends.info_object(self.fs, self._full(path))
            return ObjectInfo(path=path, size=size, version=version)

        return self._call(op, self.url(path))

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

        def op() -> list[ObjectInfo]:
            full = self._full(prefix)
            self.fs.invalidate_cache(full)
            # fsspec's generic walk omits directories it fails to list (refused, 403) unless told
            kw = {} if self._proto in ("s3", "gs") else {"on_error": "raise"}
            try:
                found = self.fs.find(full, detail=True, **kw)
            except FileNotFoundError as exc:
                if classify(exc) != "not_found" or has_code(exc, "NoSuchBucket"):
                    raise  # a failed connection, or no bucket: the policy maps it
                return []
            base = self._root + "/" if self._root else ""
            out = []
            for name, d in found.items():
                if name.endswith(backends.TMP_SUFFIX) or d.get("type") == "directory":
                    continue
                out.append(self._to_info(d, name[len(base) :] if name.startswith(base) else name))
            return sorted(out, key=lambda o: o.path)

        found = self._call(op, self.url(prefix))
        if not found:
            self._buckets.ensure(self, self.url(prefix))
        return found

    def _to_info(self, d: Mapping[str, Any], path: str) -> ObjectInfo:
        proto = self._proto
        size = int(d.get("size") or 0)
        if proto == "file":
            version: Any = backends.local_version(d["name"])
        elif proto == "memory":
            version = backends.memory_version(self.fs.cat_file(d["name"]))
        elif proto == "gs":
            version = d.get("generation")
        else:
            version = d.get("ETag") or d.get("etag") or d.get("generation")
            if version is None and "mtime" in d:
                version = f"{d['mtime']}-{size}"
        return ObjectInfo(path=path, size=size, version=None if version is None else str(version).strip('"'))

    # ---------------------------------------------------------------- writes
    def put(
        self,
        path: str,
        data: bytes | bytearray | memoryview,
        *,
        mode: WriteMode = "overwrite",
        if_match: str | None = None,
        concurrency: int = 8,
    ) -> str | None:
        """Write ``data`` to ``path`` in one atomic step and return the new version token.

        Args:
            path: object path below the root.
            data: the whole content (large objects go up in parallel parts where supported).
            mode: ``"overwrite"`` or ``"create"`` (fail if the object exists).
            if_match: a version from ``info``/``put``: fail if the object changed since.
            concurrency: parallel parts for a multipart upload.

        Raises:
            WriteConflictError: the create-only or compare-and-swap condition failed.
            StoragePermissionError, ObjectNotFoundError: at once (e.g. no bucket).
            TransientStorageError: transient errors outlasted the policy.
        """
        if mode not in ("overwrite", "create"):
            raise ValueError(f"put mode must be 'overwrite' or 'create', got {mode!r}")
        if mode == "create" and if_match is not None:
            raise ValueError("put takes mode='create' or if_match=, not both")
        full = self._full(path)
        url = self.url(path)
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
        proto = self.protocol

        def op() -> str | None:
            if proto == "file":
                return backends.put_local(full, url, view, mode, if_match)
            if proto == "memory":
                return backends.put_memory(self.fs, full, url, bytes(view), mode, if_match)
            if proto == "s3":
                return backends.put_s3(
                    self.fs, full, url, view, mode, if_match, policy=self.retry,
                    part_size=PART_SIZE, multipart_threshold=MULTIPART_THRESHOLD, concurrency=concurrency,
                )
            if proto == "gs":
                return backends.put_gcs(
                    self.fs, full, url, view, mode, if_match, resumable_threshold=MULTIPART_THRESHOLD, chunk=PART_SIZE
                )
            if if_match is not None:
                raise NotImplementedError(f"{url}: compare-and-swap is not supported on {proto}://")
            self.fs.pipe_file(full, bytes(view), mode=mode)
            return backends.info_object(self.fs, full)[1]

        return self._call(op, url)

    def delete(self, path: str) -> None:
        """Delete ``path``; deleting what is already gone is not an error."""

        def op() -> None:
            try:
                self.fs.rm_file(self._full(path))
            except FileNotFoundError:
                pass

        self.retry.call(op, self.url(path))

    def incomplete_uploads(self, prefix: str = "") -> list[IncompleteUpload]:
        """Multipart uploads under ``prefix`` that were started and never completed or aborted.

        A killed writer leaves them behind, invisible to listings and billed on S3 (the
        ``AbortIncompleteMultipartUpload`` lifecycle rule also removes them). Only S3 has them;
        other backends return ``[]``.
        """
        if self.protocol not in ("s3", "s3a"):
            return []
        full = self._full(prefix)
        root_key = self._root_key("")
        base = root_key + "/" if root_key else ""
        found = self._call(lambda: backends.incomplete_uploads_s3(self.fs, full), self.url(prefix))
        return [IncompleteUpload(key[len(base) :] if key.startswith(base) else key, upload_id, initiated) for key, upload_id, initiated in found]

    def abort_upload(self, upload: IncompleteUpload) -> None:
        """Abort one upload from :meth:`incomplete_uploads` (its parts are deleted)."""
        self.retry.call(lambda: backends.abort_upload_s3(self.fs, self._full(""), self._root_key(upload.path), upload.upload_id), self.url(upload.path))

    def _root_key(self, path: str) -> str:
        """The object key of ``path`` inside its bucket."""
        return self._full(path).partition("/")[2].rstrip("/")

    def put_many(self, items: Iterable[tuple[str, bytes]], *, concurrency: int = 8) -> None:
        """Upload many objects in parallel, at most ``concurrency`` at a time.

        The first error (naming its URL) is raised after the uploads in flight finish; the
        ones not started yet are cancelled. Memory: the caller's items plus nothing per thread.
        """
        self._parallel([(lambda p=p, d=d: self.put(p, d)) for p, d in items], concurrency)

    def read_many(self, paths: Iterable[str], *, concurrency: int = 8) -> list[bytes]:
        """Download many objects in parallel; results in the order of ``paths``."""
        return self._parallel([(lambda p=p: self.read(p)) for p in paths], concurrency)

    def _parallel(self, jobs: list[Callable[[], Any]], concurrency: int) -> list[Any]:
        if not jobs:
            return []
        self.fs  # noqa: B018 - create the filesystem once, before the threads
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs)))) as pool:
            return gather(pool, lambda job: job(), jobs)


def gather(pool: Executor, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]`` run on ``pool``, in order; the first error is raised as soon as
    it happens, the jobs not yet started are cancelled (running ones finish)."""
    futures: list[Future[R]] = [pool.submit(fn, x) for x in items]
    _, pending = wait(futures, return_when=FIRST_EXCEPTION)
    for f in futures:
        if f.done() and f.exception() is not None:
            for p in pending:
                p.cancel()
            raise f.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def _rebuild_store(url: str, real: SecretRef | None, options: dict[str, Any], retry: RetryPolicy) -> Store:
    store = Store(url, redact.unseal(options), retry=retry)
    if real is not None:
        store._real_url = redact.unseal(real)  # a str where this process holds it, else still a ref
    return store
