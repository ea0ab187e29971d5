"""Retry policy and error classification for storage calls, on tenacity.

One place decides retries. The layers underneath retry too (s3fs 5 times, botocore up to 5
attempts, gcsfs 6 times; with defaults one persistent 503 costs 25 attempts and ~34 s), so the
store configures them down to a single attempt each (see ``streamio.storage.backends``) and this
policy alone decides: exponential backoff with full jitter, bounded in attempts and total time.

Classification (:func:`classify`) walks the exception and its causes (s3fs wraps botocore's
``ClientError`` in ``OSError``s, gcsfs raises its own ``HttpError``) and sorts it into:

* ``"not_found"``  NoSuchKey / 404                            -> ObjectNotFoundError, one attempt
                   NoSuchBucket                                -> BucketNotFoundError, one attempt
* ``"permission"`` 403 / AccessDenied / InvalidAccessKeyId /
  SignatureDoesNotMatch / expired or missing credentials      -> StoragePermissionError, one attempt
* ``"conflict"``   412 PreconditionFailed / 409 conflict       -> WriteConflictError, one attempt
* ``"transient"``  5xx, SlowDown / 429 / throttling, timeouts,
  connection resets, truncated bodies                         -> retried, then TransientStorageError
                   connection refused, name not resolved, connect
                   timeout (anywhere in the chain)              -> retried, then StorageUnreachableError
* ``"permanent"``  anything else (bad request, bugs)           -> raised at once, unchanged

Every raised error is a :mod:`streamio.errors` class whose message names the URL and what to check.

Endpoints that cannot be reached are retried like any transient error (a refused connection or
a failed name lookup is often a server restarting, a fail-over or a pod whose DNS entry is not
there yet; the policy bounds the cost: ~5 s with the defaults), then raised as
:class:`~streamio.errors.StorageUnreachableError` naming the endpoint. A connect failure wins
over the error wrapped around it: fsspec's HTTP filesystem turns one into ``FileNotFoundError``,
and "connection refused" must never read as "no such object".

Messages never carry a secret: third-party text quoted in them goes through
:func:`~streamio.storage.secrets.scrub`, and a cause chain whose text would show one is cut.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import tenacity

from streamio.errors import (
    BodyStalledError,
    BucketNotFoundError,
    ConfigError,
    ObjectNotFoundError,
    StorageError,
    StoragePermissionError,
    TransientStorageError,
    WriteConflictError,
)
from streamio.storage.accounting import Ledger
from streamio.storage.deadline import BodyDeadline
from streamio.storage.failures import (
    bucket_not_found,
    chain,
    code_of,
    has_code,
    unreachable,
    unreachable_error,
)
from streamio.storage.pacing import Pacer
from streamio.storage.secrets import leaks, scrub

log = logging.getLogger(__name__)

T = TypeVar("T")
ErrorKind = Literal["not_found", "permission", "conflict", "transient", "permanent"]

_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchUpload", "404"}
_PERMISSION_CODES = {
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "ExpiredToken",
    "InvalidToken", "TokenRefreshRequired", "AccountProblem", "InvalidSecurity", "Forbidden", "403", "401",
    "UnauthorizedOperation", "InvalidClientTokenId", "MissingSecurityHeader",
}
_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_TRANSIENT_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestThrottled", "TooManyRequests",
    "TooManyRequestsException", "RequestLimitExceeded", "RequestTimeout", "RequestTimeoutException",
    "InternalError", "ServiceUnavailable", "BandwidthLimitExceeded", "IncompleteBody",
    "500", "502", "503", "504", "429", "408",
}
_TRANSIENT_BOTOCORE = {
    "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError",
    "IncompleteReadError", "ResponseStreamingError", "HTTPClientError", "ProxyConnectionError",
    "ConnectionError", "ResponseParserError", "FSTimeoutError",
    "FlexibleChecksumError",  # the body failed the checksum the store recorded: bytes damaged in transit
}
_PERMISSION_BOTOCORE = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
_TRANSIENT_AIOHTTP = {
    "ClientPayloadError", "ServerDisconnectedError", "ClientConnectionError", "ClientOSError",
    "ServerTimeoutError", "ClientConnectorError", "ContentLengthError", "TransferEncodingError",
    "ConnectionTimeoutError", "SocketTimeoutError", "ProxyError", "ChunkedEncodingError", "ReadTimeout",
}


def _cause(exc: BaseException) -> BaseException | None:
    """``exc`` as the cause to chain, or ``None`` when its text (or a cause's) would show a secret:
    a traceback prints the whole chain, and third-party messages quote URLs with userinfo."""
    return None if any(leaks(f"{e!r} {e}") for e in chain(exc)) else exc


def _by_code(exc: BaseException) -> ErrorKind | None:
    """The kind an error code or HTTP status says, or ``None`` if ``exc`` carries neither."""
    code, status = code_of(exc)
    if code is None and status is None:
        return None
    for value in (code, str(status) if status else None):
        if value in _NOT_FOUND_CODES:
            return "not_found"
        if value in _PERMISSION_CODES:
            return "permission"
        if value in _CONFLICT_CODES:
            return "conflict"
        if value in _TRANSIENT_CODES:
            return "transient"
    if status is not None and status >= 500:
        return "transient"
    return "permanent"


#: ours (an inner policy or a backend already decided), then builtin types, in this order
_OURS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], ErrorKind], ...] = (
    (WriteConflictError, "conflict"),
    ((ObjectNotFoundError, BucketNotFoundError), "not_found"),
    (StoragePermissionError, "permission"),
    (TransientStorageError, "transient"),
)
_BUILTIN: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], ErrorKind], ...] = (
    ((TimeoutError, asyncio.TimeoutError, ConnectionError, http.client.IncompleteRead), "transient"),
    (FileExistsError, "conflict"),
    (FileNotFoundError, "not_found"),
    (PermissionError, "permission"),
)


def _classify_one(exc: BaseException) -> ErrorKind | None:
    for cls, kind in _OURS:
        if isinstance(exc, cls):
            return kind
    by_code = _by_code(exc)
    if by_code is not None:
        return by_code
    name = type(exc).__name__
    if name in _PERMISSION_BOTOCORE:
        return "permission"
    if name in _TRANSIENT_BOTOCORE or name in _TRANSIENT_AIOHTTP:
        return "transient"
    for cls, kind in _BUILTIN:
        if isinstance(exc, cls):
            return kind
    if isinstance(exc, OSError) and str(exc).startswith("Forbidden"):  # gcsfs's 403
        return "permission"
    return None


def classify(exc: BaseException) -> ErrorKind:
    """Sort ``exc`` (or the first of its causes that says) into an :data:`ErrorKind`.

    A failed connection anywhere in the chain makes it ``"transient"`` whatever wraps it, and a
    bare ``FileNotFoundError`` defers to a cause that carries the store's answer: fsspec's HTTP
    filesystem raises one for any failure (401, 403, 500 alike).
    """
    if unreachable(exc) and not isinstance(exc, StorageError):
        return "transient"
    for e in chain(exc):
        kind = _classify_one(e)
        if kind is None:
            continue
        if kind == "not_found" and not isinstance(e, StorageError) and code_of(e) == (None, None):
            coded = next((k for c in chain(e) if c is not e and (k := _by_code(c)) is not None), None)
            return coded or kind
        return kind
    return "permanent"


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying (5xx, throttling, timeouts, resets, truncation).

    A :class:`TransientStorageError` is not: it says an inner policy (e.g. one part of a
    multipart upload) already spent its attempts, and retrying it again would multiply them.
    """
    return not isinstance(exc, TransientStorageError) and classify(exc) == "transient"


_THROTTLE_CODES = {
    "SlowDown", "Throttling", "ThrottlingException", "RequestThrottled", "TooManyRequests",
    "TooManyRequestsException", "RequestLimitExceeded", "503", "429",
}


def is_throttle(exc: BaseException) -> bool:
    """Whether the store answered "slow down" (503 SlowDown, 429, a throttling code): what
    :mod:`~streamio.storage.pacing` paces by."""
    for e in chain(exc):
        code, status = code_of(e)
        if code in _THROTTLE_CODES or status in (429, 503):
            return True
    return False


def _detail(exc: BaseException) -> str:
    """A short description of ``exc`` for a message: its error code, else its first line (scrubbed)."""
    for e in chain(exc):
        code, status = code_of(e)
        if code is not None:
            if code.isdigit():  # no code of the store's own (a body it could not parse): the status
                return f"HTTP {code}"
            return scrub(f"{code} (HTTP {status})" if status and str(status) != code else str(code))
    first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return scrub(first if len(first) <= 300 else first[:297] + "...")


def to_storage_error(exc: BaseException, url: str, *, attempts: int = 1, elapsed: float = 0.0) -> BaseException:
    """The :mod:`streamio.errors` exception for ``exc`` at ``url`` (``exc`` itself if permanent and not ours)."""
    kind = classify(exc)
    detail, url = _detail(exc), scrub(url)
    if isinstance(exc, StorageError):  # already ours (from an inner policy or a backend): as is
        return exc
    if kind == "not_found" and has_code(exc, "NoSuchBucket"):
        return bucket_not_found(url, detail)
    if kind == "not_found":
        return ObjectNotFoundError(
            f"{url} does not exist ({detail}): check the bucket name, the path and the endpoint"
        )
    if kind == "permission":
        return StoragePermissionError(
            f"access to {url} was refused ({detail}): check the credentials (key/secret/token or service "
            f"account), that they are valid for this endpoint, and that they may access this bucket"
        )
    if kind == "conflict":
        return WriteConflictError(
            f"conditional write to {url} lost ({detail}): the object exists or changed since it was read; "
            f"re-read it and decide again"
        )
    if kind == "transient" and unreachable(exc):
        return unreachable_error(url, exc, detail, attempts=attempts, elapsed=elapsed)
    if kind == "transient":
        return TransientStorageError(
            f"{url}: transient storage errors persisted through {attempts} attempt(s) over {elapsed:.1f} s "
            f"(last: {detail}); check the endpoint and network, or allow more in the RetryPolicy"
        )
    if (isinstance(exc, OSError) and not isinstance(exc, StorageError)) or any(
        code_of(e) != (None, None) for e in chain(exc)
    ):
        return StorageError(
            f"{url}: the store refused the request ({detail}); check the URL, the range and the options"
        )
    return exc


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage errors are retried (exponential backoff, full jitter).

    The n-th retry waits ``uniform(0, min(max_backoff, initial_backoff * 2**(n-1)))`` seconds.

    Attributes:
        max_attempts: attempts in all, the first included (1 = never retry).
        initial_backoff: upper bound of the first wait, seconds.
        max_backoff: cap on the upper bound of one wait.
        max_total: stop retrying once this many seconds passed since the first attempt.
        body_deadline: when a response body that trickles in counts as stalled (a transient
            failure); see :mod:`streamio.storage.deadline`.
        sleep: how to wait (tests pass a recorder; never pickled state: a module function).
        pace_writes: pace a process's writes to a bucket that throttles (:mod:`.pacing`);
            ``False`` retries each write on its own schedule only.
    """

    max_attempts: int = 8
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    max_total: float = 120.0
    body_deadline: BodyDeadline = BodyDeadline()
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    pace_writes: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")

    def backoff(self, retry_number: int) -> float:
        """Seconds to wait before retry ``retry_number`` (1-based): full jitter."""
        cap = min(self.max_backoff, self.initial_backoff * 2 ** max(0, retry_number - 1))
        return random.uniform(0, cap)  # noqa: S311 - jitter, not crypto

    def call(self, fn: Callable[[], T], url: str, *, pacer: Pacer | None = None) -> T:
        """Run ``fn`` under this policy.

        Args:
            fn: the operation; may raise anything.
            url: the URL it concerns, named in every error.
            pacer: the adaptive rate each attempt waits for and reports to (writes:
                :mod:`~streamio.storage.pacing`).

        Returns:
            What ``fn`` returned.

        Raises:
            ObjectNotFoundError, StoragePermissionError, WriteConflictError: at once.
            TransientStorageError: transient errors outlasted the policy.
        """
        start = time.monotonic()
        ledger = Ledger()  # counts each attempt's requests once the loop knows its outcome (accounting)

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.max_attempts) | tenacity.stop_after_delay(self.max_total),
            wait=lambda state: self.backoff(state.attempt_number),
            retry=tenacity.retry_if_exception(is_transient),
            sleep=self.sleep,
            before_sleep=lambda state: log.info(
                "retrying %s after attempt %d: %s", scrub(url), state.attempt_number, _detail(state.outcome.exception())
            ),
            reraise=True,
        )
        one = fn if pacer is None or not self.pace_writes else lambda: _paced(fn, pacer)
        try:
            return retrying(lambda: ledger.run(one))
        except Exception as exc:
            attempts = int(retrying.statistics.get("attempt_number", 1))
            err = to_storage_error(exc, url, attempts=attempts, elapsed=time.monotonic() - start)
            ledger.gave_up(exc, err, answer=classify(exc) in ("not_found", "conflict"))
            if err is exc:
                raise
            raise err from _cause(exc)
        finally:
            ledger.close()

    def budget(self) -> RetryBudget:
        """A fresh attempt budget for a loop that resumes (see :class:`RetryBudget`)."""
        return RetryBudget(self)


def _paced(fn: Callable[[], T], pacer: Pacer) -> T:
    pacer.wait()
    try:
        out = fn()
    except Exception as exc:
        if is_throttle(exc):
            pacer.throttled()
        raise
    pacer.succeeded()
    return out


class RetryBudget:
    """Attempt accounting for long operations that make progress between failures (streams).

    A failure after progress starts a fresh series: a 64 MB read cut every 8 MB makes 8
    failures, each followed by progress, and must not exhaust ``max_attempts``. Failures without
    progress in between are counted and backed off like :meth:`RetryPolicy.call`. Stalls
    (:class:`~streamio.errors.BodyStalledError`) are the exception: a body that trickles makes
    *some* progress before each stall, so stalls are counted over the whole read, never forgiven,
    and ``max_total`` runs from the first stall.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.failures = 0
        self.total_failures = 0
        self.stalls = 0
        self._since = time.monotonic()
        self._first_stall: float | None = None
        self.ledger = Ledger()
        """Where the read's requests are noted until each attempt's outcome is known (:mod:`.accounting`)."""

    def progress(self) -> None:
        """Bytes arrived: the next failure starts a new series."""
        self.failures = 0
        self._since = time.monotonic()

    def failed(self, exc: BaseException, url: str) -> None:
        """Account one failure: wait and return if worth retrying, else raise the mapped error."""
        self.failures += 1
        self.total_failures += 1
        elapsed = time.monotonic() - self._since
        if isinstance(exc, BodyStalledError):
            self.stalls += 1
            self.failures = max(self.failures, self.stalls)
            if self._first_stall is None:
                self._first_stall = time.monotonic()
            elapsed = max(elapsed, time.monotonic() - self._first_stall)
        self.ledger.failed(exc)
        if not is_transient(exc) or self.failures >= self.policy.max_attempts or elapsed > self.policy.max_total:
            err = to_storage_error(exc, url, attempts=self.failures, elapsed=elapsed)
            self.ledger.gave_up(exc, err, answer=classify(exc) in ("not_found", "conflict"))
            if err is exc:
                raise exc
            raise err from _cause(exc)
        self.ledger.retrying()
        log.info("resuming %s after failure %d: %s", scrub(url), self.failures, _detail(exc))
        self.policy.sleep(self.policy.backoff(self.failures))

