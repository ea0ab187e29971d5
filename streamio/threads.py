"""Threads that streamio starts, made safe to ``fork`` around (DataLoader workers).

A thread that used OpenSSL (a botocore client builds an ``SSLContext``) runs OpenSSL's thread-exit
handler after its Python code ended, holding a process-wide OpenSSL lock. A ``fork`` in that
window copies the lock held into the child, where no thread will ever release it: the child's
first ``SSLContext`` (its first S3 request) then waits forever. Measured here (OpenSSL 3.0, a pool
of 4 short-lived threads building contexts while the main thread forks): 15 of 300 children hung;
``Thread.join()`` does not help, it returns before the exit handler runs. That is how a
``StreamingDataset`` (its sources' indexes read on a short-lived pool) made right before a
DataLoader started its workers gave a worker a first request that never got an answer.

So every thread streamio starts records, as its very last Python step, that it is ending
(:func:`start`; pools from :func:`executor` record theirs once they are shut down), and a fork
first waits, at most :data:`FORK_WAIT_S`, until the ending threads are gone from
``/proc/self/task`` (Linux; elsewhere nothing is waited for). Threads that live on are not waited
for: only a thread that is exiting runs the handler.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["FORK_WAIT_S", "executor", "start", "wait_for_ending"]

FORK_WAIT_S = 1.0
"""The most a fork waits for streamio's ending threads to be gone (a loaded machine may take a
few milliseconds per thread; a thread id reused by a live thread costs this once)."""

_TASKS = "/proc/self/task"
_ending: set[int] = set()
_lock = threading.Lock()


def _record_ending(native_ids: list[int]) -> None:
    if sys.platform == "linux":
        with _lock:
            _ending.update(native_ids)


def start(target: Callable[..., object], *, name: str, args: tuple[Any, ...] = ()) -> threading.Thread:
    """Start ``target(*args)`` on a daemon thread called ``name`` that a fork waits for while it exits."""

    def run() -> None:
        try:
            target(*args)
        finally:
            _record_ending([threading.get_native_id()])

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class _Executor(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` whose threads a fork waits for once the pool is shut down."""

    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        self._native_ids: list[int] = []
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix,
                         initializer=lambda: self._native_ids.append(threading.get_native_id()))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        _record_ending(list(self._native_ids))


def executor(max_workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool of at most ``max_workers`` threads named ``name``, safe to fork around once closed."""
    return _Executor(max_workers=max(1, max_workers), thread_name_prefix=name)


def wait_for_ending(timeout: float = FORK_WAIT_S, *, tasks: str = _TASKS) -> None:
    """Wait until the threads that recorded their ending are gone (at most ``timeout`` seconds)."""
    with _lock:
        ids = set(_ending)
        _ending.clear()
    deadline = time.monotonic() + timeout
    for tid in ids:
        while os.path.exists(f"{tasks}/{tid}") and time.monotonic() < deadline:
            time.sleep(0.0002)


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork: the child's copy stays held
    _ending.clear()  # the parent's threads are not the child's


os.register_at_fork(before=wait_for_ending, after_in_child=_forget_in_child)
