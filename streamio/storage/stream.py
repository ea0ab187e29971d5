"""A streaming read that resumes where a connection dropped: the loop behind ``Store.iter_bytes``.

One request's body is yielded as it arrives; when the connection drops or the body ends short,
the read continues with a new request from the last byte received (never from the start), and
it verifies that exactly ``end - start`` bytes arrived. A failure after progress starts a fresh
attempt series (:class:`~streamio.storage.retry.RetryBudget`). An object that ends before the
asked ``end`` is :class:`~streamio.errors.CorruptDataError` at once, never a retry.

The requests are a callable (``open_at(position, end, piece, on_end)``, a backend's
``open_stream`` bound to one object), so the loop is tested without a server. :func:`traced` puts
the wait for each piece in a ``fetch`` span when tracing is on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from streamio.errors import CorruptDataError, TruncatedBodyError
from streamio.metrics import trace
from streamio.storage.backends.base import OnEnd, shorter_than_expected, too_large
from streamio.storage.retry import RetryBudget

log = logging.getLogger(__name__)

#: ``open_at(position, end, piece, on_end)``: one request for ``[position, end)`` (Backend.open_stream)
Opener = Callable[[int, int | None, int, OnEnd], Iterator[bytes]]


class _Bound:
    """Where the body ends: asked for, or learned from the first response."""

    def __init__(self, url: str, end: int | None) -> None:
        self.url = url
        self.end = end

    def learn(self, absolute: int) -> None:
        if self.end is None:
            self.end = absolute
        elif absolute < self.end:
            raise shorter_than_expected(self.url, absolute, self.end)

    def clip(self, data: bytes, pos: int) -> bytes:
        return data[: self.end - pos] if self.end is not None and pos + len(data) > self.end else data


def resuming(
    open_at: Opener, url: str, start: int, end: int | None, *, piece: int, budget: RetryBudget
) -> Iterator[bytes]:
    """Yield bytes ``[start, end)`` (``end`` None: to the end of the object), resuming after failures.

    Args:
        open_at: makes one request (see the module docstring).
        url: the object's URL, for messages.
        start: first byte.
        end: one past the last byte, or None.
        piece: the most bytes of one yielded piece.
        budget: attempt accounting; raises the mapped error when spent.

    Raises:
        CorruptDataError: the object ends before ``end``.
        Whatever ``budget`` maps a non-transient or persistent failure to.
    """
    try:
        yield from _resuming(open_at, url, start, end, piece=piece, budget=budget)
    finally:
        budget.ledger.close()  # the requests still noted are counted (the reader may stop early)


def _resuming(
    open_at: Opener, url: str, start: int, end: int | None, *, piece: int, budget: RetryBudget
) -> Iterator[bytes]:
    bound = _Bound(url, end)
    pos = start
    ledger = budget.ledger
    while bound.end is None or pos < bound.end:
        stream = open_at(pos, bound.end, piece, bound.learn)
        try:
            while True:
                with ledger.active():  # the request is sent on the first next(): noted in the ledger
                    data = next(stream, None)
                if data is None:
                    break
                data = bound.clip(data, pos)
                if data:
                    pos += len(data)
                    budget.progress()
                    yield data
            if bound.end is None:  # a stream that never said its length: it ended, so we are done
                return
            if pos < bound.end:
                raise TruncatedBodyError(f"{url}: body ended at byte {pos}, expected {bound.end}")
        except CorruptDataError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified and re-raised by the budget
            budget.failed(exc, url)
            log.debug("resuming %s at byte %d", url, pos)
        finally:
            stream.close()  # type: ignore[attr-defined]  # also when the consumer stops early: released now


def at_most(pieces: Iterator[bytes], limit: int, url: str) -> bytes:
    """The bytes of ``pieces`` joined, refused (:func:`~.backends.base.too_large`) as soon as they
    pass ``limit``; the stream is closed either way."""
    out = bytearray()
    with contextlib.closing(pieces):  # type: ignore[type-var]
        for piece in pieces:
            out += piece
            if len(out) > limit:
                raise too_large(url, None, limit)
    return bytes(out)


def traced(pieces: Iterator[bytes], url: str) -> Iterator[bytes]:
    """``pieces``, with the wait for each one in a ``fetch`` span of the trace when tracing is on
    (:mod:`streamio.metrics.trace`); the consumer's time between pieces is not in a span."""
    return _spanned(pieces, url) if trace.enabled() else pieces


def _spanned(pieces: Iterator[bytes], url: str) -> Iterator[bytes]:
    while True:
        with trace.span("fetch", url=url):
            piece = next(pieces, None)
        if piece is None:
            return
        yield piece
