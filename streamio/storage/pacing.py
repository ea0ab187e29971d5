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
* Then the rate grows back along the CUBIC curve of the time since that cut: slowly near the last
  maximum, faster beyond it. The curve is read whenever a token is taken, so a writer held back at
  the floor (0.5 writes/s after a storm) climbs back within seconds of the storm's end: it once
  grew only on a success and only up to twice the writes of the last second, which below one
  write per second could not be measured, and a process stayed at 0.5 writes/s for good.
* The curve's clock stops while the token bucket is full (the writer sends less than its rate),
  as Linux's CUBIC does for an application-limited sender: an idle writer's rate does not grow,
  so a writer that resumes after minutes of training resumes at the rate it had, not in a burst.
* Before each attempt :meth:`Pacer.wait` takes a token (refilled at the rate, at most one
  second's worth), sleeping until its turn when there is none; a waiter looks at the rate again
  at least every ``_RECHECK_S``, so a queue formed at a low rate drains at the rate grown since
  (and none sleeps longer than its turn at the rate it found, whatever the clock says).

The retry policy still backs off each failed request with jitter; the pacer keeps the process as
a whole under the limit it found. Time and sleep are injected (tests drive a fake clock); a clock
that steps back reads as one that stands still (no negative refill, no wait longer than a token's).

The ranks of a job write to one store at once, so a job shares its rate (:meth:`Pacer.sharing`,
used by a checkpoint save): each rank's pacer takes ``fraction`` of a job-wide rate, the one the
ranks learned (:meth:`Pacer.job_rate`, averaged over the ranks) and at most a job-wide ``cap``; when
the share ends the process's rate is scaled back to the job's (a rank alone may then use all of it).
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from streamio.errors import ConfigError

__all__ = ["BETA", "Pacer", "ShareOutcome", "pacer_for"]

BETA = 0.7
"""Rate kept after a throttle (CUBIC's multiplicative decrease)."""
_SCALE = 0.4  # CUBIC's C: how fast the rate grows back
_MIN_RATE = 0.5  # requests per second: never slower (unless a cap is lower)
_WINDOW_S = 1.0  # the measured rate counts the answers of the last second
_SHORTEST_S = 0.05  # ... over at least this long
_RECHECK_S = 0.25  # a waiter looks at the (growing) rate again at least this often


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
        clock: monotonic seconds (a step back is taken out: it reads as no time passing).
        sleep: how to wait for a token.
        cooldown: least seconds between two rate cuts (the writes in flight when the rate is cut
            answer "slow down" too; they must not cut it again).

    Raises:
        ConfigError: ``cooldown`` is negative or not finite.
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
        cooldown: float = 0.2,
    ) -> None:
        if not (isinstance(cooldown, (int, float)) and 0 <= cooldown < math.inf):
            raise ConfigError(f"a pacer's cooldown must be a finite number of seconds >= 0, got {cooldown!r}")
        self._clock, self._sleep, self.cooldown = clock, sleep, cooldown
        self._lock = threading.Lock()
        self.enabled = False
        self.rate = 0.0  # tokens per second, once enabled
        start = clock()
        self._raw = self._latest = start if math.isfinite(start) else 0.0  # the pacer's time (see _now)
        self._offset = 0.0  # the clock's steps back, taken out
        self._tokens = 0.0  # below zero: the tokens waiters have reserved
        self._filled = 0.0  # tokens ever added: a waiter is due once this reaches its ticket
        self._refilled = self._latest
        self._last_max = 0.0
        self._cut_at = -math.inf
        self._epoch = -math.inf  # where CUBIC's clock reads 0: the cut, moved on by idle time
        self._answers: collections.deque[float] = collections.deque()  # their times, the last second
        self.throttles = 0
        self.admitted = 0
        self.last_share: ShareOutcome | None = None  # what the last share (a save's uploads) met
        self._fraction = 1.0  # of the job's rate, while a share lasts
        self.cap: float | None = None  # the most this process sends (its part of the job's cap)

    def wait(self) -> None:
        """Take a token before an attempt, sleeping until it is due (at once while unpaced).

        A token is reserved under the lock (the count may go below zero: the requests waiting
        for their turn), so concurrent callers leave one after another at the rate; each sleeps
        at most ``_RECHECK_S`` at a time and then reads the rate again (it may have grown, or
        been cut).
        """
        with self._lock:
            if not self.enabled:
                return
            self._advance(self._now())
            self._tokens -= 1
            ticket = self._filled - self._tokens  # due once every token up to its own is filled
            budget = -self._tokens / self.rate  # the most it sleeps, whatever the clock says
        while budget > 0:
            with self._lock:
                self._advance(self._now())
                short = ticket - self._filled
                if short <= 1e-9:  # due (to float precision: a sleep of 1e-15 s would not move a clock)
                    return
                delay = min(short / self.rate, _RECHECK_S, budget)
            budget -= delay
            self._sleep(delay)

    def succeeded(self) -> None:
        """An attempt succeeded: counted (the rate grows with time, see :meth:`wait`)."""
        with self._lock:
            now = self._now()
            self._measured(now)
            self.admitted += 1
            self._advance(now)

    def throttled(self) -> None:
        """An attempt was answered "slow down": cut the rate (once per cooldown)."""
        with self._lock:
            now = self._now()
            measured = self._measured(now)
            self.throttles += 1
            if now - self._cut_at < self.cooldown:
                return
            self._refill(now)
            if self.enabled:  # what it sent at; a lone answer: the rate it was about to send at
                current = self.rate if measured is None else min(measured, self.rate)
            else:
                current = measured if measured is not None else 1 / _SHORTEST_S
            self._last_max = max(current, _MIN_RATE)
            self._cut_at = self._epoch = now
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
        and ``cap`` stays in force for this process alone. A ``rate`` that is not a positive number
        (what peers reported) counts as nothing learned.

        Raises:
            ConfigError: ``fraction`` is outside (0, 1], or ``cap`` is not a positive finite
                number of writes per second.
        """
        if not 0 < fraction <= 1:
            raise ConfigError(f"a share's fraction must be in (0, 1], got {fraction!r}")
        if cap is not None and not (isinstance(cap, (int, float)) and 0 < cap < math.inf):
            raise ConfigError(f"a write cap must be a positive finite number of writes per second, got {cap!r}; "
                              f"give None for no cap")
        if rate is not None and not 0 < rate < math.inf:
            rate = None
        with self._lock:
            began, admitted, throttles = self._now(), self.admitted, self.throttles
            self._advance(began)
            self._fraction, self.cap = fraction, cap * fraction if cap is not None else None
            start = rate if rate is not None else cap
            if start is not None:
                self.enabled = True
                self.rate = 0.0  # set afresh, not grown from what it was
                self._set_rate(start * fraction)
                self._last_max = self.rate
                self._epoch = began - self._plateau()
        try:
            yield
        finally:
            with self._lock:
                now = self._now()
                self._advance(now)
                self.last_share = ShareOutcome(self.admitted - admitted, now - began, self.throttles - throttles)
                scale, self._fraction, self.cap = 1 / self._fraction, 1.0, cap
                if self.enabled:
                    self._last_max *= scale
                    self._set_rate(self.rate * scale)

    # ------------------------------------------------------------------ internals (under the lock)
    def _now(self) -> float:
        """The pacer's time: the clock, with every step back taken out (a step back reads as no
        time passing, then time runs on from there; a clock that reads NaN or inf stands still)."""
        raw = self._clock()
        if not math.isfinite(raw):
            return self._latest
        if raw < self._raw:
            self._offset += self._raw - raw
        self._raw = raw
        self._latest = max(self._latest, raw + self._offset)
        return self._latest

    def _floor(self) -> float:
        return _MIN_RATE if self.cap is None else min(_MIN_RATE, self.cap)

    def _set_rate(self, rate: float) -> None:
        self.rate = max(rate, self._floor()) if self.cap is None else max(min(rate, self.cap), self._floor())
        self._tokens = min(self._tokens, max(1.0, self.rate))

    def _advance(self, now: float) -> None:
        """Refill the tokens up to ``now``, then let the rate follow the curve, up to twice the
        rate of the answers of the last second when it holds two (never down: only a throttle
        cuts)."""
        self._refill(now)
        if self.enabled:
            grown, measured = self._cubic(now), self._answer_rate(now)
            if measured is not None:  # at most twice what the store answered (below 1/s: unknown)
                grown = min(grown, 2 * measured)
            self._set_rate(max(self.rate, grown))

    def _refill(self, now: float) -> None:
        """Refill the tokens up to ``now`` at the rate; CUBIC's clock stops for the time the bucket
        was full (an idle writer's rate does not grow)."""
        elapsed, self._refilled = now - self._refilled, now
        if not self.enabled:
            return
        room = max(1.0, self.rate) - self._tokens
        idle = elapsed - room / self.rate
        if idle > 0:
            self._epoch += idle
        added = min(room, elapsed * self.rate)
        self._tokens += added
        self._filled += added

    def _plateau(self) -> float:
        """Seconds after a cut at which CUBIC is back at the last maximum."""
        return float((self._last_max * (1 - BETA) / _SCALE) ** (1 / 3))

    def _cubic(self, now: float) -> float:
        return _SCALE * (now - self._epoch - self._plateau()) ** 3 + self._last_max

    def _measured(self, now: float) -> float | None:
        """Count an answer at ``now``; the rate of the answers of the last second (see below)."""
        self._answers.append(now)
        return self._answer_rate(now)

    def _answer_rate(self, now: float) -> float | None:
        """The rate of the answers of the last second, over the time they span (``None`` for a lone
        answer: no rate to tell). A burst after an idle spell (the start of a save) is measured at
        its own rate, not diluted by the idle part of the second: that cut a rank whose first
        writes met a throttle to a crawl (0.7 writes/s)."""
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
