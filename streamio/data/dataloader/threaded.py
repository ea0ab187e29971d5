"""Batches made on threads of the training process, handed out in order (``StreamingDataLoader(threads=N)``).

Why threads. A ``DataLoader`` worker is a process: each batch it makes is pickled to the main
process (or copied through a shared-memory ring), every worker faults in its own pages and pays
torch's worker machinery (measured on 2 cores, batch 8: 0.68 CPU-s per GB for that machinery
alone; the loader with 2 workers 2.05 CPU-s per GB against 1.12 without workers). What a batch
costs is mostly code that releases the GIL: fetching (the dataset's prefetch threads), CRC32C,
zstd, numpy copies, PIL's JPEG decode and resize. So the same work on threads of one process
scales across cores without any transport: a batch is made where it is used.

The shape (SPDL's, and ``DataLoader``'s own with workers, on threads):

* one **feeder** thread iterates the source (the dataset's samples as read: verified, members
  still bytes) and cuts it into batches of ``batch_size``, the last one partial unless
  ``drop_last``, exactly as ``DataLoader``'s single-process fetcher cuts them;
* ``threads`` **pool** threads each make whole batches: ``collate([prepare(s) for s in batch])``
  (``prepare``: decode, then transform). A whole batch per job, as a ``DataLoader`` worker makes
  one: one hand-off per batch, not per sample;
* the **consumer** (the training loop's ``next()``) takes batch ``i`` once it is made, in order,
  so the batches are those of ``num_workers=0``: the same samples, order and cuts.

Memory: at most ``depth`` batches are in flight (cut and queued, being made, or made and not yet
handed out); the feeder waits for a slot before it queues another, and holds at most the one it is
cutting. The default depth is ``2 x threads``: torch's default ``prefetch_factor`` per worker.

Errors keep their place: a job's error is raised by ``next()`` at its batch's place, after every
earlier batch and before any later one; an error of the source (a shard that cannot be read) at the
place of the batch it was cutting. The exception is raised as it was made, so its traceback holds
the pool thread's frames (the user's transform) under the consumer's. After an error the iteration
is over (as a generator's is).

Shutdown (:meth:`ThreadedBatches.close`, which the loader calls when its iteration ends, raises,
is broken out of, is garbage-collected or is interrupted): the feeder stops at its next sample or
slot wait and closes the source in its own thread (a generator can only be closed by the thread
that runs it: the dataset's prefetch threads stop with it); pool threads finish the job they are
running (a thread cannot be interrupted) and skip the queued ones. The threads are joined within
:data:`JOIN_S` in all, and not at all when a Ctrl-C reached the loop inside ``next()``; they are
daemon threads started through :func:`streamio.threads.start` (a fork waits for them while they
exit), so a transform that never returns can neither hang the loop's exit nor the interpreter's.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from streamio import threads as streamio_threads

__all__ = ["JOIN_S", "ThreadedBatches"]

log = logging.getLogger(__name__)

JOIN_S = 5.0
"""The most :meth:`ThreadedBatches.close` waits for its threads (a job running, a sample being read);
torch's DataLoader waits as long for each worker process before it terminates it."""


