"""Any fsspec filesystem (``http``, ``az``, ``hf``, ...) through fsspec's generic calls only.

Also the base class of the other backends, which override what their store does better or
differently. What the generic calls give:

* streams: ``fs.open`` + ``seek`` + ``read`` (one file object per attempt);
* versions: the listing entry's ``ETag`` / ``etag`` / ``generation``, else ``mtime-size``;
* puts: ``fs.pipe_file`` (create-only through its ``mode="create"``; no compare-and-swap:
  :class:`~streamio.errors.UnsupportedOperationError`), so atomic only as far as the
  filesystem's own single write is;
* no multipart uploads, no buckets.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from streamio.errors import UnsupportedOperationError
from streamio.storage.backends.base import OnEnd, PutRequest
from streamio.storage.failures import has_code
from streamio.storage.retry import RetryPolicy, classify


class GenericBackend:
    """A :class:`~streamio.storage.backends.base.Backend` on fsspec's generic calls (see module doc)."""

    is_local = False
    whole_reads = False
    versioned_reads = False
    #: whether it counts its own requests (every HTTP attempt); else the store counts one per call
    counts_requests = False
    #: what ``fs.find`` needs to raise, not skip, a directory it fails to list (refused, 403)
    find_kwargs: Mapping[str, Any] = {"on_error": "raise"}
    #: writes per second its provider documents for a new prefix (None: unknown)
    writes_per_s: float | None = None
    #: environment variables that point the client at another endpoint than the provider's
    endpoint_env: tuple[str, ...] = ()

    def __init__(self, fs: Any, root: str, protocol: str, *, options: Mapping[str, Any], policy: RetryPolicy) -> None:
        self.fs = fs
        self.root = root
        self.protocol = protocol
        self.policy = policy
        self.bucket: str | None = None

    # ------------------------------------------------------------- making the filesystem
    @classmethod
    def fs_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The storage options fsspec gets (the libraries' own retries configured down)."""
        return dict(options)

    @classmethod
    def configure(cls, fs: Any) -> None:
        """Adjust a freshly made filesystem (its own retry loop set to one attempt)."""

    @classmethod
    def options_for_verified_reads(cls, options: Mapping[str, Any]) -> dict[str, Any] | None:
        """Options for a store whose reads the caller verifies end to end (size and checksum), so
        the client's own body check can be skipped; ``None`` where there is nothing to skip."""
        return None

    @classmethod
    def documented_write_rate(cls, options: Mapping[str, Any]) -> float | None:
        """The writes per second the provider documents for a new prefix of this store (what a
        job's saves are held to by default): :attr:`writes_per_s`, unless ``options`` or the
        environment (:attr:`endpoint_env`) name another endpoint (MinIO, an emulator), whose
        limits are its own; ``None`` where unknown."""
        kwargs = options.get("client_kwargs") or {}
        custom = options.get("endpoint_url") or (isinstance(kwargs, Mapping) and kwargs.get("endpoint_url")) or any(
            os.environ.get(name) for name in cls.endpoint_env)
        return None if custom else cls.writes_per_s

    # ------------------------------------------------------------- reads
    def read(self, full: str, url: str, start: int, end: int | None, limit: int | None = None) -> bytes:
        raise UnsupportedOperationError(f"{url}: {self.protocol}:// has no whole-range reads; stream it")

    def map(self, full: str) -> bytes | memoryview:
        raise UnsupportedOperationError(f"{full}: {self.protocol}:// objects are not files to map")

    def open_stream(self, full: str, start: int, end: int | None, piece: int, on_end: OnEnd) -> Iterator[bytes]:
        with self.fs.open(full, "rb") as f:
            yield from pieces(f, int(self.fs.size(full)), start, end, piece, on_end)

    # ------------------------------------------------------------- metadata
    def info(self, full: str) -> tuple[int, str | None]:
        self.fs.invalidate_cache(full)
        d = self.fs.info(full)
        if d.get("type") == "directory":
            raise FileNotFoundError(full)
        return int(d.get("size") or 0), self.version_of(d)

    def version_of(self, entry: Mapping[str, Any]) -> str | None:
        version = entry.get("ETag") or entry.get("etag") or entry.get("generation")
        if version is None and "mtime" in entry:
            version = f"{entry['mtime']}-{int(entry.get('size') or 0)}"
        return None if version is None else str(version).strip('"')

    def find(self, full: str) -> Mapping[str, Mapping[str, Any]]:
        self.fs.invalidate_cache(full)
        try:
            return self.fs.find(full, detail=True, **self.find_kwargs)  # type: ignore[no-any-return]
        except FileNotFoundError as exc:
            if classify(exc) != "not_found" or has_code(exc, "NoSuchBucket"):
                raise  # a failed connection, or no bucket: the policy maps it
            return {}

    # ------------------------------------------------------------- writes
    def put(self, full: str, url: str, data: memoryview, request: PutRequest) -> str | None:
        if request.if_match is not None:
            raise UnsupportedOperationError(
                f"{url}: compare-and-swap (if_match=) is not supported on {self.protocol}://; write it "
                f"unconditionally or with mode='create', or keep the object on file://, s3:// or gs://"
            )
        self.fs.pipe_file(full, bytes(data), mode=request.mode)
        return self.info(full)[1]

    def delete(self, full: str) -> None:
        try:
            self.fs.rm_file(full)
        except FileNotFoundError:
            pass

    def incomplete_uploads(self, full: str) -> list[tuple[str, str, Any]]:
        return []

    def abort_upload(self, full: str, upload_id: str) -> None:
        raise UnsupportedOperationError(f"{full}: {self.protocol}:// has no multipart uploads to abort")

    def bucket_exists(self, bucket: str) -> bool:
        return True


def pieces(f: Any, size: int, start: int, end: int | None, piece: int, on_end: OnEnd) -> Iterator[bytes]:
    """Bytes ``[start, end)`` of the open file ``f`` of ``size`` bytes, in pieces of at most ``piece``;
    ``on_end`` learns where the range ends (``end`` clipped to the size). A file that ends early ends
    the stream (the caller's length check names it)."""
    end = size if end is None else min(end, size)
    on_end(end)
    f.seek(start)
    pos = start
    while pos < end:
        data = f.read(min(piece, end - pos))
        if not data:
            return
        pos += len(data)
        yield data
