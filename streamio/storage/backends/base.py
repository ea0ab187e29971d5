"""The seam between :class:`~streamio.storage.store.Store` and one kind of storage: :class:`Backend`.

A Store is generic (paths below a root, the retry policy, the bucket check, resuming streams);
everything that differs per protocol is a method of its backend, one module each:
:mod:`.local`, :mod:`.memory`, :mod:`.s3`, :mod:`.gcs`, and :mod:`.generic` for any other fsspec
filesystem (and the base class of the four). :func:`streamio.storage.backends.connect` picks the
backend once per process, and it is the only place that compares protocol names.

Every method is ONE attempt (the store's :class:`~streamio.storage.retry.RetryPolicy` decides
retries; the libraries' own retries are configured down to one attempt by ``fs_options`` and
``configure``) and takes full paths (``bucket/prefix/key``, ``/dir/file``), never root-relative
ones. Errors are raised as the client raised them; the policy classifies them.

Call order: ``fs_options(options)`` -> fsspec creates the filesystem -> ``configure(fs)`` ->
``Backend(fs, root, options, policy)``; then any operation, from any thread.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from fsspec.asyn import sync

from streamio.errors import CorruptDataError, ObjectTooLargeError, WriteConflictError
from streamio.storage.deadline import Pace

T = TypeVar("T")

#: suffix of the temp files a local put writes beside its target (never listed)
TMP_SUFFIX = ".streamio-tmp"

WriteMode = Literal["overwrite", "create"]


@dataclass(frozen=True)
class PutRequest:
    """How to write one object (see :meth:`Store.put <streamio.storage.store.Store.put>`).

    Attributes:
        mode: ``"overwrite"`` or ``"create"`` (fail if the object exists).
        if_match: a version token: fail unless the object is at this version now.
        concurrency: parallel parts of a multipart upload.
        part_size: bytes per part of a multipart (S3) or resumable (GCS) upload.
        multipart_threshold: objects this large or larger go up in parts.
        sync_dir: on local disk, fsync the directory after the rename (the name made durable);
            ``False``: the caller's next put into the same directory does it for both.
    """

    mode: WriteMode = "overwrite"
    if_match: str | None = None
    concurrency: int = 8
    part_size: int = 16 << 20
    multipart_threshold: int = 64 << 20
    sync_dir: bool = True


#: ``on_end(absolute_end)``: a stream tells where the body ends once the response says so
OnEnd = Callable[[int], None]


class Backend(Protocol):
    """What a Store needs of one kind of storage.

    Attributes:
        fs: the fsspec filesystem (created for this process).
        root: the full path of the store's root (no trailing slash).
        protocol: the canonical protocol name (``file``, ``memory``, ``s3``, ``gs``, ...).
        bucket: the bucket of the root, on stores that have buckets (else ``None``): a
            not-found there is checked against the bucket itself.
        is_local: objects are files on this machine (memory-mappable; no request latency).
        whole_reads: :meth:`read` fetches a whole range in one request; without it the store
            streams the range with :meth:`open_stream`, resuming where a connection dropped.
        counts_requests: it counts its own requests, every HTTP attempt
            (:mod:`streamio.storage.accounting`); without it the store counts one per call.
        versioned_reads: :meth:`read_versioned` gives an object with the version of the very
            bytes it read, in one request (S3: the GET's ETag; local: ``fstat`` of the file read).
    """

    fs: Any
    root: str
    protocol: str
    bucket: str | None
    is_local: bool
    whole_reads: bool
    counts_requests: bool

    def read(self, full: str, url: str, start: int, end: int | None, limit: int | None = None) -> bytes:
        """Bytes ``[start, end)`` (``end`` None: to the end) in one request, length verified
        (:func:`shorter_than_expected` if the object ends first); more than ``limit`` bytes are
        refused (:func:`too_large`) before they are read. Only if ``whole_reads``."""
        ...

    def read_versioned(
        self, full: str, url: str, start: int = 0, end: int | None = None, limit: int | None = None
    ) -> tuple[bytes, str | None]:
        """:meth:`read`, and the version of the object those bytes were read from, from the same
        request (the token ``info`` and ``put`` give). Only if ``versioned_reads``."""
        ...

    def map(self, full: str) -> bytes | memoryview:
        """A zero-copy read-only view of a whole immutable object. Only if ``is_local``."""
        ...

    def open_stream(self, full: str, start: int, end: int | None, piece: int, on_end: OnEnd) -> Iterator[bytes]:
        """Yield ``[start, end)`` from ONE request as it arrives, in pieces of at most ``piece``
        bytes (the first one as soon as any bytes arrived). May stop early without an error (a
        truncated body): the caller checks the length. Call ``on_end`` once the end is known."""
        ...

    def info(self, full: str) -> tuple[int, str | None]:
        """``(size, version)`` of one object, fresh, in one request where the backend allows it."""
        ...

    def version_of(self, entry: Mapping[str, Any]) -> str | None:
        """The version token of an object from its fsspec listing entry (the same token ``info``
        gives: S3 ETag, GCS generation, local inode-mtime_ns-size, memory content CRC)."""
        ...

    def find(self, full: str) -> Mapping[str, Mapping[str, Any]]:
        """Every entry below ``full`` (recursive, fresh, not from a listing cache), fsspec's
        ``find(detail=True)`` shape; ``{}`` where there is nothing (the store checks the bucket)."""
        ...

    def put(self, full: str, url: str, data: memoryview, request: PutRequest) -> str | None:
        """Write ``data`` atomically as ``request`` says; the new version. A lost condition
        raises :class:`~streamio.errors.WriteConflictError` (see :func:`conflict`)."""
        ...

    def delete(self, full: str) -> None:
        """Delete one object; what is already gone is not an error."""
        ...

    def incomplete_uploads(self, full: str) -> list[tuple[str, str, Any]]:
        """``(full path, upload id, initiated)`` of every upload below ``full`` that was started and
        never completed or aborted: S3 multipart uploads, local temp files (``[]`` where none)."""
        ...

    def abort_upload(self, full: str, upload_id: str) -> None:
        """Abort one upload from :meth:`incomplete_uploads`."""
        ...

    def bucket_exists(self, bucket: str) -> bool:
        """Whether ``bucket`` exists, in one request (``True`` where there are no buckets)."""
        ...


def shorter_than_expected(url: str, ends_at: int, wanted_end: int) -> CorruptDataError:
    """The error for an object that ends before the byte a caller (index, manifest) asked for:
    permanent, never retried, the same words on every backend and read path."""
    return CorruptDataError(
        f"{url} ends at byte {ends_at}, before the requested end {wanted_end}: the object is "
        f"shorter than the caller (index, manifest) expects; re-run `streamio verify` on it"
    )


def too_large(url: str, size: int | None, limit: int) -> ObjectTooLargeError:
    """The error for an object read whole that is larger than its reader accepts (``size`` None:
    found while reading)."""
    what = f"is {size} bytes" if size is not None else "is larger than that"
    return ObjectTooLargeError(
        f"{url} {what}; the most this kind of object may be is {limit} bytes. It was not read whole: "
        f"it is damaged, or not what the caller expected to find there"
    )


def conflict(url: str, if_match: str | None, found: str | None) -> WriteConflictError:
    """The error for a lost create-only (``if_match`` None) or compare-and-swap write."""
    if if_match is not None:
        what = "does not exist" if found is None else f"is at version {found}"
        return WriteConflictError(
            f"compare-and-swap write to {url} lost: expected version {if_match}, but the object {what} "
            f"(another writer changed it); re-read it and decide again"
        )
    return WriteConflictError(
        f"create-only write to {url} lost: the object already exists; read it or pick another name"
    )


def range_header(start: int, end: int | None) -> str | None:
    """The HTTP ``Range`` header for ``[start, end)`` (``None`` for the whole object)."""
    if start == 0 and end is None:
        return None
    return f"bytes={start}-{'' if end is None else end - 1}"


async def gather_piece(read: Callable[[int], Any], n: int, eager: bool) -> bytes:
    """Up to ``n`` bytes from an async ``read``: the first arrival if ``eager``, else reads
    until ``n`` bytes or the end (fewer crossings into fsspec's event loop per byte)."""
    first = await read(n)
    if eager or not first or len(first) >= n:
        return bytes(first)
    parts = [first]
    got = len(first)
    while got < n:
        more = await read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


async def within(seconds: float, awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, cancelled after ``seconds`` (:class:`TimeoutError`).

    ``asyncio.timeout`` where there is one (3.11+): ``wait_for`` wraps the awaitable in a task of
    its own, 24 us more per call than the 14 us of a timeout scope (measured; one call per piece).
    """
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)  # pragma: no cover - Python 3.10


def pump(loop: Any, read: Callable[[int], Any], piece: int, pace: Pace) -> Iterator[bytes]:
    """An async body's ``read`` as pieces of at most ``piece`` bytes, read on fsspec's ``loop``:
    the first piece as soon as any bytes arrived (time to first byte), then gathered pieces. Each
    wait is bounded by what ``pace`` (the body's deadline) still allows.

    Raises:
        BodyStalledError: the body missed its deadline.
    """
    eager = True
    while True:
        began = time.monotonic()
        try:
            data = sync(loop, within, pace.budget(piece), gather_piece(read, piece, eager))
        except (TimeoutError, asyncio.TimeoutError) as exc:
            pace.record(0, time.monotonic() - began)
            raise pace.stalled() from exc
        pace.record(len(data), time.monotonic() - began)
        eager = False
        if not data:
            return
        yield data
