"""The one stop-at-first-error thread pool of streamio: ``[fn(x) for x in items]`` in parallel.

Uploads, downloads and checksum passes all want the same thing from a pool: results in the order
of the inputs, and on a failure the first error at once, with the jobs not started yet cancelled
(a checkpoint part that failed makes the other 500 pointless). ``ThreadPoolExecutor.map`` raises
only when its iterator reaches the failed job, after every job queued before it ran.

Running jobs are never interrupted (Python threads cannot be): they finish before the pool
closes. A job that should stop early once another one failed checks a shared
:class:`threading.Event` itself (the S3 multipart upload does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def gather(pool: Executor, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[fn(x) for x in items]`` run on ``pool``, in order.

    Raises:
        The first error a job raised, as soon as it happens; the jobs not started yet are
        cancelled (running ones finish in the background of ``pool``).
    """
    futures: list[Future[R]] = [pool.submit(fn, x) for x in items]
    _, pending = wait(futures, return_when=FIRST_EXCEPTION)
    for f in futures:
        if f.done() and f.exception() is not None:
            for p in pending:
                p.cancel()
            raise f.exception()  # type: ignore[misc]
    return [f.result() for f in futures]


def run_parallel(fn: Callable[[T], R], items: Iterable[T], *, concurrency: int, name: str = "streamio") -> list[R]:
    """:func:`gather` on a pool of its own of at most ``concurrency`` threads (named ``name``),
    closed (running jobs finished) before it returns or raises."""
    jobs = list(items)
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs))), thread_name_prefix=name) as pool:
        return gather(pool, fn, jobs)
