"""Body deadlines: no server, proxy or network path can make a read wait for ever.

A socket read timeout (botocore's and aiohttp's ``read_timeout``) bounds one wait for *some*
bytes, so a body that trickles in at one byte a second never trips it: the probe that found this
left a dataset and a checkpoint restore hanging without an error. Here every response body has a
deadline that grows with what it carries: it may take ``grace + bytes / min_rate`` seconds of
*waiting* (:class:`BodyDeadline`), after which the read fails with
:class:`~streamio.errors.BodyStalledError`, a transient error the retry policy retries (and
counts: progress between stalls does not forgive them, see
:class:`~streamio.storage.retry.RetryBudget`).

Only time spent waiting on the network counts. A stream is read at its consumer's pace (a
training loop that pauses stops reading and TCP stops the sender), so a stream's clock
(:class:`Pace`) runs only inside its reads: each piece is awaited with the time its deadline still
allows (``asyncio.wait_for`` on fsspec's loop). A whole-body read in a blocking client (botocore's
synchronous client, which reads a body in one call with the GIL released) cannot be interrupted
from inside, so a :class:`Watchdog` thread calls a cancel function at the deadline, which shuts
the socket down for reading (urllib3's ``HTTPResponse.shutdown``): the blocked read returns and
the caller raises the stall.

Defaults: 30 s of grace (above s3fs's 15 s read timeout, so a body that stops entirely is still
that timeout's) and 64 KiB/s, far below any link a training job reads over (S3 serves a
connection 50-100 MB/s), so a slow but honest link is never cut, while a body trickling at
1 byte/s fails after ~30 s. What is not covered: the response *headers* of the synchronous S3
client (botocore gives no handle on the socket before the response exists; its read timeout
applies to each wait), and reads through generic fsspec filesystems (their own timeouts apply).
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from streamio.errors import BodyStalledError, ConfigError

__all__ = ["BodyDeadline", "Pace", "Timer", "Watchdog", "watchdog"]


@dataclass(frozen=True)
class BodyDeadline:
    """How long a response body may make a reader wait: ``grace + bytes / min_rate`` seconds.

    Attributes:
        grace: seconds every body may take whatever its size (and the most a stream's request
            may wait for its response headers).
        min_rate: bytes per second of waiting a body must average beyond the grace.
    """

    grace: float = 30.0
    min_rate: float = 64 * 1024

    def __post_init__(self) -> None:
        if not (self.grace > 0 and self.min_rate > 0):
            raise ConfigError(
                f"BodyDeadline needs grace > 0 and min_rate > 0, got grace={self.grace!r}, min_rate={self.min_rate!r}"
            )

    def allowed(self, nbytes: int) -> float:
        """Seconds of waiting a body of ``nbytes`` bytes may take."""
        return self.grace + max(0, nbytes) / self.min_rate

    def stalled(self, url: str, received: int, waited: float) -> BodyStalledError:
        """The error for a streamed body that missed this deadline after ``received`` bytes."""
        return BodyStalledError(
            f"{url}: the response stalled: {received} bytes in {waited:.1f} s of waiting, below the "
            f"{self.min_rate:.0f} bytes/s a body must reach after {self.grace:g} s (RetryPolicy.body_deadline)"
        )

    def missed(self, url: str, nbytes: int | None) -> BodyStalledError:
        """The error for a response of ``nbytes`` (None: its headers) that missed this deadline."""
        what = "headers" if nbytes is None else f"body of {nbytes} bytes"
        return BodyStalledError(
            f"{url}: the response {what} did not arrive within {self.allowed(nbytes or 0):.1f} s ({self.grace:g} s "
            f"plus {self.min_rate:.0f} bytes/s; RetryPolicy.body_deadline)"
        )


class Pace:
    """The deadline of one streamed body, whose clock runs only while the reader waits.

    Call order: :meth:`budget` before each wait for the next ``more`` bytes (it raises once the
    deadline has passed), then :meth:`record` with what arrived and how long the wait took.
    """

    def __init__(self, deadline: BodyDeadline, url: str) -> None:
        self.deadline = deadline
        self.url = url
        self.received = 0
        self.waited = 0.0

    def budget(self, more: int) -> float:
        """Seconds the next wait, for up to ``more`` bytes, may take.

        Raises:
            BodyStalledError: none are left.
        """
        left = self.deadline.allowed(self.received + more) - self.waited
        if left <= 0:
            raise self.stalled()
        return left

    def record(self, nbytes: int, waited: float) -> None:
        """``nbytes`` arrived after ``waited`` seconds of waiting."""
        self.received += nbytes
        self.waited += waited

    def stalled(self) -> BodyStalledError:
        """The error for this body now."""
        return self.deadline.stalled(self.url, self.received, self.waited)


class Timer:
    """One armed deadline of a :class:`Watchdog`; :attr:`fired` once its cancel function ran."""

    __slots__ = ("cancel", "fired", "live")

    def __init__(self, cancel: Callable[[], object]) -> None:
        self.cancel = cancel
        self.fired = False
        self.live = True

    def disarm(self) -> None:
        """The guarded wait is over: never fire (a timer that already fired stays fired)."""
        self.live = False


class Watchdog:
    """One thread that runs the cancel function of every deadline that passes.

    Args:
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, cancel: Callable[[], object]) -> Timer:
        """Call ``cancel()`` in ``seconds`` unless the returned timer is disarmed first."""
        timer = Timer(cancel)
        with self._wake:
            heapq.heappush(self._heap, (self._clock() + seconds, next(self._order), timer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="streamio-deadlines", daemon=True)
                self._thread.start()
            self._wake.notify()
        return timer

    def fire_due(self) -> None:
        """Run the cancel functions whose time has come (the thread's loop; tests call it directly)."""
        due: list[Timer] = []
        with self._wake:
            now = self._clock()
            while self._heap and (self._heap[0][0] <= now or not self._heap[0][2].live):
                _, _, timer = heapq.heappop(self._heap)
                if timer.live:
                    timer.fired, timer.live = True, False
                    due.append(timer)
        for timer in due:
            try:
                timer.cancel()
            except Exception:  # noqa: BLE001, S110 - the connection is gone already: the read fails anyway
                pass

    def _run(self) -> None:
        while True:
            self.fire_due()
            with self._wake:  # the heap read again under the lock: a timer armed meanwhile is in it
                wait = self._heap[0][0] - self._clock() if self._heap else None
                if wait is None or wait > 0:
                    self._wake.wait(timeout=wait)


_WATCHDOG: Watchdog | None = None
_WATCHDOG_LOCK = threading.Lock()


def watchdog() -> Watchdog:
    """This process's watchdog (a forked child makes its own: the parent's thread is not there)."""
    global _WATCHDOG
    with _WATCHDOG_LOCK:
        if _WATCHDOG is None:
            _WATCHDOG = Watchdog()
        return _WATCHDOG


def _forget_after_fork() -> None:
    global _WATCHDOG, _WATCHDOG_LOCK
    _WATCHDOG, _WATCHDOG_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
