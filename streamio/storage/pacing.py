"""Pacing writes to a store that says "slow down": one adaptive rate per bucket, per process.

S3 serves about 3,500 writes per second per partitioned prefix and answers more with ``503
SlowDown``; GCS starts a bucket near 1,000 writes per second and answers ``429``. A job of many
ranks, each uploading with several threads, bursts far past that, and retrying each request on
its own schedule keeps the burst going. So every write of a process to one bucket goes through
one :class:`Pacer`, the scheme of the AWS SDKs' "adaptive" retry mode (a client-side token bucket
whose rate follows CUBIC):

* Unpaced until the store first throttles (no cost when it never does).
* A throttled answer (:func:`~streamio.storage.retry.is_throttle`) sets the rate to ``BETA`` times
  the rate of answers measured over the last second (or the current rate, if lower), remembered
  as the last maximum; at most once per ``cooldown``, because the requests already in flight
  answer 503 too.
* Each success lets the rate grow back along the CUBIC curve: slowly near the last maximum, faster
  beyond it (up to twice the measured rate: an idle writer's rate does not grow without bound).
* Before each attempt :meth:`Pacer.wait` takes a token (refilled at the rate, at most one
  second's worth), sleeping until its turn when there is none.

The retry policy still backs off each failed request with jitter; the pacer keeps the process as
a whole under the limit it found. Time and sleep are injected (tests drive a fake clock).

The ranks of a job write to one store at once, so a job shares its rate (:meth:`Pacer.sharing`,
used by a checkpoint save): each rank's pacer takes ``fraction`` of a job-wide rate, the one the
ranks learned (:meth:`Pacer.job_rate`, averaged over the ranks) and at most a job-wide ``cap``; when
the share ends the process's rate is scaled back to the job's (a rank alone may then use all of it).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["BETA", "Pacer", "ShareOutcome", "pacer_for"]

BETA = 0.7
"""Rate kept after a throttle (CUBIC's multiplicative decrease)."""
_SCALE = 0.4  # CUBIC's C: how fast the rate grows back
_MIN_RATE = 0.5  # requests per second: never slower
_WINDOW_S = 1.0  # the measured rate counts the successes of the last second
_SHORTEST_S = 0.05  # ... over at least this long


@dataclass(frozen=True)
class ShareOutcome:
    """What one share (a save's uploads on one rank) met: the writes the store admitted, over how
    many seconds, and how many answers said "slow down"."""

    admitted: int
    seconds: float
    throttles: int


class Pacer:
    """The adaptive rate of one bucket's writes in this process (see the module docstring).

    Args:
        clock: monotonic seconds.
        sleep: how to wait for a token.
        cooldown: least seconds between two rate cuts (the writes in flight when the rate is cut
            answer "slow down" too; they must not cut it again).
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
        cooldown: float = 0.2,
    ) -> None:
        self._clock, self._sleep, self.cooldown = clock, sleep, cooldown
        self._lock = threading.Lock()
        self.enabled = False
        self.rate = 0.0  # tokens per second, once enabled
        self._tokens = 0.0
        self._refilled = clock()
        self._last_max = 0.0
        self._cut_at = -float("inf")
        self._answers: collections.deque[float] = collections.deque()  # their times, the last second
        self.throttles = 0
        self.admitted = 0
        self.last_share: ShareOutcome | None = None  # what the last share (a save's uploads) met
        self._fraction = 1.0  # of the job's rate, while a share lasts
        self.cap: float | None = None  # the most this process sends (its part of the job's cap)

    def wait(self) -> None:
        """Take a token before an attempt, sleeping until it is due (at once while unpaced).

        A token is reserved under the lock (the count may go below zero: the requests waiting
        for their turn), so concurrent callers leave one after another at the rate.
        """
        with self._lock:
            if not self.enabled:
                return
            self._refill()
            self._tokens -= 1
            delay = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if delay > 0:
            self._sleep(delay)

    def succeeded(self) -> None:
        """An attempt succeeded: the rate may grow back."""
        with self._lock:
            now = self._clock()
            measured = self._measured(now)
            self.admitted += 1
            if self.enabled:  # an idle writer's rate does not grow past what it last had
                self._set_rate(min(self._cubic(now), max(2 * (measured or 0.0), self._last_max)))

    def throttled(self) -> None:
        """An attempt was answered "slow down": cut the rate (once per cooldown)."""
        with self._lock:
            now = self._clock()
            measured = self._measured(now)
            self.throttles += 1
            if now - self._cut_at < self.cooldown:
                return
            if self.enabled:  # what it sent at; a lone answer: the rate it was about to send at
                current = self.rate if measured is None else min(measured, self.rate)
            else:
                current = measured if measured is not None else 1 / _SHORTEST_S
            self._last_max = max(current, _MIN_RATE)
            self._cut_at = now
            self.enabled = True
            self._set_rate(self._last_max * BETA)

    def job_rate(self) -> float | None:
        """The rate this process found its store allows the whole job (its own rate over the
        fraction it holds); ``None`` while it has never been paced."""
        with self._lock:
            return self.rate / self._fraction if self.enabled else None

    @contextlib.contextmanager
    def sharing(self, fraction: float, *, rate: float | None, cap: float | None) -> Iterator[None]:
        """Pace at ``fraction`` of the job's ``rate`` (what the ranks learned; ``None``: nothing
        learned, unpaced unless capped), never above ``fraction`` of ``cap``, while the block runs.

        The share starts as if the rate had just grown back to its last maximum (CUBIC then probes
        above it gently). On leaving, the rate learned during the share is scaled back to the job's
        and ``cap`` stays in force for this process alone.
        """
        if not 0 < fraction <= 1:
            raise ValueError(f"a share's fraction must be in (0, 1], got {fraction!r}")
        with self._lock:
            began, admitted, throttles = self._clock(), self.admitted, self.throttles
            self._fraction, self.cap = fraction, cap * fraction if cap is not None else None
            start = rate if rate is not None else cap
            if start is not None:
                self.enabled = True
                self._set_rate(start * fraction)
                self._last_max = self.rate
                self._cut_at = self._clock() - self._plateau()
        try:
            yield
        finally:
            with self._lock:
                self.last_share = ShareOutcome(
                    self.admitted - admitted, self._clock() - began, self.throttles - throttles)
                scale, self._fraction, self.cap = 1 / self._fraction, 1.0, cap
                if self.enabled:
                    self._last_max *= scale
                    self._set_rate(self.rate * scale)

    # ------------------------------------------------------------------ internals (under the lock)
    def _set_rate(self, rate: float) -> None:
        self._refill()
        if self.cap is not None:
            self.rate = max(min(rate, self.cap), min(_MIN_RATE, self.cap))
        else:
            self.rate = max(rate, _MIN_RATE)
        self._tokens = min(self._tokens, max(1.0, self.rate))

    def _refill(self) -> None:
        now = self._clock()
        if self.enabled:
            self._tokens = min(max(1.0, self.rate), self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now

    def _plateau(self) -> float:
        """Seconds after a cut at which CUBIC is back at the last maximum."""
        return float((self._last_max * (1 - BETA) / _SCALE) ** (1 / 3))

    def _cubic(self, now: float) -> float:
        return _SCALE * (now - self._cut_at - self._plateau()) ** 3 + self._last_max

    def _measured(self, now: float) -> float | None:
        """Count an answer at ``now``; the rate of the answers of the last second, over the time
        they span (``None`` for a lone answer: no rate to tell). A burst after an idle spell (the
        start of a save) is measured at its own rate, not diluted by the idle part of the second:
        that cut a rank whose first writes met a throttle to a crawl (0.7 writes/s)."""
        self._answers.append(now)
        while self._answers and self._answers[0] < now - _WINDOW_S:
            self._answers.popleft()
        if len(self._answers) < 2:
            return None
        return (len(self._answers) - 1) / max(now - self._answers[0], _SHORTEST_S)


_pacers: dict[tuple[str, str, str], Pacer] = {}
_registry = threading.Lock()


def pacer_for(root_url: str, options: Mapping[str, Any]) -> Pacer:
    """This process's pacer of the bucket holding ``root_url`` (one per scheme, bucket and endpoint)."""
    scheme, _, rest = root_url.partition("://")
    bucket = rest.split("/", 1)[0]
    kwargs = options.get("client_kwargs") or {}
    endpoint = str(options.get("endpoint_url") or (kwargs.get("endpoint_url") if isinstance(kwargs, Mapping) else "")
                   or "")
    key = (scheme, bucket, endpoint)
    with _registry:
        if key not in _pacers:
            _pacers[key] = Pacer()
        return _pacers[key]
