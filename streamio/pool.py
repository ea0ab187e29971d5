"""The one stop-at-first-error thread pool of streamio: ``[fn(x) for x in items]`` in parallel.

Uploads, downloads and checksum passes all want the same thing from a pool: results in the order
of the inputs, and on a failure the first error at once, with the jobs not started yet cancelled
(a checkpoint part that failed makes the other 500 pointless). ``ThreadPoolExecutor.map`` raises
only when its iterator reaches the failed job, after every job queued before it ran.

Running jobs are never interrupted (Python threads cannot be): they finish before the pool
closes or :func:`run_detached` raises; its threads are daemons that nothing joins: for requests a
store may never answer, which a save's deadline abandons (:mod:`streamio.checkpoint.save.bound`;
a ``ThreadPoolExecutor``'s workers are joined at interpreter exit, so one stuck there hangs it).
A job that should stop early once another one failed checks a shared
:class:`threading.Event` itself (the S3 multipart upload does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, wait
from typing import TypeVar

from streamio import threads

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
    with threads.executor(min(concurrency, len(jobs)), name) as pool:
        return gather(pool, fn, jobs)


def run_detached(fn: Callable[[T], R], items: Iterable[T], *, concurrency: int, name: str = "streamio") -> list[R]:
    """:func:`run_parallel` on at most ``concurrency`` daemon threads that nothing joins: it returns
    once every job ended, or raises the first error once the jobs running then have ended too (jobs
    not started are skipped), so a caller that cleans up after the error finds nothing still being
    written. A caller that gives up waiting (a save's deadline, from another thread) leaves no
    thread for the interpreter's exit to wait for."""
    jobs = list(items)
    if not jobs:
        return []
    results: list[R | None] = [None] * len(jobs)
    lock = threading.Lock()
    ended = threading.Event()
    state = {"next": 0, "running": 0}
    errors: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                if errors or state["next"] >= len(jobs):
                    return
                i = state["next"]
                state["next"] += 1
                state["running"] += 1
            try:
                value, error = fn(jobs[i]), None
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
                value, error = None, exc
            with lock:
                state["running"] -= 1
                if error is None:
                    results[i] = value
                else:
                    errors.append(error)
                if not state["running"] and (errors or state["next"] >= len(jobs)):
                    ended.set()

    for n in range(max(1, min(concurrency, len(jobs)))):
        threads.start(work, name=f"{name}_{n}")
    ended.wait()
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]
