"""Batch bytes from DataLoader workers to the main process through shared memory, not a pipe.

A ``DataLoader`` worker hands each batch to the main process pickled through a pipe: every
``bytes`` member is copied into the pickle, through the kernel's 64 KiB pipe buffer (a context
switch per 64 KiB), into a fresh message buffer and out again into a new ``bytes``. Measured on 2
CPUs with 64 KB samples, that costs 1.5-2.5 CPU-seconds per GB, more than reading and verifying
the shards. Here each worker gets one ring of shared memory (``mmap`` made before the workers fork,
so there is nothing to name, leak or clean up); a batch's ``bytes`` lists are copied into the
ring once, the batch crosses the pipe as offsets, and the main process copies each member out
into a new ``bytes`` while unpickling it: users get the same ``list[bytes]``. A batch's numeric
numpy arrays (packed token sequences: :mod:`streamio.data.loader` stacks them in the worker
instead of making a shared-memory tensor each, which costs a segment and a file descriptor per
tensor) cross the same way and come out as new arrays.

Safety without relying on the DataLoader's internals: the main process publishes, under a lock
(a memory barrier on every CPU), the last batch of each worker it has copied out; a worker reuses
ring space only behind that mark. A batch that does not fit (the main process is behind, or one
batch is larger than the ring) simply crosses the pipe as before: nothing ever waits.

Address space. Each ring is a mapping of ``ring_bytes`` (the loader sizes it to what its batches
need: :func:`ring_bytes`, at most 256 MiB; only the pages used are ever touched) plus a header. The
main process maps one per worker; each worker, once started, unmaps every ring but its own
(:meth:`SharedBatches.keep_only`), so under an address-space limit (``ulimit -v``) a worker costs
one ring, not all of them. A ring that cannot be mapped (``ENOMEM`` under such a limit) turns the
transport off for that iteration, with one log line: batches cross through the pipe.

Only with the ``fork`` start method (Linux's default): with ``spawn``/``forkserver`` the rings
cannot be inherited and :class:`SharedBatches` turns itself off when pickled.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import multiprocessing
import platform
import sys
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SharedBatches", "forked_workers", "ring_bytes"]

log = logging.getLogger(__name__)

RESERVE = 256 << 20  # the most address space of a worker ring; only the pages used are ever touched
_HEADER = 64  # the ring's first bytes: the main process's "copied out up to" mark
# not charged to the commit limit where the flag's value is known (Linux x86-64 and arm64)
_NORESERVE = 0x4000 if sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64", "arm64") else 0
MIN_RING = 4 << 20
_MIN_PACKED = 16 << 10  # smaller batches cost less through the pipe than a ring lookup
_IN_FLIGHT = 8  # ring size: this many batches of the first one's size (prefetch_factor 2, with room)

_live: weakref.WeakValueDictionary[int, SharedBatches] = weakref.WeakValueDictionary()
_tokens = itertools.count(1)


def ring_bytes(batch_bytes: int) -> int:
    """The ring size for batches of about ``batch_bytes``: room for 2 x the batches in flight, bounded."""
    return min(RESERVE, max(MIN_RING, 2 * _IN_FLIGHT * batch_bytes))


def forked_workers(context: Any) -> bool:
    """Whether DataLoader workers started from ``context`` (None: torch's default) inherit memory by fork."""
    ctx = context if context is not None else multiprocessing
    if isinstance(ctx, str):
        return ctx == "fork"
    return ctx.get_start_method() == "fork"


class _Ring:
    """One worker's ring: written by that worker, copied out by the main process."""

    def __init__(self, ctx: Any, reserve: int) -> None:
        self.reserve = reserve
        self.mem = mmap.mmap(-1, _HEADER + reserve, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | _NORESERVE)
        self._done = memoryview(self.mem)[:8].cast("q")  # the last batch the main process copied out
        self.view = memoryview(self.mem)[_HEADER:]
        self.lock = ctx.Lock()  # a semaphore: its acquire and release are memory barriers on every CPU
        # worker side only
        self.size = 0
        self.head = 0
        self.seq = 0
        self.in_flight: deque[tuple[int, int, int]] = deque()  # (seq, start, end)

    def allocate(self, n: int) -> tuple[int, int] | None:
        """``(seq, start)`` of a free region of ``n`` bytes, or None when there is none now."""
        if not self.size:
            self.size = min(self.reserve, max(MIN_RING, _IN_FLIGHT * n))
        with self.lock:
            done = self._done[0]
        while self.in_flight and self.in_flight[0][0] <= done:
            self.in_flight.popleft()
        if not self.in_flight:
            self.head = 0
        start = self._fit(n)
        if start is None:
            return None
        self.seq += 1
        self.head = start + n
        self.in_flight.append((self.seq, start, self.head))
        return self.seq, start

    def _fit(self, n: int) -> int | None:
        if not self.in_flight:
            return 0 if n <= self.size else None
        tail = self.in_flight[0][1]
        if self.head >= tail:  # free: [head, size) and [0, tail)
            if self.head + n <= self.size:
                return self.head
            return 0 if n <= tail else None
        return self.head if self.head + n <= tail else None

    def copy_out(self, spans: list[int]) -> list[bytes]:
        view = self.view
        return [bytes(view[spans[i] : spans[i + 1]]) for i in range(0, len(spans), 2)]

    def copy_array(self, start: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        """A new array of ``dtype`` and ``shape`` from the ring's bytes at ``start``."""
        count = int(np.prod(shape))
        return np.frombuffer(self.view, dtype=dtype, count=count, offset=start).reshape(shape).copy()

    @property
    def consumed(self) -> int:
        """The last batch sequence number the main process copied out."""
        with self.lock:
            return int(self._done[0])

    def release(self, seq: int) -> None:
        """Tell the worker that batch ``seq`` (and every one before it) is copied out."""
        with self.lock:
            self._done[0] = seq

    def close(self) -> None:
        """Unmap the ring (in this process only)."""
        self.view.release()
        self._done.release()
        self.mem.close()


class SharedBatches:
    """The rings of one loader iteration's workers (see the module docstring).

    Make it in the main process before the workers start; :meth:`pack` runs in a worker on each
    collated batch. Pickling it (a ``spawn`` worker) gives a copy that packs nothing.

    Args:
        num_workers: the DataLoader's worker count.
        reserve: bytes of each worker's ring (see :func:`ring_bytes`).
    """

    def __init__(self, num_workers: int, reserve: int = RESERVE) -> None:
        ctx = multiprocessing.get_context("fork")
        self.token = next(_tokens)
        self._rings: list[_Ring] | None = []
        try:
            for _ in range(num_workers):
                self._rings.append(_Ring(ctx, reserve))
        except OSError as exc:  # ENOMEM under an address-space limit (ulimit -v): the pipe still works
            log.warning(
                "shared-memory rings of %d MiB for %d DataLoader workers could not be mapped (%s): batches "
                "cross through the pipe (correct, more CPU); raise the address-space limit (ulimit -v) to use them",
                reserve >> 20, num_workers, exc.strerror or exc,
            )
            self.close()
        _live[self.token] = self

    def __getstate__(self) -> dict[str, Any]:
        return {"token": self.token, "_rings": None}

    def pack(self, worker: int, batch: Any) -> Any:
        """``batch`` with its ``list[bytes]`` and numeric array values moved to this worker's ring, or as it was."""
        if self._rings is None or not isinstance(batch, dict):
            return batch
        keys = [k for k, v in batch.items() if type(v) is list and v and all(type(x) is bytes for x in v)]
        arrays = [k for k, v in batch.items() if type(v) is np.ndarray and v.dtype.kind in "biuf"]
        total = sum(len(x) for k in keys for x in batch[k]) + sum(batch[k].nbytes for k in arrays)
        if total < _MIN_PACKED:
            return batch
        ring = self._rings[worker]
        got = ring.allocate(total)
        if got is None:
            return batch
        seq, pos = got
        view = ring.view
        spans: dict[str, Any] = {}
        for k in keys:
            sp = spans[k] = []
            for x in batch[k]:
                end = pos + len(x)
                view[pos:end] = x
                sp += (pos, end)
                pos = end
        for k in arrays:
            arr = np.ascontiguousarray(batch[k])
            end = pos + arr.nbytes
            view[pos:end] = arr.reshape(-1).view(np.uint8).data
            spans[k] = (pos, arr.dtype.str, arr.shape)
            pos = end
        rest = {k: (None if k in spans else v) for k, v in batch.items()}  # keeps the key order
        return _Packed(self.token, worker, seq, rest, spans)

    def close(self) -> None:
        """Release the rings (batches still in the pipe can no longer be unpacked)."""
        rings, self._rings = self._rings, None
        _live.pop(self.token, None)
        for ring in rings or ():
            ring.close()

    def keep_only(self, worker: int) -> None:
        """In DataLoader worker ``worker``: unmap every ring this process inherited but its own.

        The other workers' rings of this iteration, and every ring of older iterations still alive
        in the main process when it forked, cost this worker address space and nothing else.
        """
        for shared in list(_live.values()):
            for i, ring in enumerate(shared._rings or ()):
                if not (shared is self and i == worker) and not ring.mem.closed:
                    ring.close()
            if shared is not self:
                shared._rings = None


class _Packed:
    """A batch whose bytes wait in a ring; unpickling it in the main process copies them out."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __reduce__(self) -> tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]:
        return _unpack, self.args


def _unpack(token: int, worker: int, seq: int, rest: dict[str, Any], spans: dict[str, Any]) -> dict[str, Any]:
    owner = _live.get(token)
    if owner is None or owner._rings is None:
        raise RuntimeError("a DataLoader batch arrived after its loader's iteration ended; its bytes are gone")
    ring = owner._rings[worker]
    for k, sp in spans.items():
        rest[k] = ring.copy_out(sp) if type(sp) is list else ring.copy_array(*sp)
    ring.release(seq)
    return rest
