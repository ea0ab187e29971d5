"""Store requests as the store saw them: every attempt counted once, by operation and outcome.

Where attempts are seen: every HTTP attempt of both S3 clients passes through the sessions of
:mod:`.backends.s3_bodies`, every one of gcsfs through an aiohttp ``TraceConfig`` on its session
(:mod:`.backends.gcs`); ``file://`` and ``memory://`` count one request per backend call. Each
reports :func:`attempt` with the operation (:func:`s3_op`, :func:`gcs_op`) and the HTTP status
(``None``: no response, the connection failed). The status gives a first outcome (:func:`outcome`):

* ``ok``: 1xx-3xx; 404 (absence is an answer: the first read of a pointer) and 412 (a refused
  conditional write: the condition was answered, the caller gets ``WriteConflictError``);
* ``throttled``: 503 and 429 (SlowDown);
* ``retried``: other 5xx, 408, or no response (reset, timeout);
* ``failed``: any other 4xx (403, 400): permanent, the request fails at once.

The HTTP layer cannot know whether an attempt is the last of a request that fails, nor whether a
200's body arrives whole (a body cut mid-way is a failed attempt). So an attempt made inside a
retry loop (:meth:`~streamio.storage.retry.RetryPolicy.call`, a stream's
:class:`~streamio.storage.retry.RetryBudget`) is noted in that loop's :class:`Ledger`, reached
through a context variable (fsspec's ``sync`` runs the coroutine in a task whose context is a
copy of the caller's: the ledger object is shared), and counted when the loop settles it:

* the attempt succeeded: every attempt noted as it was;
* it raised and the loop retries (it starts another attempt): its last HTTP attempt becomes
  ``retried`` (``throttled`` stays);
* it raised and the loop gives up: its last HTTP attempt becomes ``failed``, unless the error is
  an answer (not found, a lost condition) that the store gave with an ``ok`` status; an error that
  an inner loop already settled (a multipart part that spent its attempts) is not settled twice.

So a counter never goes down (Prometheus reads a decrease as a restart). Outside any loop (an
abort after a failure, gcsfs's session setup) an attempt is counted at once; so is one made in
:func:`at_once` (the cancel of a GCS resumable upload inside a loop's failing attempt: it is not
the attempt that failed, and GCS answers it with 499, counted ``ok``). The cost is a
dict update per attempt, never per byte: bytes are counted per request or per piece.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from streamio.metrics.catalog import STORE_BYTES_READ, STORE_BYTES_WRITTEN, STORE_REQUESTS, STORE_SECONDS
from streamio.storage.failures import chain

__all__ = [
    "Ledger", "at_once", "attempt", "call_outcome", "counted", "counted_call", "counted_stream", "gcs_op", "outcome",
    "read_bytes", "received", "received_before", "s3_op", "written_bytes",
]

T = TypeVar("T")

OPS = ("get", "put", "head", "list", "delete")
OUTCOMES = ("ok", "throttled", "retried", "failed")

_LEDGER: contextvars.ContextVar[Ledger | None] = contextvars.ContextVar("streamio_store_ledger", default=None)
_SETTLED = "_streamio_settled"  # set on an error whose attempts a retry loop already counted

#: S3 query parameters that make a GET a listing (ListObjects(V2), ListMultipartUploads, ListParts, ...)
_S3_LISTING = frozenset({
    "list-type", "uploads", "uploadId", "versions", "prefix", "delimiter", "marker", "continuation-token",
    "max-keys", "location", "start-after",
})
#: S3 query parameters a PUT of object bytes may carry (PutObject, UploadPart)
_S3_BODY_PUT = frozenset({"partNumber", "uploadId", "x-id"})


def outcome(status: int | None) -> str:
    """The outcome an HTTP status says on its own (see the module docstring)."""
    if status is None or status == 408:
        return "retried"
    if status in (429, 503):
        return "throttled"
    if status < 400 or status in (404, 412):
        return "ok"
    return "retried" if status >= 500 else "failed"


def s3_op(method: str, url: str, *, copy: bool = False) -> tuple[str, bool]:
    """``(op, body_is_object)`` of one S3 request: whether its request body is object bytes.

    ``copy``: the request has an ``x-amz-copy-source`` header (a server-side copy sends no bytes).
    """
    method = method.upper()
    query = {k for k, _ in urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query, keep_blank_values=True)}
    if method == "HEAD":
        return "head", False
    if method == "GET":
        return ("list" if query & _S3_LISTING else "get"), False
    if method == "DELETE":
        return "delete", False
    if method == "POST":
        return ("delete" if "delete" in query else "put"), False
    return "put", method == "PUT" and not copy and query <= _S3_BODY_PUT


def gcs_op(method: str, url: str) -> str:
    """The op of one request of GCS's JSON API (``/storage/v1/b/<bucket>/o/<object>`` and friends)."""
    method = method.upper()
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    path = parts.path.rstrip("/")
    if method == "DELETE" or path.endswith("/batch/storage/v1"):
        return "delete"
    if method in ("POST", "PUT", "PATCH"):
        return "put"
    if method == "HEAD":
        return "head"
    if path.startswith("/download/") or query.get("alt") == "media":
        return "get"
    return "list" if path.endswith("/o") or "/o/" not in path else "head"


