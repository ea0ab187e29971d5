"""A save's writes paced as one job: each rank sends its part of one write rate (docs/design.md
"Request rates").

Every rank's writes to a bucket go through its process's :class:`~streamio.storage.pacing.Pacer`,
which finds on its own what the store allows. The ranks of a save write at once, so on their own
they burst together and each relearns the limit the others already met. Before a save's uploads
the ranks exchange (one all-gather over the save's group) how many objects each will write and what
their previous save met; then each paces at its fraction of the writes times the job's rate, never
above the same fraction of the job's cap (:class:`WriteCap`).
A rank with twice the writes gets twice the rate, so the ranks finish together.

The job's rate (:func:`job_rate`): when the store said "slow down" to any rank during the previous
save, the rate the store admitted the whole job's writes at then (all ranks' admitted writes over
the longest rank's upload time): a measure of the limit itself, where each rank's own adaptive rate
only knows its corner of it. Otherwise the mean of the rates the ranks' pacers hold (``None`` when
none was ever paced: the ranks start unpaced, or at the cap).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence

from streamio.checkpoint.comm import Comm
from streamio.storage import Store, documented_write_rate, write_pacer
from streamio.storage.pacing import ShareOutcome

__all__ = ["RAMP_S", "WriteCap", "job_rate", "shared_write_rate"]

RAMP_S = 20 * 60.0
"""How long a job's saves go unthrottled before its documented cap may double (GCS asks clients
to ramp up no faster than twice every 20 minutes; S3 partitions a prefix after sustained load)."""


class WriteCap:
    """The job's cap on its saves' write rate, from ``SaveOptions.write_rate``.

    A number is the cap, always; ``None`` or a store without a documented rate: no cap.
    ``"store"``: the rate the provider documents for one new prefix
    (:func:`~streamio.storage.documented_write_rate`), doubled after a save when the job's saves
    have gone :data:`RAMP_S` without a throttle, up to that rate times the key prefixes a save
    spreads over (which the store may by then serve each at that rate), and halved (never below
    the documented rate) after a save the store throttled. Every rank keeps one and updates it
    alike, from what the ranks exchange before each save (:func:`shared_write_rate`).
    """

    def __init__(self, setting: float | str | None, store: Store, *, clock: Callable[[], float] = time.monotonic):
        self._base = documented_write_rate(store) if setting == "store" else setting
        self._ramps = setting == "store"
        self._clock = clock
        self.factor = 1
        self._since: float | None = None  # when the factor last changed (or a throttle was seen)

    def due(self) -> bool:
        """Whether this rank's clock says the cap may double at the coming save."""
        return self._since is not None and self._clock() - self._since >= RAMP_S

    def next(self, *, prefixes: int, throttled: bool, due: bool) -> float | None:
        """The cap of the coming save, after a previous one the store ``throttled`` (or not) and
        with rank 0's :meth:`due` (so every rank decides alike)."""
        if not isinstance(self._base, (int, float)):
            return None
        if self._ramps:
            if self._since is None or throttled:
                self.factor = max(1, self.factor // 2) if throttled else self.factor
                self._since = self._clock()
            elif due:
                self.factor, self._since = self.factor * 2, self._clock()
            self.factor = min(self.factor, max(1, prefixes))
        return float(self._base) * self.factor


def job_rate(outcomes: Sequence[ShareOutcome | None], rates: Sequence[float | None]) -> float | None:
    """The job's write rate from each rank's previous share (``None``: it had none) and the
    job-wide rate each rank's pacer holds (``None``: never paced); see the module docstring."""
    if any(o is not None and o.throttles for o in outcomes):
        done = [o for o in outcomes if o is not None]
        seconds = max(o.seconds for o in done)
        if seconds > 0:
            return sum(o.admitted for o in done) / seconds
    known = [r for r in rates if r is not None]
    return sum(known) / len(known) if known else None


@contextlib.contextmanager
def shared_write_rate(store: Store, comm: Comm, writes: int, cap: WriteCap, *, prefixes: int = 1) -> Iterator[None]:
    """Pace this rank's ``writes`` objects to ``store`` at its share of the job's rate while the
    block runs (collective: every rank of ``comm`` enters it, paced or not, so none waits alone).

    Args:
        writes: the objects this rank writes in the block (its parts and its done marker).
        cap: the job's cap (updated here, alike on every rank).
        prefixes: the key prefixes the save spreads over (how far a documented cap may ramp).
    """
    pacer = write_pacer(store)
    last = (pacer.last_share, pacer.job_rate()) if pacer is not None else (None, None)
    gathered = comm.all_gather((max(1, writes), *last, cap.due()))
    if pacer is None:
        yield
        return
    outcomes = [o for _, o, _, _ in gathered]
    throttled = any(o is not None and o.throttles for o in outcomes)
    limit = cap.next(prefixes=prefixes, throttled=throttled, due=gathered[0][3])
    rate = job_rate(outcomes, [r for _, _, r, _ in gathered])
    with pacer.sharing(max(1, writes) / sum(n for n, _, _, _ in gathered), rate=rate, cap=limit):
        yield
