"""A save's time bound (``SaveOptions.save_timeout_s``): its deadline, what each rank still waits
for, and giving up on what does not finish in time.

A request that a store never answers blocks its thread until the connection dies, and Python
threads cannot be interrupted. So a bounded save runs each rank's share (parts, size check, done
marker) and rank 0's publishing (manifest, pointer) in a daemon thread of its own
(:meth:`SaveBound.run`), its part uploads on daemon threads too (:func:`streamio.pool.run_detached`),
and waits for it until the deadline, counted from the ``save`` call. When the deadline passes:

1. the bound expires: every request the abandoned thread has not sent yet is refused
   (:meth:`SaveBound.request` raises :class:`Expired`), so it never writes a done marker, a
   manifest or a pointer for the timed-out save, nor another part (a manifest that landed late,
   its pointer swap refused, is deleted again: no listing offers the step);
2. :class:`BoundExpired` carries what this rank still waited for (:class:`Stuck`: the URLs of its
   requests in flight) to the commit barrier, where every rank learns every rank's
   (:mod:`.commit`), so all of them raise :class:`~streamio.errors.SaveTimeoutError` alike, with
   :func:`timeout_message`; ranks that had finished wait at the barrier only until the stuck
   rank's own deadline;
3. one WARNING names what was abandoned.

Nothing joins the abandoned threads (``ThreadPoolExecutor`` workers are joined at interpreter
exit, so a stuck one would hang it): ``close()`` and the exit return at once. A request already
sent may still land later; no manifest names it, the abandoned thread removes its rank's share of
the save when its requests end (``on_abandoned``), the next save retries that, and ``streamio
ckpt gc`` removes what a process that exited first left. Only a pointer write in flight at the
deadline can still land and make the (complete) step current: the error says so.

Without a bound (the default) :meth:`SaveBound.run` calls the function in the caller's thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from streamio import threads
from streamio.errors import SaveTimeoutError

__all__ = [
    "UNBOUNDED", "BoundExpired", "Expired", "SaveBound", "Stuck", "raise_if_timed_out", "remaining", "timeout_message",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

SHOWN_KEYS = 3
"""Objects named per stuck rank in the error (then a count)."""
SHOWN_RANKS = 8
"""Stuck ranks named in the error (then a count)."""
KEY_CHARS = 300
"""The most characters of one object's URL in the error."""


@dataclass(frozen=True)
class Stuck:
    """What one rank still waited for when its bound ran out (sent to every rank at the barrier).

    Attributes:
        rank: the rank.
        doing: what it was doing, in words (``"uploading its share"``).
        keys: the URLs of its requests in flight, oldest first.
    """

    rank: int
    doing: str
    keys: tuple[str, ...]


class Expired(Exception):
    """Internal: an abandoned thread tried a new request after its save's bound ran out."""


class BoundExpired(Exception):
    """Internal: this rank's part of a save did not finish in time (:attr:`stuck` says what it waited for)."""

    def __init__(self, stuck: Stuck) -> None:
        super().__init__(f"rank {stuck.rank} {stuck.doing}, waiting for {_few(stuck.keys)}")
        self.stuck = stuck


def remaining(deadline: float | None, now: float) -> float | None:
    """Seconds left until ``deadline`` at ``now`` (never negative); ``None``: no deadline."""
    return None if deadline is None else max(0.0, deadline - now)


def timeout_message(step: int, bound_s: float, url: str, stuck: Sequence[Stuck], *, pointer: str | None = None) -> str:
    """The :class:`~streamio.errors.SaveTimeoutError` message: the step, the bound, each stuck rank
    (a few, then a count) with the objects it waited for (a few, then a count), and the fix;
    ``pointer`` (the root's pointer URL) is named as possibly landing when a rank waited for it."""
    ranks = sorted(stuck, key=lambda s: s.rank)
    named = "; ".join(f"rank {s.rank} was {s.doing}, waiting for {_few(s.keys)}" for s in ranks[:SHOWN_RANKS])
    more = f"; and {len(ranks) - SHOWN_RANKS} more rank(s)" if len(ranks) > SHOWN_RANKS else ""
    in_flight = pointer is not None and any(s.keys and s.keys[-1] == pointer for s in ranks)
    landing = (" The pointer write was in flight: if it still lands, the step becomes current (it is complete)."
               if in_flight else " The previous checkpoint stays current.")
    return (
        f"saving step {step} to {url} did not commit within save_timeout_s={bound_s:g} s: {named}{more}."
        f"{landing} The stuck requests are abandoned; check the store and the network to it, or raise "
        f"SaveOptions(save_timeout_s=...) if saves of this size need longer"
    )