class Ledger:
    """The attempts of one retry loop's current attempt, counted when the loop settles it."""

    def __init__(self) -> None:
        self.noted: list[tuple[str, str]] = []
        self.held: tuple[str, str] | None = None  # the last attempt of a failure, until the loop decides

    @contextlib.contextmanager
    def active(self) -> Iterator[Ledger]:
        """Note the attempts made inside this block (in this thread and the tasks it starts) here."""
        token = _LEDGER.set(self)
        try:
            yield self
        finally:
            _LEDGER.reset(token)

    def run(self, fn: Callable[[], T]) -> T:
        """One attempt of a retry loop: ``fn()``, its requests noted here, then settled as far as known
        (the loop runs another attempt only after a failure it retries: the held one was retried)."""
        self.retrying()
        with self.active():
            try:
                out = fn()
            except Exception as exc:
                self.failed(exc)
                raise
        self.succeeded()
        return out

    def succeeded(self) -> None:
        """The loop's attempt returned: count what was noted as it was."""
        self._flush()

    def failed(self, exc: BaseException) -> None:
        """The loop's attempt raised ``exc``: hold its last attempt until :meth:`retrying` or :meth:`gave_up`."""
        if getattr(exc, _SETTLED, False):  # an inner loop counted the failure already
            self._flush()
            return
        last = self.noted.pop() if self.noted else None
        self._flush()
        self.held = last

    def retrying(self) -> None:
        """The loop tries again: the held attempt was ``retried`` (or ``throttled``)."""
        if self.held is not None:
            op, first = self.held
            STORE_REQUESTS.add(1.0, op, "throttled" if first == "throttled" else "retried")
            self.held = None

    def gave_up(self, *raised: BaseException, answer: bool) -> None:
        """The loop raises (``raised``: the error and what it is mapped to): the held attempt was
        ``failed``, or ``ok`` where ``answer`` says the error is the store's answer (not found, a
        lost condition) given with an ok status. ``raised`` are marked settled for outer loops."""
        self._flush()
        if self.held is not None:
            op, first = self.held
            STORE_REQUESTS.add(1.0, op, "ok" if answer and first == "ok" else "failed")
            self.held = None
        for exc in raised:
            with contextlib.suppress(AttributeError, TypeError):  # an exception type without a __dict__
                setattr(exc, _SETTLED, True)

    def close(self) -> None:
        """The loop ends (whatever way): count what is still noted, and a held attempt as ``failed``."""
        self.gave_up(answer=False)

    def _flush(self) -> None:
        noted, self.noted = self.noted, []
        for op, result in noted:
            STORE_REQUESTS.add(1.0, op, result)


