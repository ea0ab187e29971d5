"""Counters, gauges and histograms whose hot path takes no lock.

Each thread adds to a cell of its own (a dict keyed by label values, reached through a
``threading.local``); a reader copies every thread's cell, which under the GIL is one C call that no
other thread interleaves with, and sums. So an increment is a dict update in the calling thread,
and a thread that dies mid-update (a DataLoader worker killed by a signal) can leave no lock held.
A thread's cell is registered once, under a lock, when that thread first records; the cells of
threads that ended are folded into one (their counts stay part of the process's total) when the
values are read or the list of cells grows, so a process that starts threads by the thousand (a
prefetcher's per epoch) keeps a cell per live thread only.

After ``fork`` the child starts from zero (:meth:`Instrument.forget`, called by
:mod:`streamio.metrics.processes`): its totals are reported beside the parent's, not on top of them.

Values, per label key (a tuple of label values in declaration order):

* :class:`Counter`: a float that only grows;
* :class:`Gauge` ``mode="sum"``: a float moved up and down by :meth:`Gauge.add` from any thread, the
  sum of the threads' moves (shards fetched ahead); ``mode="latest"``: ``(value, time)``, the value
  most recently :meth:`Gauge.set` in any thread or process (bytes the node cache holds);
* :class:`Histogram`: per-bucket counts (not cumulative), then the sum and the count.

``STREAMIO_METRICS=off`` (read once, at import) replaces the four recording methods by one that
returns at once: nothing is counted, at the cost of a method call (the on/off benchmark compares
the two; users who want no cost at all set it).
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

__all__ = ["METRICS_ENV", "RECORDING", "Counter", "Gauge", "Histogram", "Instrument", "LabelKey", "merge_values"]

log = logging.getLogger(__name__)

METRICS_ENV = "STREAMIO_METRICS"
"""``off`` (or ``0``, ``false``, ``no``) turns recording off in this process and the ones it starts."""


def _recording(value: str) -> bool:
    word = value.strip().lower()
    if word in ("off", "0", "false", "no"):
        return False
    if word not in ("", "on", "1", "true", "yes"):
        log.warning("%s=%r is neither on nor off: metrics stay on (set it to off to stop recording)",
                    METRICS_ENV, value)
    return True


RECORDING = _recording(os.environ.get(METRICS_ENV, ""))
"""Whether this process records (``STREAMIO_METRICS`` at import)."""

LabelKey = tuple[str, ...]
Values = dict[LabelKey, Any]


class Instrument:
    """One named metric with fixed label names; see the module docstring.

    Args:
        name: the Prometheus name (``streamio_store_requests_total``).
        help: one line saying what it counts, for ``/metrics`` and the docs.
        labels: the label names, in order.
    """

    kind = "untyped"
    on_first_record: Callable[[], object] = staticmethod(lambda: None)
    """Called when a thread records into any instrument for the first time (set by the registry)."""

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:  # noqa: A002 - Prometheus' word
        self.name, self.help, self.labels = name, help, tuple(labels)
        self.forget()

    def forget(self) -> None:
        """Start from nothing (a forked child; tests). The lock is new too: another thread may have
        held it at the fork, and the child's copy would stay held."""
        self._lock = threading.Lock()
        self._local = threading.local()
        self._cells: list[tuple[threading.Thread, Values]] = []
        self._ended: Values = {}  # the cells of threads that ended, merged
        self._pruned_at = 0

    def _cell(self) -> Values:
        cell = getattr(self._local, "cell", None)
        if cell is None:
            cell = self._local.cell = {}
            with self._lock:
                self._cells.append((threading.current_thread(), cell))
                if len(self._cells) >= 2 * self._pruned_at + 16:
                    self._fold_ended()
            Instrument.on_first_record()
        return cell

    def _fold_ended(self) -> None:  # under self._lock
        live = []
        for thread, cell in self._cells:
            if thread.is_alive():
                live.append((thread, cell))
            else:  # it records no more: its cell is final
                merge_values(self, self._ended, cell)
        self._cells, self._pruned_at = live, len(live)

    def key(self, values: Sequence[str]) -> LabelKey:
        """The label key of ``values`` (checked against the label names: a typo must not invent a series)."""
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {tuple(values)}")
        return tuple(values)

    def values(self) -> Values:
        """This process's values, per label key (the threads' cells merged)."""
        with self._lock:
            self._fold_ended()
            cells = [cell for _, cell in self._cells]
            out: Values = {}
            merge_values(self, out, self._ended)
        for cell in cells:
            merge_values(self, out, cell.copy())
        return out


