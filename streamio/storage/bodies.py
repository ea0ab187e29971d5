"""Response bodies read whole, within limits: an error answer is cut, a document refused.

HTTP clients read every body that is not a streamed object whole before anything looks at it: an
error answer (any status >= 300) and every document answer (a listing, an upload's result). A
broken or hostile endpoint answering a 500 with a 256 MiB body cost more than 9 GB of memory that
way (1.6-2.5 GB once scrubbing its text was made linear). :func:`bounded` (and
:func:`bounded_async`) read such a body in chunks:

* an **error body** keeps its first :data:`ERROR_BODY_LIMIT` bytes (S3's and GCS's error
  documents are well under 1 KiB) and the connection is closed rather than drained; a cut document
  fails the client's parse, and the clients then report the HTTP status as the error, so the
  retry policy still sorts it by status (5xx retried, 403 refused, ...);
* a **document body** over :data:`DOCUMENT_BODY_LIMIT` fails as a
  :class:`~streamio.errors.StorageError` naming the limit.

Streamed object bodies are bounded by their readers (sizes from the index or manifest,
:mod:`streamio.storage.deadline` for time). The clients are plugged in per backend
(:mod:`streamio.storage.backends.s3_bodies`, and the GCS backend's stream requests).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator

from streamio.errors import StorageError
from streamio.storage.secrets import scrub

log = logging.getLogger(__name__)

#: bytes of an error answer that are kept (S3's XML error documents are well under 1 KiB)
ERROR_BODY_LIMIT = 64 << 10
#: the most a document answer may be (an S3 listing page of 1,000 keys of 1,024 bytes is ~1.5 MB)
DOCUMENT_BODY_LIMIT = 64 << 20
#: the chunk size to read such a body in
CHUNK = 64 << 10


def body_limit(status: int, streamed: bool) -> int | None:
    """The byte limit of a body read whole: errors and documents; ``None`` for a streamed object."""
    if status >= 300:
        return ERROR_BODY_LIMIT
    return None if streamed else DOCUMENT_BODY_LIMIT


class _Bounded:
    """Collects a body's chunks up to ``limit``: an error body is cut there, a document refused."""

    def __init__(self, limit: int, status: int, url: str) -> None:
        self.limit, self.status, self.url = limit, status, url
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> bool:
        """Keep ``chunk``; whether the body is over its limit (the caller stops reading and closes)."""
        self.size += len(chunk)
        if self.size <= self.limit:
            self.parts.append(chunk)
            return False
        if self.status < 300:
            raise StorageError(
                f"{scrub(self.url)}: the store's {self.status} answer is over {self.limit} bytes, more than "
                f"any document of the store's API (a listing, an upload's result) holds; the endpoint misbehaves"
            )
        self.parts.append(chunk[: len(chunk) - (self.size - self.limit)])
        log.debug("%s: HTTP %d error body cut at %d bytes", scrub(self.url), self.status, self.limit)
        return True

    def body(self) -> bytes:
        return b"".join(self.parts)


def bounded(chunks: Iterator[bytes], limit: int, status: int, url: str, close: Callable[[], object]) -> bytes:
    """The body from ``chunks``, within ``limit`` (see the module docstring); ``close`` drops the
    connection of a body left unread."""
    out = _Bounded(limit, status, url)
    try:
        for chunk in chunks:
            if out.add(chunk):
                close()
                break
    except BaseException:
        close()
        raise
    return out.body()


async def bounded_async(
    chunks: AsyncIterator[bytes], limit: int, status: int, url: str, close: Callable[[], object]
) -> bytes:
    """:func:`bounded` for an asynchronous body."""
    out = _Bounded(limit, status, url)
    try:
        async for chunk in chunks:
            if out.add(chunk):
                close()
                break
    except BaseException:
        close()
        raise
    return out.body()
