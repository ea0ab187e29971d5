"""What the trainer reports: a log line per interval, a JSON line per event, a final summary.

* :class:`Meter`: samples, data-stall seconds and checkpoint-blocked milliseconds over one log
  interval, rendered as the ``step ... samples/s, data stall ..%, ckpt blocked .. ms`` line.
  The *data stall* is the time the loop waited for its next batch.
* :class:`MetricsLog`: one JSON object per line in ``out_dir/rank-NNNNN.jsonl`` (events ``step``,
  ``val``, ``resume``, ``summary``), flushed at every write so a crashed run keeps what it logged;
  :func:`read_metrics` reads such a file back (tests and the demo's comparison).
* :class:`Summary`: what a whole run did, returned by :meth:`~streamio.train.loop.Trainer.run`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
