"""What a storage failure says, read from the exception and its causes, for :mod:`.retry`.

The client stacks under fsspec report the same failure in many shapes: botocore's ``ClientError``
with a code and status, s3fs's ``OSError`` wrapped around it, gcsfs's ``HttpError``, aiohttp's
response and connector errors, and fsspec's HTTP filesystem's bare ``FileNotFoundError`` around
*any* failure. This module reads them: the code and status (:func:`code_of`), whether a connection
was ever made (:func:`unreachable`: refused, name not resolved, connect timeout, wherever it sits
in the chain) and to which endpoint, and whether it is a plain "not found" (:func:`says_not_found`).
It also holds the two messages built from that: :func:`unreachable_error` and :func:`bucket_not_found`.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from collections.abc import Iterator

from streamio.errors import BucketNotFoundError, StorageUnreachableError, TransientStorageError
from streamio.storage.secrets import scrub, strip_userinfo

#: the client never got a connection: the endpoint is wrong, down, unresolvable or firewalled
_UNREACHABLE = {
    "EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError", "NewConnectionError",
    "NameResolutionError", "ClientConnectorError", "ClientConnectorDNSError", "ClientProxyConnectionError",
    "ConnectionTimeoutError",
}


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and its causes (explicit or implicit), outermost first, at most 8."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 8:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def code_of(exc: BaseException) -> tuple[str | None, int | None]:
    """(error code, HTTP status) of a botocore ClientError, gcsfs HttpError or aiohttp response error,
    else (None, None)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and "Error" in response:
        code = response.get("Error", {}).get("Code")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return (str(code) if code is not None else None), status
    name = type(exc).__name__
    code = getattr(exc, "code", None) if name == "HttpError" else None  # aiohttp's .code warns: not read
    if code is not None:
        return str(code), int(code) if str(code).isdigit() else None
    status = getattr(exc, "status", None)  # aiohttp ClientResponseError
    if isinstance(status, int) and name == "ClientResponseError":
        return str(status), status
    return None, None


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` or one of its causes says no connection to the endpoint could be made."""
    for e in chain(exc):
        if isinstance(e, TransientStorageError):
            return isinstance(e, StorageUnreachableError)
        if type(e).__name__ in _UNREACHABLE or isinstance(e, (ConnectionRefusedError, socket.gaierror)):
            return True
    return False


def endpoint_of(exc: BaseException) -> str | None:
    """``scheme://host:port`` (or ``host:port``) the client failed to connect to, if it says."""
    for e in chain(exc):
        kwargs = getattr(e, "kwargs", None)
        if isinstance(kwargs, dict) and isinstance(kwargs.get("endpoint_url"), str):  # botocore
            parts = urllib.parse.urlsplit(kwargs["endpoint_url"])
            return strip_userinfo(f"{parts.scheme}://{parts.netloc}") if parts.netloc else None
        host, port = getattr(e, "host", None), getattr(e, "port", None)  # aiohttp ClientConnectorError
        if isinstance(host, str) and host:
            return f"{host}:{port}" if port else host
    return None


def unreachable_reason(exc: BaseException) -> str:
    """Why no connection was made, in words."""
    for e in chain(exc):
        if isinstance(e, socket.gaierror) or type(e).__name__ in ("ClientConnectorDNSError", "NameResolutionError"):
            return "its host name does not resolve"
        if isinstance(e, ConnectionRefusedError):
            return "the connection was refused"
        if isinstance(e, (TimeoutError, asyncio.TimeoutError)) or "Timeout" in type(e).__name__:
            return "connecting timed out"
    return "no connection could be made"


def has_code(exc: BaseException, code: str) -> bool:
    """Whether ``exc`` or a cause carries the store error code ``code`` (e.g. ``NoSuchBucket``)."""
    return any(code_of(e)[0] == code for e in chain(exc))


def says_not_found(exc: BaseException) -> bool:
    """Whether ``exc`` or a cause is a plain "not found" (404, NoSuchBucket, NotFound, or a
    ``FileNotFoundError`` without a code): what a bucket check reads as "no such bucket"."""
    for e in chain(exc):
        code, status = code_of(e)
        if code in ("404", "NoSuchBucket", "NotFound") or status == 404:
            return True
        if isinstance(e, FileNotFoundError) and code is None:
            return True
    return False


def _host_of(url: str) -> str | None:
    """The host part of a URL: the bucket of ``s3://bucket/...`` and ``gs://bucket/...``."""
    return urllib.parse.urlsplit(url).netloc.rpartition("@")[2] or None


def bucket_not_found(url: str, detail: str, bucket: str | None = None) -> BucketNotFoundError:
    """The one message for a missing bucket (from an error code or from the store's own check)."""
    name = bucket or _host_of(url) or url
    return BucketNotFoundError(
        scrub(
            f"bucket {name!r} does not exist ({url}: {detail}): check the bucket name and that the endpoint, "
            f"account or project are the ones it lives in, or create the bucket first"
        )
    )


def unreachable_error(
    url: str, exc: BaseException, detail: str, *, attempts: int, elapsed: float
) -> StorageUnreachableError:
    """The one message for an endpoint that could not be reached through the retry policy."""
    return StorageUnreachableError(
        scrub(
            f"cannot reach the storage endpoint {endpoint_of(exc) or '(unknown)'} for {url}: {unreachable_reason(exc)} "
            f"({attempts} attempt(s) over {elapsed:.1f} s; last: {detail}); check the endpoint URL (storage option "
            f"endpoint_url, AWS_ENDPOINT_URL...), DNS, proxies and firewalls, and that the server is running"
        )
    )
