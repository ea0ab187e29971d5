"""The timed training loop every data contender runs, and the rank-process protocol around it
(stdlib only: peers import it from their own environments too, see ``benchmarks/peer_mosaicml.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any


def timed_epoch(loader: Iterable[dict[str, Any]], compute_s: float, epoch: int = 0) -> dict[str, Any]:
    """Iterate ``loader`` once, sleeping ``compute_s`` per batch (simulated compute).

    Returns samples, wall time from ``iter(loader)`` to the last batch (worker start-up included),
    the time spent waiting in ``next()`` and the wait for the first batch.
    """
    samples, waited, first = 0, 0.0, None
    t0 = time.perf_counter()
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        dt = time.perf_counter() - t
        waited += dt
        first = dt if first is None else first
        samples += len(batch["__key__"])
        if compute_s:
            time.sleep(compute_s)
    wall = time.perf_counter() - t0
    return {"epoch": epoch, "samples": samples, "wall_s": wall, "wait_s": waited, "first_batch_s": first or 0.0}


def serve(run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """A rank process of ``bench_dataset.RankPool``: one JSON config per stdin line, answered by
    one ``RESULT {json}`` line (``{"error": traceback}`` when ``run`` raised)."""
    import json
    import sys
    import traceback

    for line in sys.stdin:
        try:
            res = run(json.loads(line))
        except Exception:  # noqa: BLE001 - reported to the driver, which raises
            res = {"error": traceback.format_exc()}
        print("RESULT " + json.dumps(res), flush=True)