def raise_if_timed_out(
    step: int, bound: SaveBound, url: str, reports: Sequence[object], cause: BaseException | None, *,
    pointer: str | None = None,
) -> None:
    """Raise :class:`~streamio.errors.SaveTimeoutError` naming the :class:`Stuck` ranks among
    ``reports`` (what the ranks told each other at the barrier), if there are any.

    Raises:
        SaveTimeoutError: one or more ranks ran out of time (``from cause``: this rank's own error).
    """
    stuck = [r for r in reports if isinstance(r, Stuck)]
    if stuck:
        raise SaveTimeoutError(timeout_message(step, bound.bound_s or 0.0, url, stuck, pointer=pointer)) from cause


def _few(keys: Sequence[str]) -> str:
    if not keys:
        return "no request (its time went to the host copy or to waiting for other ranks)"
    shown = ", ".join(k if len(k) <= KEY_CHARS else k[: KEY_CHARS - 3] + "..." for k in keys[:SHOWN_KEYS])
    return shown + (f" and {len(keys) - SHOWN_KEYS} more object(s)" if len(keys) > SHOWN_KEYS else "")


class SaveBound:
    """One save's deadline on one rank; see the module docstring.

    Args:
        bound_s: ``SaveOptions.save_timeout_s`` (``None``: no bound).
        started: ``time.perf_counter()`` when the bound starts (the ``save`` call).
        rank: this rank (named in what it reports).
        clock: the clock ``started`` was read from.
    """

    def __init__(
        self, bound_s: float | None, started: float, *, rank: int, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.bound_s, self.rank, self._clock = bound_s, rank, clock
        self.deadline = None if bound_s is None else started + bound_s
        self._lock = threading.Lock()
        self._expired = False
        self._in_flight: dict[int, str] = {}  # request number -> URL, oldest first
        self._count = 0

    @property
    def expired(self) -> bool:
        with self._lock:
            return self._expired

    @contextlib.contextmanager
    def request(self, url: str, *, refused: Callable[[], object] | None = None) -> Iterator[None]:
        """Around one storage request to ``url``: refused once the bound expired (after calling
        ``refused()``), else recorded as in flight while it runs.

        Raises:
            Expired: the bound has run out: the request is not sent.
        """
        with self._lock:
            expired = self._expired
        if expired:
            if refused is not None:
                refused()
            raise Expired(f"{url}: the save's bound ran out, the request is not sent")
        with self._lock:
            self._count += 1
            number = self._count
            self._in_flight[number] = url
        try:
            yield
        finally:
            with self._lock:
                self._in_flight.pop(number, None)

    def run(self, fn: Callable[[], T], *, doing: str, on_abandoned: Callable[[], object] | None = None) -> T:
        """``fn()``, waited for until the deadline (without a bound: called here).

        Args:
            doing: what ``fn`` does, in words, for the report (``"uploading its share"``).
            on_abandoned: called in ``fn``'s thread once ``fn`` ended, if it was abandoned.

        Raises:
            BoundExpired: the deadline passed first: the bound is expired and ``fn`` abandoned.
            Whatever ``fn`` raised.
        """
        if self.deadline is None:
            return fn()
        box: dict[str, object] = {}
        ended = threading.Event()
        fate = {"abandoned": False}  # under the lock: decided once, by whichever side is first

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread below
                box["error"] = exc
            with self._lock:
                ended.set()
                abandoned = fate["abandoned"]
            if abandoned and on_abandoned is not None:
                on_abandoned()

        threads.start(target, name=f"streamio-ckpt-bounded-{self.rank}")
        if not ended.wait(remaining(self.deadline, self._clock())):
            with self._lock:
                self._expired = True
                keys = tuple(self._in_flight.values())
                fate["abandoned"] = not ended.is_set()  # it ended meanwhile: its outcome stands
            if fate["abandoned"]:
                log.warning("rank %d abandons %s after save_timeout_s=%g s: %s still in flight (left to end on "
                            "their own; nothing waits for them)", self.rank, doing, self.bound_s, _few(keys))
                raise BoundExpired(Stuck(self.rank, doing, keys))
        if isinstance(box.get("error"), Expired):  # the deadline had passed before it could begin
            raise BoundExpired(Stuck(self.rank, doing, ()))
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]


UNBOUNDED = SaveBound(None, 0.0, rank=0)
"""No deadline: :meth:`SaveBound.run` calls in place and every request is sent."""
