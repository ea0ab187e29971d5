"""RetryPolicy and error classification, without a network and without sleeping."""

from __future__ import annotations

import pickle
import time

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError

from streamio.errors import (
    BucketNotFoundError,
    StorageError,
    StoragePermissionError,
    TransientStorageError,
    TruncatedBodyError,
    WriteConflictError,
)
from streamio.storage import RetryPolicy, classify

URL = "s3://bucket/key"


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


def wrapped(inner: BaseException, outer: BaseException) -> BaseException:
    """What s3fs does: an OSError raised from the botocore error."""
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as out:
        return out


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (client_error("NoSuchKey", 404), "not_found"),
        (client_error("NoSuchBucket", 404), "not_found"),
        (client_error("404", 404), "not_found"),  # HEAD has no body: only the status
        (client_error("AccessDenied", 403), "permission"),
        (client_error("InvalidAccessKeyId", 403), "permission"),
        (client_error("SignatureDoesNotMatch", 403), "permission"),
        (client_error("403", 403), "permission"),
        (client_error("PreconditionFailed", 412), "conflict"),
        (client_error("SlowDown", 503), "transient"),
        (client_error("InternalError", 500), "transient"),
        (client_error("TooManyRequests", 429), "transient"),
        (client_error("SomethingNew", 502), "transient"),
        (client_error("InvalidArgument", 400), "permanent"),
        (EndpointConnectionError(endpoint_url="http://x"), "transient"),
        (ReadTimeoutError(endpoint_url="http://x"), "transient"),
        (NoCredentialsError(), "permission"),
        (ConnectionResetError(), "transient"),
        (TimeoutError(), "transient"),
        (TruncatedBodyError("short"), "transient"),
        (wrapped(client_error("SlowDown", 503), OSError(5, "EIO")), "transient"),
        (wrapped(client_error("AccessDenied", 403), PermissionError("denied")), "permission"),
        (OSError("Forbidden: b/x/o/y"), "permission"),  # gcsfs's 403
        (FileNotFoundError("x"), "not_found"),
        (FileExistsError("x"), "conflict"),
        (ValueError("bug"), "permanent"),
    ],
)
def test_classify(exc: BaseException, kind: str) -> None:
    assert classify(exc) == kind


def test_aiohttp_payload_and_disconnect_are_transient() -> None:
    import aiohttp

    assert classify(aiohttp.ClientPayloadError("Response payload is not completed")) == "transient"
    assert classify(aiohttp.ServerDisconnectedError()) == "transient"


def test_gcsfs_http_error_codes() -> None:
    from gcsfs.retry import HttpError

    assert classify(HttpError({"code": 503, "message": "x"})) == "transient"
    assert classify(HttpError({"code": 429, "message": "x"})) == "transient"
    assert classify(HttpError({"code": 401, "message": "x"})) == "permission"
    assert classify(HttpError({"code": 400, "message": "x"})) == "permanent"


class Flaky:
    def __init__(self, errors: list[BaseException], result: str = "ok") -> None:
        self.errors = list(errors)
        self.calls = 0
        self.result = result

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.result


def test_transient_errors_are_retried_with_full_jitter_backoff() -> None:
    sleeps: list[float] = []
    policy = RetryPolicy(max_attempts=5, initial_backoff=0.5, max_backoff=1.5, sleep=sleeps.append)
    fn = Flaky([client_error("SlowDown", 503)] * 4)
    assert policy.call(fn, URL) == "ok"
    assert fn.calls == 5 and len(sleeps) == 4
    for s, cap in zip(sleeps, [0.5, 1.0, 1.5, 1.5], strict=False):
        assert 0 <= s <= cap


def test_jitter_is_full_not_fixed() -> None:
    policy = RetryPolicy(initial_backoff=1.0, max_backoff=1.0)
    draws = {round(policy.backoff(3), 6) for _ in range(50)}
    assert len(draws) > 40 and all(0 <= d <= 1.0 for d in draws)


def test_exhausted_transient_raises_transient_storage_error_naming_url_and_attempts() -> None:
    policy = RetryPolicy(max_attempts=3, sleep=lambda s: None)
    fn = Flaky([client_error("SlowDown", 503)] * 10)
    with pytest.raises(TransientStorageError) as info:
        policy.call(fn, URL)
    assert fn.calls == 3
    assert URL in str(info.value) and "3 attempt" in str(info.value) and "SlowDown" in str(info.value)
    assert isinstance(info.value.__cause__, ClientError)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (client_error("AccessDenied", 403), StoragePermissionError),
        (client_error("NoSuchBucket", 404), BucketNotFoundError),
        (client_error("PreconditionFailed", 412), WriteConflictError),
        (OSError(5, "weird"), StorageError),
    ],
)
def test_permanent_errors_fail_in_one_attempt(exc: BaseException, expected: type) -> None:
    sleeps: list[float] = []
    fn = Flaky([exc] * 3)
    with pytest.raises(expected) as info:
        RetryPolicy(sleep=sleeps.append).call(fn, URL)
    assert fn.calls == 1 and sleeps == []
    assert URL in str(info.value)


def test_other_exceptions_pass_through_unchanged() -> None:
    with pytest.raises(KeyError):
        RetryPolicy(sleep=lambda s: None).call(Flaky([KeyError("k")]), URL)


def test_total_time_bound_stops_retrying() -> None:
    fn = Flaky([client_error("SlowDown", 503)] * 10)
    with pytest.raises(TransientStorageError):
        RetryPolicy(max_attempts=100, max_total=0.0, sleep=lambda s: None).call(fn, URL)
    assert fn.calls == 1


def test_budget_resets_after_progress() -> None:
    policy = RetryPolicy(max_attempts=2, sleep=lambda s: None)
    budget = policy.budget()
    for _ in range(10):  # fails after progress each time: never exhausted
        budget.failed(ConnectionResetError(), URL)
        budget.progress()
    budget.failed(ConnectionResetError(), URL)
    with pytest.raises(TransientStorageError):
        budget.failed(ConnectionResetError(), URL)  # two in a row without progress
    with pytest.raises(StoragePermissionError):
        policy.budget().failed(client_error("AccessDenied", 403), URL)


def test_policy_validates_and_pickles() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    p = RetryPolicy(max_attempts=3)
    assert pickle.loads(pickle.dumps(p)) == p


def test_gather_keeps_order_and_stops_at_the_first_error() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from streamio.pool import gather

    ran: list[int] = []

    def job(i: int) -> int:
        ran.append(i)
        if i == 1:
            raise ValueError("job 1 failed")
        time.sleep(0.01)
        return i * i

    with ThreadPoolExecutor(1) as pool:
        assert gather(pool, lambda i: i * i, range(5)) == [0, 1, 4, 9, 16]
        with pytest.raises(ValueError, match="job 1 failed"):
            gather(pool, job, range(50))
    assert ran[:2] == [0, 1] and len(ran) < 50  # the jobs queued behind the failure were cancelled
