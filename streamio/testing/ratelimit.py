"""Request-rate limits per key prefix, as object stores enforce them: :class:`RateLimit`.

S3 serves at least 3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests per second *per
partitioned prefix*, and a new prefix (``step-000123/``) starts as one partition; over the rate it
answers ``503 SlowDown``. GCS starts a bucket near 1,000 writes per second. A job of thousands of
ranks that writes one step at once meets those limits before any bandwidth limit, so the loopback
proxy (:class:`~streamio.testing.proxy.FaultProxy`) can impose one: a token bucket per prefix,
where the prefix of an object is the first ``prefix_chars`` characters of its key (S3 splits
partitions by key prefix; ``None``: one bucket for the whole store). A request over the limit is
answered 503 SlowDown with S3's XML body and never reaches the server.

Pure: time is passed in (``clock``), so the buckets are tested without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RateLimit", "writes_per_segment"]


@dataclass
class RateLimit:
    """Token buckets per key prefix: ``per_second`` requests, bursts of up to ``burst``.

    Attributes:
        per_second: the sustained rate each prefix allows.
        burst: the most requests a prefix admits at once after being idle (default: one
            second's worth).
        prefix_chars: how many characters of the key name a prefix (``None``: the whole store
            is one prefix).
        methods: the HTTP methods that count (default: writes, as S3's PUT/POST/DELETE limit).
        clock: monotonic seconds (injectable for tests).
    """

    per_second: float
    burst: float | None = None
    prefix_chars: int | None = None
    methods: tuple[str, ...] = ("PUT", "POST", "DELETE")
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    admitted: int = field(default=0, init=False)
    refused: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.per_second > 0:
            raise ValueError(f"RateLimit.per_second must be > 0, got {self.per_second!r}")
        if self.burst is None:
            self.burst = max(1.0, self.per_second)

    def prefix_of(self, path: str) -> str:
        """The prefix a request path (``/bucket/key``, path-style) counts against."""
        bucket, _, key = path.lstrip("/").partition("/")
        return bucket if self.prefix_chars is None else f"{bucket}/{key[: self.prefix_chars]}"

    def admit(self, method: str, path: str) -> bool:
        """Whether a request may go through now (one token of its prefix's bucket taken)."""
        if method.upper() not in self.methods:
            return True
        prefix, now, burst = self.prefix_of(path), self.clock(), float(self.burst or 1.0)
        with self._lock:
            tokens, last = self._buckets.get(prefix, (burst, now))
            tokens = min(burst, tokens + (now - last) * self.per_second)
            ok = tokens >= 1.0
            self._buckets[prefix] = (tokens - 1.0 if ok else tokens, now)
            if ok:
                self.admitted += 1
            else:
                self.refused += 1
            return ok


def writes_per_segment(
    log: Iterable[Any], mark: str, segments: int, methods: tuple[str, ...] = ("PUT", "POST", "DELETE"),
) -> list[tuple[int, int]]:
    """``(admitted, refused)`` writes in each of ``segments`` parts of a proxy's request log (its
    :class:`~streamio.testing.faults.RequestRecord` s), cut at each request whose path contains
    ``mark`` (e.g. a marker object a test puts between two saves; the marks are not counted)."""
    counts = [[0, 0] for _ in range(segments)]
    i = 0
    for r in log:
        if mark in r.path:
            i = min(i + 1, segments - 1)
        elif r.method in methods:
            counts[i][r.fault == "throttled"] += 1
    return [(a, b) for a, b in counts]
