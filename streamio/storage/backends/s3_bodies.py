"""Both S3 clients read error and document bodies within limits (:mod:`streamio.storage.bodies`).

botocore and aiobotocore read every body that is not a streamed object whole: an error answer
(any status >= 300, also of a ``GetObject``) and every document answer (listings,
``CompleteMultipartUpload``, ...). Their HTTP sessions here read those through
:func:`~streamio.storage.bodies.bounded` instead; a streamed ``GetObject`` body is untouched.

How they are plugged in: aiobotocore (s3fs) takes the session class as a documented option,
``AioConfig(http_session_cls=...)`` (:class:`BoundedAioSession`, unless the caller chose their own);
botocore's synchronous client has no such option, so :func:`bound_client` wraps the session of
its endpoint (``client._endpoint.http_session``), checked by a test against the pinned botocore.

Both sessions also count every HTTP attempt they send (:mod:`streamio.storage.accounting`): its
operation and status, the seconds to its response headers, and the object bytes of a PutObject or
UploadPart body (``x-amz-decoded-content-length`` where the body goes ``aws-chunked`` with a
checksum trailer: the object's bytes, not the framing). Bytes of object bodies received are
counted where they are read (:mod:`.s3`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiobotocore.awsrequest import AioAWSResponse
from aiobotocore.httpsession import AIOHTTPSession
from botocore.awsrequest import AWSResponse

from streamio.storage import accounting
from streamio.storage.bodies import CHUNK, DOCUMENT_BODY_LIMIT, body_limit, bounded, bounded_async

log = logging.getLogger(__name__)


def _sent(request: Any) -> tuple[str, int]:
    """The op of ``request`` (botocore's ``AWSPreparedRequest``) and the object bytes its body carries."""
    headers = request.headers
    op, is_object = accounting.s3_op(request.method, request.url, copy="x-amz-copy-source" in headers)
    if not is_object:
        return op, 0
    length = headers.get("x-amz-decoded-content-length") or headers.get("Content-Length")
    if length is not None:
        return op, int(length)
    body = request.body
    return op, len(body) if isinstance(body, (bytes, bytearray, memoryview)) else 0


def _counted_failure(op: str) -> None:
    """An attempt that got no response (reset, timeout, refused)."""
    accounting.attempt(op, None)


def _counted(op: str, nbytes: int, status: int, started: float) -> None:
    accounting.attempt(op, status, time.monotonic() - started)
    accounting.written_bytes(nbytes)

# ----------------------------------------------------------------- botocore (the synchronous client)
class _BoundedResponse(AWSResponse):
    """An ``AWSResponse`` whose ``content`` is read within :attr:`limit`."""

    limit = DOCUMENT_BODY_LIMIT

    @property
    def content(self) -> bytes:
        if self._content is None:
            raw = self.raw
            self._content = bounded(raw.stream(CHUNK), self.limit, self.status_code, self.url, raw.close)
        return self._content  # type: ignore[no-any-return]


class BoundedSession:
    """botocore's HTTP session with bodies read within limits (wraps the client's own session)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def send(self, request: Any) -> Any:
        streamed = request.stream_output
        request.stream_output = True  # the inner session would read a body whole before returning
        op, nbytes = _sent(request)
        started = time.monotonic()
        try:
            response = self._inner.send(request)
        except BaseException:  # no response: reset, timeout, refused, or cancelled by a deadline
            _counted_failure(op)
            raise
        finally:
            request.stream_output = streamed
        _counted(op, nbytes, response.status_code, started)
        limit = body_limit(response.status_code, streamed)
        if limit is None:
            return response
        out = _BoundedResponse(response.url, response.status_code, response.headers, response.raw)
        out.limit = limit
        if not streamed:
            out.content  # noqa: B018 - read now, as the inner session would have: the connection is released
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def bound_client(client: Any) -> Any:
    """``client`` (a botocore client) with its bodies read within limits; unchanged, with a log
    line, if botocore no longer has the attribute this relies on."""
    endpoint = getattr(client, "_endpoint", None)
    session = getattr(endpoint, "http_session", None)
    if session is None or not callable(getattr(session, "send", None)):
        log.warning("botocore's client has no _endpoint.http_session: S3 error bodies are read unbounded")
        return client
    if not isinstance(session, BoundedSession):
        endpoint.http_session = BoundedSession(session)
    return client


# ----------------------------------------------------------------- aiobotocore (s3fs)
class _BoundedAioResponse(AioAWSResponse):
    """An ``AioAWSResponse`` whose ``content`` is read within :attr:`limit`."""

    limit = DOCUMENT_BODY_LIMIT

    async def _content_prop(self) -> bytes:
        if self._content is None:
            raw = self.raw
            self._content = await bounded_async(
                raw.content.iter_chunked(CHUNK), self.limit, self.status_code, self.url, raw.close
            )
            raw.release()
        return self._content  # type: ignore[no-any-return]


class BoundedAioSession(AIOHTTPSession):  # type: ignore[misc]
    """aiobotocore's aiohttp session with bodies read within limits (``AioConfig(http_session_cls=)``).

    aiohttp sends an idempotent request (GET, PUT, HEAD, DELETE) a second time, inside one
    ``request()`` call, when the connection drops before the response (``ServerDisconnectedError``,
    ``ClientOSError``): an attempt that :meth:`send` would not see, so not count, and a retry outside
    :class:`~streamio.storage.retry.RetryPolicy` (the one retry loop, as botocore's and s3fs's are
    set to one attempt). Its sessions here do not: the drop reaches :meth:`send`, is counted
    ``retried``, and the policy retries it.
    """

    async def _get_session(self, proxy_url: Any) -> Any:
        session = await super()._get_session(proxy_url)
        session._retry_connection = False  # aiohttp's switch for that second send (a test pins it)
        return session

    async def send(self, request: Any) -> Any:
        streamed = request.stream_output
        request.stream_output = True
        op, nbytes = _sent(request)
        started = time.monotonic()
        try:
            response = await super().send(request)
        except BaseException:  # no response: reset, timeout, refused, or cancelled by a deadline
            _counted_failure(op)
            raise
        finally:
            request.stream_output = streamed
        _counted(op, nbytes, response.status_code, started)
        limit = body_limit(response.status_code, streamed)
        if limit is None:
            return response
        out = _BoundedAioResponse(response.url, response.status_code, response.headers, response.raw)
        out.limit = limit
        if not streamed:
            await out.content
        return out
