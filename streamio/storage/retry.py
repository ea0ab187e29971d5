"""Retry policy for storage calls, on tenacity.

One place decides retries: exponential backoff with full jitter, bounded in attempts and in total
time, retrying only transient errors and raising permanent ones at once as streamio errors that
name the URL. (s3fs and botocore retry too; the store configures them down so attempts do not
multiply.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import tenacity

from streamio.errors import ObjectNotFoundError, StoragePermissionError, TransientStorageError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage errors are retried.

    Attributes:
        max_attempts: attempts in all, the first included.
        initial_backoff: seconds before the first retry (upper bound of the jitter).
        max_backoff: cap on one backoff.
        max_total: give up once this many seconds have passed since the first attempt.
    """

    max_attempts: int = 8
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    max_total: float = 120.0

    def call(self, fn: Callable[[], T], url: str) -> T:
        """Run ``fn`` under this policy; errors name ``url``."""
        try:
            for attempt in tenacity.Retrying(
                stop=tenacity.stop_after_attempt(self.max_attempts) | tenacity.stop_after_delay(self.max_total),
                wait=tenacity.wait_random_exponential(multiplier=self.initial_backoff, max=self.max_backoff),
                retry=tenacity.retry_if_exception(is_transient),
                reraise=True,
            ):
                with attempt:
                    return fn()
        except FileNotFoundError as exc:
            if isinstance(exc, ObjectNotFoundError):
                raise
            raise ObjectNotFoundError(f"{url} does not exist (or its bucket does not): check the URL") from exc
        except PermissionError as exc:
            raise StoragePermissionError(f"access to {url} was refused: check the credentials and their permissions") from exc
        except Exception as exc:
            if is_transient(exc):
                raise TransientStorageError(
                    f"{url}: transient storage errors outlasted the retry policy ({self.max_attempts} attempts): {exc}"
                ) from exc
            raise
        raise AssertionError("unreachable")  # pragma: no cover


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying (5xx, throttling, timeouts, resets, truncation)."""
    if isinstance(exc, (FileNotFoundError, PermissionError, FileExistsError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    text = f"{type(exc).__name__} {exc}"
    return any(s in text for s in ("SlowDown", "503", "500", "502", "504", "Throttl", "Timeout", "reset", "IncompleteRead"))
