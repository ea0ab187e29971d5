"""A save's writes paced as one job: each rank sends its part of one write rate (docs/design.md
"Request rates").

Every rank's writes to a bucket go through its process's :class:`~streamio.storage.pacing.Pacer`,
which finds on its own what the store allows. The ranks of a save write at once, so on their own
they burst together and each relearns the limit the others already met. Before a save's uploads
the ranks exchange (one all-gather over the save's group) how many objects each will write and what
their previous save met; then each paces at its fraction of the writes times the job's rate, never
above the same fraction of the job's cap (:attr:`~streamio.checkpoint.options.SaveOptions.write_rate`).
A rank with twice the writes gets twice the rate, so the ranks finish together.

The job's rate (:func:`job_rate`): when the store said "slow down" to any rank during the previous
save, the rate the store admitted the whole job's writes at then (all ranks' admitted writes over
the longest rank's upload time): a measure of the limit itself, where each rank's own adaptive rate
only knows its corner of it. Otherwise the mean of the rates the ranks' pacers hold (``None`` when
none was ever paced: the ranks start unpaced, or at the cap).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from streamio.checkpoint.comm import Comm
from streamio.storage import Store, write_pacer
from streamio.storage.pacing import ShareOutcome

__all__ = ["job_rate", "shared_write_rate"]


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
def shared_write_rate(store: Store, comm: Comm, writes: int, cap: float | None) -> Iterator[None]:
    """Pace this rank's ``writes`` objects to ``store`` at its share of the job's rate while the
    block runs (collective: every rank of ``comm`` enters it, paced or not, so none waits alone).

    Args:
        writes: the objects this rank writes in the block (its parts and its done marker).
        cap: the job's most writes per second (``None``: only what the store taught).
    """
    pacer = write_pacer(store)
    mine = (max(1, writes), pacer.last_share, pacer.job_rate()) if pacer is not None else (1, None, None)
    gathered = comm.all_gather(mine)
    if pacer is None:
        yield
        return
    total = sum(n for n, _, _ in gathered)
    rate = job_rate([o for _, o, _ in gathered], [r for _, _, r in gathered])
    with pacer.sharing(max(1, writes) / total, rate=rate, cap=cap):
        yield
