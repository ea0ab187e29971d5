"""streamio's threads record their ending, and a fork waits until the ending ones are gone.

Why (streamio/threads.py): a thread that built an SSLContext runs OpenSSL's exit handler under a
process-wide lock after its Python code returned; a fork in that window hangs the child's first
SSLContext for good. The hang itself is a race (measured: 15 of 300 forks beside a churning pool
of short-lived threads); these tests pin what streamio does about it, deterministically.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamio import threads
from streamio.pool import run_detached, run_parallel


def _ending() -> set[int]:
    with threads._lock:
        return set(threads._ending)


@pytest.mark.skipif(sys.platform != "linux", reason="the wait reads /proc/self/task")
def test_the_threads_of_streamio_pools_record_their_ending_with_their_native_ids() -> None:
    threads.wait_for_ending()
    seen: set[int] = set()
    lock = threading.Lock()

    def job(_: int) -> None:
        with lock:
            seen.add(threading.get_native_id())
        time.sleep(0.01)

    run_parallel(job, range(8), concurrency=4, name="t-parallel")
    assert seen and seen <= _ending()  # closed: each of its threads is recorded as ending
    threads.wait_for_ending()
    assert not _ending() and not any(Path(f"/proc/self/task/{t}").exists() for t in seen)  # gone, not just ended

    seen.clear()
    run_detached(job, range(4), concurrency=2, name="t-detached")
    deadline = time.monotonic() + 5
    while not seen <= _ending() and time.monotonic() < deadline:  # daemon threads end on their own
        time.sleep(0.01)
    assert seen <= _ending()
    threads.wait_for_ending()
    assert not any(Path(f"/proc/self/task/{t}").exists() for t in seen)


def test_a_thread_that_lives_on_is_not_waited_for() -> None:
    threads.wait_for_ending()
    stop = threading.Event()
    pool = threads.executor(2, "t-alive")
    pool.submit(stop.wait)  # a thread now exists and lives (its pool is open)
    started = time.monotonic()
    threads.wait_for_ending()
    assert time.monotonic() - started < 0.1 and not _ending()
    stop.set()
    pool.shutdown()


def test_the_wait_ends_when_the_tasks_are_gone_or_at_its_bound(tmp_path: Path) -> None:
    tasks = tmp_path / "task"
    tasks.mkdir()
    for tid in (101, 102):
        (tasks / str(tid)).touch()
    with threads._lock:
        threads._ending.update({101, 102})
    threading.Timer(0.05, (tasks / "101").unlink).start()
    threading.Timer(0.10, (tasks / "102").unlink).start()
    started = time.monotonic()
    threads.wait_for_ending(5.0, tasks=str(tasks))
    assert 0.09 <= time.monotonic() - started < 2.0  # until the last one went, not to the bound
    (tasks / "103").touch()  # a task that never goes (a reused id): the bound holds
    with threads._lock:
        threads._ending.add(103)
    started = time.monotonic()
    threads.wait_for_ending(0.2, tasks=str(tasks))
    assert 0.2 <= time.monotonic() - started < 1.0 and not _ending()  # and it is not waited for again


@pytest.mark.skipif(sys.platform != "linux", reason="fork")
def test_a_child_forked_while_the_lock_was_held_can_still_record_and_fork() -> None:
    # hooks registered before streamio's run after its own "before" hook: the lock is held at the fork
    script = (
        "import os, sys\n"
        "lock = lambda: sys.modules['streamio.threads']._lock\n"
        "os.register_at_fork(before=lambda: lock().acquire(), after_in_parent=lambda: lock().release())\n"
        "from streamio import threads\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    threads.start(lambda: None, name='t').join()\n"
        "    threads.wait_for_ending(0.5)\n"
        "    os._exit(0)\n"
        "sys.exit(os.waitpid(pid, 0)[1] >> 8)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
