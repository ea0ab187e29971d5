"""Progress of the long verbs (``shard``, ``index``, ``verify``, ``ckpt verify``, ``ckpt gc``) on stderr.

One display for every verb, chosen by where stderr goes:

* **a terminal**: a tqdm bar with the total, the rate and the ETA when the total is known, and
  MB/s once there is something to divide (at least :data:`MIN_RATE_S` seconds and one byte: a
  rate over the first milliseconds is noise, and "0.0 MB/s" before the first shard is done is
  false);
* **anything else** (a log file, a CI job, a pipe): one plain line every ``interval`` seconds,
  ``index: 37/100 shards (37%), 1.2 GB, 45.3 MB/s, elapsed 0:00:27, ETA 0:00:46``, and a last one
  at the end if any was printed, so a short run stays silent and a long one is visible in a log.

The library never prints: its long functions take a callback ``progress(done, total, nbytes)``
(cumulative items done, the total when known, bytes processed), which :meth:`Progress.report`
is. The clock and the stream are passed in, so the plain lines are tested without sleeping.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["INTERVAL_S", "MIN_RATE_S", "Progress", "human_bytes", "plural"]

#: no rate (MB/s, ETA) is shown before this many seconds have passed
MIN_RATE_S = 1.0
#: seconds between plain progress lines (stderr not a terminal)
INTERVAL_S = 5.0


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, "shard")`` -> ``"1 shard"``, ``plural(3, "shard")`` -> ``"3 shards"`` (with thousands commas)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def human_bytes(n: float) -> str:
    """``1234567`` -> ``"1.2 MB"`` (decimal units, as storage is billed)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"  # pragma: no cover - the loop returns at TB


def _clock_text(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """The progress of one verb: a bar on a terminal, a plain line every ``interval`` s otherwise.

    Thread-safe: library functions may report from their worker threads.

    Args:
        desc: the verb, first on every line (``"index"``).
        unit: what is counted (``"shard"``, ``"sample"``, ``"file"``, ``"object"``).
        total: how many there are, when known before the first (:meth:`report` may set it later).
        stream: where to write (default: stderr).
        clock: seconds, monotonic (default: :func:`time.monotonic`).
        interval: seconds between plain lines (default :data:`INTERVAL_S`).
        tty: force the bar (True) or plain lines (False); default: whether ``stream`` is a terminal.
        enabled: False shows nothing (``--quiet``).
    """

    def __init__(
        self,
        desc: str,
        *,
        unit: str = "sample",
        total: int | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float | None = None,
        tty: bool | None = None,
        enabled: bool = True,
    ) -> None:
        self.desc, self.unit, self.total = desc, unit, total
        self.done = 0
        self.nbytes = 0
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._interval = INTERVAL_S if interval is None else interval
        self._start = clock()
        self._last_line = self._start
        self._lines = 0
        self._lock = threading.Lock()
        self._closed = not enabled
        self._bar: Any = None
        self._use_bar = enabled and (tty if tty is not None else _isatty(self._stream))

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        """``n`` more items done, ``nbytes`` more bytes processed."""
        with self._lock:
            self._set(self.done + n, self.total, self.nbytes + nbytes)

    def report(self, done: int, total: int | None, nbytes: int) -> None:
        """The library's callback: cumulative ``done`` of ``total`` items, ``nbytes`` bytes so far."""
        with self._lock:
            self._set(done, total, nbytes)

    def close(self) -> None:
        """End the display: close the bar, or print the last plain line if any was printed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._bar is not None:
                self._bar.close()
            elif self._lines:
                self._print_line(self._clock())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self, now: float | None = None) -> str:
        """The plain progress line as of ``now`` (default: the clock)."""
        now = self._clock() if now is None else now
        elapsed = now - self._start
        count = f"{self.done:,}/{plural(self.total, self.unit)}" if self.total is not None else plural(
            self.done, self.unit)
        parts = [f"{self.desc}: {count}"]
        if self.total:
            parts[0] += f" ({100 * self.done // self.total}%)"
        if self.nbytes:
            parts.append(human_bytes(self.nbytes))
        rate = self._rate(elapsed)
        if rate is not None and self.nbytes:
            parts.append(f"{human_bytes(self.nbytes / elapsed)}/s")
        parts.append(f"elapsed {_clock_text(elapsed)}")
        if rate and self.total is not None and self.done < self.total:
            parts.append(f"ETA {_clock_text((self.total - self.done) / rate)}")
        return ", ".join(parts)

    # ------------------------------------------------------------------ internals (under the lock)
    def _rate(self, elapsed: float) -> float | None:
        """Items per second, or None while too little time has passed to say."""
        if elapsed < MIN_RATE_S:
            return None
        return self.done / elapsed

    def _set(self, done: int, total: int | None, nbytes: int) -> None:
        if self._closed:
            return
        self.total = total if total is not None else self.total
        step, self.done, self.nbytes = done - self.done, done, nbytes
        now = self._clock()
        if self._use_bar:
            if self._bar is None:  # at the first report, which gives the total when the caller knows it
                self._bar = _new_bar(self.desc, self.unit, self.total, self._stream)
            if self._bar.total != self.total:
                self._bar.total = self.total
                self._bar.refresh()
            elapsed = now - self._start
            if self.nbytes and elapsed >= MIN_RATE_S:
                self._bar.set_postfix_str(f"{human_bytes(self.nbytes / elapsed)}/s", refresh=False)
            self._bar.update(step)
        elif now - self._last_line >= self._interval:
            self._print_line(now)

    def _print_line(self, now: float) -> None:
        self._last_line = now
        self._lines += 1
        print(self.line(now), file=self._stream, flush=True)


def _new_bar(desc: str, unit: str, total: int | None, stream: TextIO) -> Any:
    from tqdm import tqdm  # only a terminal pays for it

    if _columns(stream):
        size: dict[str, Any] = {"dynamic_ncols": True}  # follows the terminal's width as it is resized
    else:  # a pty that reports 0 x 0 (a bare `docker -t`): tqdm would draw a 0-wide bar, i.e. nothing
        fallback = shutil.get_terminal_size()
        size = {"ncols": fallback.columns, "nrows": fallback.lines}
    return tqdm(total=total, desc=desc, unit=unit, file=stream, leave=True, **size)


def _columns(stream: TextIO) -> int:
    """The terminal's width, 0 when it does not say."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return 0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