@contextlib.contextmanager
def at_once() -> Iterator[None]:
    """Count the attempts made inside this block at once, outside any retry loop's ledger: a
    clean-up after a failure (an upload's abort) is not the failure the loop settles."""
    token = _LEDGER.set(None)
    try:
        yield
    finally:
        _LEDGER.reset(token)


def attempt(op: str, status: int | None, seconds: float | None = None) -> None:
    """Count one attempt of ``op`` that got ``status`` (``None``: no response) after ``seconds``
    (send to response headers; ``None`` when there was no response)."""
    if seconds is not None:
        STORE_SECONDS.observe(seconds, op)
    _note(op, outcome(status))


def _note(op: str, result: str) -> None:
    ledger = _LEDGER.get()
    if ledger is None:
        STORE_REQUESTS.add(1.0, op, result)
    else:
        ledger.noted.append((op, result))


def call_outcome(exc: BaseException | None) -> str:
    """The outcome of one call of a store without HTTP (``file://``, ``memory://``) that raised
    ``exc`` (``None``: it returned): absence and a lost condition are answers, a connection or
    timeout error is retried, anything else failed."""
    if exc is None or isinstance(exc, (FileNotFoundError, FileExistsError)):
        return "ok"
    return "retried" if isinstance(exc, (ConnectionError, TimeoutError)) else "failed"


def counted_call(op: str, fn: Callable[[], T], *, sent: int = 0) -> Callable[[], T]:
    """``fn`` (one call of a store without HTTP) counted as one request of ``op``; what a ``get``
    returns is counted as bytes read, ``sent`` bytes as written once it returned."""

    def call() -> T:
        began = time.monotonic()
        try:
            out = fn()
        except Exception as exc:
            _note(op, call_outcome(exc))
            raise
        STORE_SECONDS.observe(time.monotonic() - began, op)
        _note(op, "ok")
        if op == "get" and isinstance(out, (bytes, bytearray, memoryview)):
            read_bytes(len(out))
        written_bytes(sent)
        return out

    return call


def counted_stream(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """``pieces`` (one streamed read of a store without HTTP) counted as one ``get`` and its bytes."""
    began, result = time.monotonic(), "ok"
    try:
        for piece in pieces:
            read_bytes(len(piece))
            yield piece
    except Exception as exc:
        result = call_outcome(exc)
        raise
    finally:
        STORE_SECONDS.observe(time.monotonic() - began, "get")
        _note("get", result)


def read_bytes(n: int) -> None:
    """``n`` bytes of object bodies arrived (GET responses)."""
    if n:
        STORE_BYTES_READ.add(float(n))


def written_bytes(n: int) -> None:
    """``n`` bytes of object bodies went to the store (PUT and part bodies)."""
    if n:
        STORE_BYTES_WRITTEN.add(float(n))


def counted(read: Callable[[], bytes]) -> bytes:
    """``read()`` (a blocking read of one whole body), its bytes counted: all of them, or those
    received before it raised (:func:`received_before`)."""
    try:
        data = read()
    except Exception as exc:
        read_bytes(received_before(exc))
        raise
    read_bytes(len(data))
    return data


def received(response: Any) -> int:
    """Body bytes an aiohttp response received so far, read by the caller or still buffered
    (``content.total_bytes``); 0 for anything else. Counted when a stream ends, cut or not: aiohttp
    drops what it buffered when a body is cut, but the store sent it."""
    return int(getattr(getattr(response, "content", None), "total_bytes", 0) or 0)


def received_before(exc: BaseException) -> int:
    """Body bytes a blocking read had received when it raised ``exc`` (a cut body: the
    ``IncompleteRead`` of http.client (bytes) or urllib3 (a count) in its chain); else 0."""
    for e in chain(exc):
        partial = getattr(e, "partial", None)
        if isinstance(partial, (bytes, bytearray)):
            return len(partial)
        if isinstance(partial, int) and not isinstance(partial, bool):
            return partial
    return 0
