"""What the trainer reports: a log line per interval, a JSON line per event, a final summary.

* :class:`Meter`: samples, data-stall seconds and checkpoint-blocked milliseconds over one log
  interval, rendered as the ``step ... samples/s, data stall ..%, ckpt blocked .. ms`` line.
  The *data stall* is the time the loop waited for its next batch.
* :class:`EpochMeter`: one ``epoch N done ...`` line per epoch: the shares of the epoch's wall time
  the loop waited for data and blocked in checkpoint saves (the loop's own timers, as in the interval
  line: they hold for any data source), and the store traffic of the epoch (this process and its
  DataLoader workers, from :func:`streamio.metrics.snapshot` deltas: :class:`StoreTotals`).
* :class:`MetricsLog`: one JSON object per line in ``out_dir/rank-NNNNN.jsonl`` (events ``step``,
  ``val``, ``resume``, ``summary``), flushed at every write so a crashed run keeps what it logged;
  :func:`read_metrics` reads such a file back (tests and the demo's comparison).
* :class:`Summary`: what a whole run did, returned by :meth:`~streamio.train.loop.Trainer.run`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamio import metrics
from streamio.metrics.catalog import STORE_BYTES_READ, STORE_BYTES_WRITTEN, STORE_REQUESTS


@dataclass
class Summary:
    """What a run did; returned by :meth:`~streamio.train.loop.Trainer.run` and logged by rank 0."""

    resumed_from: int | None = None
    steps: int = 0
    epochs: int = 0
    stopped_early: bool = False
    stop_epoch: int | None = None
    best_val_loss: float | None = None
    best_epoch: int | None = None
    last_val_loss: float | None = None
    patience_counter: int = 0
    wall_s: float = 0.0
    samples_per_s: float = 0.0
    data_stall_fraction: float = 0.0
    ckpt_blocked_ms_total: float = 0.0
    ckpt_blocked_ms_max: float = 0.0
    checkpoints: int = 0

    def saved(self, blocked_ms: float) -> float:
        """Count a checkpoint save that blocked the loop ``blocked_ms``; returns ``blocked_ms``."""
        self.checkpoints += 1
        self.ckpt_blocked_ms_total += blocked_ms
        self.ckpt_blocked_ms_max = max(self.ckpt_blocked_ms_max, blocked_ms)
        return blocked_ms


@dataclass
class Meter:
    """Telemetry over one log interval."""

    start: float = field(default_factory=time.perf_counter)
    samples: int = 0
    stall_s: float = 0.0
    ckpt_ms: float = 0.0

    def line(self, step: int, epoch: int, loss: float, lr: float) -> str:
        wall = max(time.perf_counter() - self.start, 1e-9)
        return (
            f"step {step} epoch {epoch} loss {loss:.4f} lr {lr:.2e} | {self.samples / wall:,.0f} samples/s, "
            f"data stall {100 * self.stall_s / wall:.1f}%, ckpt blocked {self.ckpt_ms:.1f} ms"
        )


@dataclass(frozen=True)
class StoreTotals:
    """Store traffic so far, from a :func:`streamio.metrics.snapshot` (subtract two for an interval).

    Attributes:
        read: object body bytes received.
        written: object body bytes sent.
        requests: HTTP attempts (file:// and memory:// calls), every outcome.
        throttled: attempts answered 503/429 SlowDown.
        failed: requests that failed after their retries.
    """

    read: float = 0.0
    written: float = 0.0
    requests: float = 0.0
    throttled: float = 0.0
    failed: float = 0.0

    @classmethod
    def of(cls, snap: dict[str, Any]) -> StoreTotals:
        """The totals in ``snap`` (a snapshot; its request series are keyed ``op="get",outcome="ok"``)."""
        requests = snap.get(STORE_REQUESTS.name) or {}

        def outcome(name: str) -> float:
            return float(sum(n for labels, n in requests.items() if f'outcome="{name}"' in labels))

        return cls(float(snap.get(STORE_BYTES_READ.name, 0.0)), float(snap.get(STORE_BYTES_WRITTEN.name, 0.0)),
                   float(sum(requests.values())), outcome("throttled"), outcome("failed"))

    @classmethod
    def now(cls) -> StoreTotals:
        """This process's totals now (its forked workers' reports included)."""
        return cls.of(metrics.snapshot())

    def __sub__(self, other: StoreTotals) -> StoreTotals:
        return StoreTotals(self.read - other.read, self.written - other.written, self.requests - other.requests,
                           self.throttled - other.throttled, self.failed - other.failed)


class EpochMeter:
    """Where one epoch's time went, for its summary line: :meth:`begin`, then :meth:`end`.

    Args:
        totals: the loop's running totals now: data stall seconds and checkpoint-blocked milliseconds.
    """

    def __init__(self, totals: Callable[[], tuple[float, float]]) -> None:
        self.totals = totals
        self.start, (self.stall_s, self.ckpt_ms), self.store = time.perf_counter(), (0.0, 0.0), StoreTotals()

    def begin(self) -> None:
        """The epoch starts now: take the running totals."""
        self.start, (self.stall_s, self.ckpt_ms), self.store = time.perf_counter(), self.totals(), StoreTotals.now()

    def end(self, epoch: int, log: logging.Logger | None) -> None:
        """The epoch ended: log its line to ``log`` (None: this rank does not log)."""
        if log is not None:
            log.info("%s", self.line(epoch, *self.totals(), StoreTotals.now()))

    def line(self, epoch: int, stall_s: float, ckpt_ms: float, store: StoreTotals) -> str:
        """``epoch N done in S s | data wait W%, ckpt blocked C% | store R MB read, ...``, given the
        running totals now."""
        wall = max(time.perf_counter() - self.start, 1e-9)
        moved = store - self.store
        return (
            f"epoch {epoch} done in {wall:.2f} s | data wait {100 * (stall_s - self.stall_s) / wall:.1f}%, "
            f"ckpt blocked {100 * (ckpt_ms - self.ckpt_ms) / 1000 / wall:.1f}% | store {moved.read / 1e6:.2f} MB "
            f"read, {moved.written / 1e6:.2f} MB written, {moved.requests:.0f} requests "
            f"({moved.throttled:.0f} throttled, {moved.failed:.0f} failed)"
        )


class MetricsLog:
    """One JSON object per line in ``out_dir/rank-NNNNN.jsonl``, flushed at every write."""

    def __init__(self, out_dir: str | os.PathLike[str], rank: int) -> None:
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / f"rank-{rank:05d}.jsonl"
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, **record: Any) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a ``rank-NNNNN.jsonl`` file (for tests and the demo's comparison)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
