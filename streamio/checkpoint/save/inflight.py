"""The async saves of this process that nobody has waited for yet, and what becomes of them at exit.

A script that ends right after ``ckpt.save(step, state)`` (async, no ``wait()`` or ``close()``)
used to lose that save silently: exit status 0, nothing on stderr, ``latest.json`` still on the
previous step and the new step half-written. Why: CPython ends a program in this order
(``Py_FinalizeEx``, 3.10 to 3.13):

1. ``threading._shutdown()``: the functions registered with ``threading._register_atexit``,
   newest first, then a join of every non-daemon thread;
2. the ``atexit`` handlers, newest first;
3. daemon threads are frozen where they stand, modules are torn down.

``concurrent.futures`` registers a function of step 1 when it is first imported: it marks every
executor shut down. A commit still running then cannot start the threads it uploads and reads
with ("cannot schedule new futures after interpreter shutdown"), so it failed in its thread,
where nobody looked.

So every async save is recorded here (:func:`track`) until the manager observes its outcome
(``wait``, ``close``, the next ``save`` or ``restore``: :func:`forget`), and so is every upload of
a local tier's save until it ends (one a save hands on while the exit waits is waited for too);
the first one
registers :func:`at_exit` in step 1, after ``concurrent.futures`` registered its own (the
manager's executor exists by then), so it runs first, while executors still take work. For each
save still recorded :func:`finish` logs one WARNING and waits for it::

    waiting for checkpoint step 2 to commit to s3://b/run (a save still in flight at interpreter
    exit); call ckpt.wait() or ckpt.close() before the script ends

The wait is bounded by the save's own bounds: each storage request by the store's
``RetryPolicy``, every collective under ``torch.distributed`` by
``SaveOptions.collective_timeout_s`` (a peer that is gone closes its connections, which gloo
reports at once; one that never comes is named after the timeout). If a save failed (at exit or
earlier, unobserved), one ERROR names the step and the error, and the process ends with status 1
right there: stdout, stderr and logging are flushed, then ``os._exit(1)``, so the ``atexit``
handlers of step 2 do not run. An interrupt while waiting (a second Ctrl-C, or a signal handler
that raises ``SystemExit``) is reported the same way and ends the process with status 130, or the
``SystemExit``'s code.

Not covered, by nature: a signal whose default action kills the process (``SIGTERM``,
``SIGKILL``) runs no Python code. The save in flight is then lost, the previous checkpoint stays
current (the commit protocol), and ``streamio ckpt gc`` removes what the save had written. A
trainer that should finish its save on ``SIGTERM`` installs a handler that ends it normally, e.g.
``signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))``: the wait above then applies.
``streamio.distributed.leave()`` ends the process with ``os._exit`` and runs none of this: close
the managers first.

Messages go through this module's logger; when logging is not configured, Python's last-resort
handler prints WARNING and above to stderr. A process forked from this one (a DataLoader worker)
starts with nothing recorded: it has the records but not the threads.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["at_exit", "finish", "forget", "track"]

log = logging.getLogger(__name__)

INTERRUPTED = 130
"""Exit status after an interrupt while waiting at exit (128 + SIGINT, as shells report it)."""


@dataclass(frozen=True)
class _Save:
    step: int
    root_url: str


_lock = threading.Lock()
_saves: dict[concurrent.futures.Future[object], _Save] = {}  # insertion order: oldest first
_registered = False


def track(future: concurrent.futures.Future[object], step: int, root_url: str) -> None:
    """Record an async save until :func:`forget`; the first one arms :func:`at_exit`."""
    global _registered
    with _lock:
        _saves[future] = _Save(step, root_url)
        if _registered:
            return
        _registered = True
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(at_exit)
        else:  # not CPython >= 3.9: too late to wait, still in time to report
            import atexit

            atexit.register(at_exit)
    except RuntimeError:  # save() called while the interpreter is already shutting down
        log.debug("interpreter shutting down: no exit wait for checkpoint step %d", step)


def forget(future: concurrent.futures.Future[object]) -> None:
    """The manager observed ``future``'s outcome (returned it or raised its error)."""
    with _lock:
        _saves.pop(future, None)


def at_exit() -> None:
    """Wait for every save still recorded; end the process with :func:`finish`'s status if not 0."""
    status = finish()
    if status:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed or replaced by the program
                pass
        logging.shutdown()
        os._exit(status)


def finish(*, wait: Callable[[concurrent.futures.Future[object]], object] | None = None) -> int:
    """Wait for every recorded save, logging what happens (see the module docstring).

    Args:
        wait: how to wait for one save (default: ``future.result()``).

    Returns:
        0 if every save committed, 1 if one failed, the interrupt's status if one came.
    """
    status = 0
    for future, save in _drain():
        if not future.done():
            log.warning(
                "waiting for checkpoint step %d to commit to %s (a save still in flight at interpreter "
                "exit); call ckpt.wait() or ckpt.close() before the script ends", save.step, save.root_url,
            )
        try:
            (wait or _result)(future)
        except Exception as exc:  # noqa: BLE001 - reported: the one place this error can still be seen
            log.error("checkpoint step %d was not committed to %s: %s: %s; exiting with status 1",
                      save.step, save.root_url, type(exc).__name__, exc)
            status = status or 1
        except (KeyboardInterrupt, SystemExit) as exc:
            code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code else INTERRUPTED
            log.error("interrupted while waiting for checkpoint step %d to commit to %s: it may not be "
                      "committed; exiting with status %d", save.step, save.root_url, code)
            return code
    return status


def _drain() -> Iterator[tuple[concurrent.futures.Future[object], _Save]]:
    """Every recorded save, oldest first, including those recorded while the others are waited
    for (a save that commits locally hands its upload on: :mod:`.tiers`)."""
    while True:
        with _lock:
            if not _saves:
                return
            future = next(iter(_saves))
            save = _saves.pop(future)
        yield future, save


def _result(future: concurrent.futures.Future[object]) -> object:
    return future.result()


def _forget_all_in_child() -> None:
    global _saves, _lock
    _saves, _lock = {}, threading.Lock()  # the lock may have been held by a thread the child lacks


os.register_at_fork(after_in_child=_forget_all_in_child)