class ThreadedBatches:
    """``collate([prepare(s) for s in batch])`` for each batch cut from ``samples``, on threads, in order.

    Iterate it once; :meth:`close` it when done (also after an error, or to stop early).

    Args:
        samples: the source, read on the feeder thread only (and closed there, if it has ``close``).
        prepare: the per-sample work (decode + transform); called on the pool threads, several at once.
        collate: a batch's prepared samples -> the batch; called on the pool threads.
        batch_size: samples per batch.
        drop_last: drop a last batch smaller than ``batch_size`` (``DataLoader``'s ``drop_last``).
        threads: pool threads (>= 1).
        depth: the most batches in flight (>= 1); default ``2 * threads``.
        name: the threads' name prefix (``{name}-feed``, ``{name}-0``, ...).
    """

    def __init__(  # noqa: PLR0913 - the pipeline's parts and its two bounds, all keyword
        self,
        samples: Iterator[Any],
        *,
        prepare: Callable[[Any], Any],
        collate: Callable[[list[Any]], Any],
        batch_size: int,
        drop_last: bool,
        threads: int,
        depth: int | None = None,
        name: str = "streamio-loader",
    ) -> None:
        self._prepare, self._collate = prepare, collate
        self._size, self._drop_last = batch_size, drop_last
        self._depth = depth if depth is not None else 2 * threads
        self._slots = threading.Semaphore(self._depth)
        self._jobs: queue.SimpleQueue[tuple[int, list[Any]] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._made: dict[int, tuple[bool, Any]] = {}  # batch -> (ok, batch or its error)
        self._end: int | None = None  # batches the source gave, once it ended or failed
        self._error: BaseException | None = None  # the source's error, raised at batch `_end`
        self._next = 0
        self._cutting = 0  # the batch the feeder cuts now
        self._over = False  # the consumer saw the end, or an error
        self._closed = False
        self._threads = [streamio_threads.start(self._feed, name=f"{name}-feed", args=(samples,))]
        self._threads += [streamio_threads.start(self._work, name=f"{name}-{i}") for i in range(threads)]

    # ------------------------------------------------------------------ the consumer
    def __iter__(self) -> ThreadedBatches:
        return self

    def __next__(self) -> Any:
        if self._over:
            raise StopIteration
        i = self._next
        with self._cond:
            while i not in self._made and i != self._end:
                self._cond.wait()
            made, error = self._made.pop(i, None), self._error
        if made is None:  # the source ended or failed here
            self._over, self._error = True, None
            if error is not None:
                raise error
            raise StopIteration
        self._next = i + 1
        self._slots.release()
        ok, value = made
        if not ok:
            self._over = True  # nothing after an error
            raise value
        return value

    # ------------------------------------------------------------------ the threads
    def _feed(self, samples: Iterator[Any]) -> None:
        """Cut ``samples`` into batches (:meth:`_cut`), then close it and record where it ended."""
        count, error = 0, None
        try:
            count = self._cut(samples)
        except BaseException as exc:  # noqa: BLE001 - any error of the source is the consumer's, in its place
            count, error = self._cutting, exc
        finally:
            close = getattr(samples, "close", None)
            try:
                if close is not None:
                    close()
            except BaseException as exc:  # noqa: BLE001 - the consumer must learn where the source ended
                error = error or exc
            with self._cond:
                self._end, self._error = count, error
                self._cond.notify_all()

    def _cut(self, samples: Iterator[Any]) -> int:
        """Queue the batches of ``samples``; how many (so far, when stopped)."""
        batch: list[Any] = []
        for sample in samples:
            if self._stop.is_set():
                break
            batch.append(sample)
            if len(batch) == self._size:
                if not self._queue(self._cutting, batch):
                    break
                self._cutting, batch = self._cutting + 1, []
        else:
            if batch and not self._drop_last and self._queue(self._cutting, batch):
                self._cutting += 1
        return self._cutting

    def _queue(self, i: int, batch: list[Any]) -> bool:
        self._slots.acquire()  # close() releases every slot once more, so a stop never waits here
        if self._stop.is_set():
            return False
        self._jobs.put((i, batch))
        return True

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._stop.is_set():
                continue  # closing: skip what is queued
            i, batch = job
            try:
                made = True, self._collate([self._prepare(s) for s in batch])
            except BaseException as exc:  # noqa: BLE001 - raised by the consumer at this batch's place
                made = False, exc
            with self._cond:
                self._made[i] = made
                self._cond.notify_all()

    # ------------------------------------------------------------------ shutdown
    def close(self, *, wait: bool = True) -> None:
        """Stop the threads: the feeder at its next sample, the pool after its running jobs (see the
        module docstring); all of them joined within :data:`JOIN_S`, or not at all without ``wait``
        (Ctrl-C: the process is about to end, and they are daemon threads). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for _ in range(self._depth):
            self._slots.release()
        for _ in self._threads[1:]:
            self._jobs.put(None)
        if not wait:
            return
        deadline = time.monotonic() + JOIN_S
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning(
                "loader threads %s still run %.0f s after the iteration ended (a transform or a read that has "
                "not returned); they are daemon threads and stop when it returns", alive, JOIN_S,
            )
        with self._cond:
            self._made.clear()  # made batches nobody will take