class Counter(Instrument):
    """A total that only grows (requests, bytes)."""

    kind = "counter"

    def add(self, amount: float = 1.0, *labels: str) -> None:
        """Add ``amount`` (>= 0) to the series of ``labels``."""
        cell = getattr(self._local, "cell", None) or self._cell()
        key = labels if len(labels) == len(self.labels) else self.key(labels)
        cell[key] = cell.get(key, 0.0) + amount


class Gauge(Instrument):
    """A value that goes up and down; ``mode`` says how threads' and processes' values combine."""

    kind = "gauge"

    def __init__(
        self, name: str, help: str, labels: Sequence[str] = (), *, mode: Literal["sum", "latest"] = "sum",  # noqa: A002
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mode, self._clock = mode, clock
        super().__init__(name, help, labels)

    def add(self, delta: float, *labels: str) -> None:
        """Move the series of ``labels`` by ``delta`` (``mode="sum"``)."""
        cell = getattr(self._local, "cell", None) or self._cell()
        key = labels if len(labels) == len(self.labels) else self.key(labels)
        cell[key] = cell.get(key, 0.0) + delta

    def set(self, value: float, *labels: str) -> None:
        """Make ``value`` the series' value as of now (``mode="latest"``)."""
        cell = getattr(self._local, "cell", None) or self._cell()
        cell[self.key(labels)] = (float(value), self._clock())


class Histogram(Instrument):
    """How values spread over ``buckets`` (upper bounds, seconds or bytes), with their sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help: str, labels: Sequence[str] = (), *, buckets: Sequence[float]) -> None:  # noqa: A002
        bounds = sorted(float(b) for b in buckets if not math.isinf(b))
        if not bounds:
            raise ValueError(f"{name}: a histogram needs at least one finite bucket bound")
        self.buckets = tuple(bounds)
        super().__init__(name, help, labels)

    def observe(self, value: float, *labels: str) -> None:
        """Count one ``value`` in the series of ``labels``."""
        cell = getattr(self._local, "cell", None) or self._cell()
        key = labels if len(labels) == len(self.labels) else self.key(labels)
        row = cell.get(key)
        row = [0] * (len(self.buckets) + 1) + [0.0, 0] if row is None else list(row)
        row[bisect.bisect_left(self.buckets, value)] += 1
        row[-2] += value
        row[-1] += 1
        cell[key] = row  # a new list, published whole: a reader never sees a count without its bucket


def merge_values(instrument: Instrument, into: Values, more: Values) -> None:
    """Add ``more`` (one thread's or one process's values of ``instrument``) into ``into``."""
    for key, value in more.items():
        have = into.get(key)
        if have is None:
            into[key] = list(value) if isinstance(value, list) else value
        elif isinstance(instrument, Histogram):
            into[key] = [a + b for a, b in zip(have, value, strict=True)]
        elif isinstance(instrument, Gauge) and instrument.mode == "latest":
            into[key] = max(have, value, key=lambda v: v[1])
        else:
            into[key] = have + value


def _off(self: Instrument, value: float = 1.0, *labels: str) -> None:
    """What every recording method is when ``STREAMIO_METRICS=off``: nothing."""


if not RECORDING:
    Counter.add = Gauge.add = Gauge.set = Histogram.observe = _off  # type: ignore[method-assign,assignment]
