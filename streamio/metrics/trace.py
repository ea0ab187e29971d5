"""Spans of streamio's stages for a Chrome/Perfetto trace (``STREAMIO_TRACE=/path/trace.json``).

``with span("fetch", shard=url): ...`` records one complete event in the calling thread. Without
``STREAMIO_TRACE`` (read once, at import) :func:`span` returns one shared no-op context manager:
nothing is recorded or kept.

With it, each process writes its own file next to the path given, the pid in its name:
``/tmp/trace.json`` gives ``/tmp/trace.<pid>.json`` (open them together in Perfetto; their
timestamps share the machine's monotonic clock). Why not one merged file: DataLoader workers are
killed at the end of an epoch without running ``atexit``, so each process writes what it holds
when it can. The main process writes at exit (``atexit``); a forked child (a DataLoader worker)
at :func:`streamio.metrics.report` (the end of each dataset iterator, and at most every
:data:`CHILD_WRITE_EVERY_S` from the periodic report), starting from no events at the fork.

Recording takes no lock: each thread appends ``(name, start, duration, args)`` to a list of its
own (registered under a lock once per thread). A process keeps at most :data:`MAX_EVENTS` events;
the ones after are dropped and counted (``otherData.streamio.dropped`` in the file). A
``STREAMIO_TRACE`` that cannot be written (a directory, a missing or read-only folder) gives one
warning and turns tracing off; it never stops training. The folder is checked again before each
fork: one removed since gives one warning there, not one per DataLoader worker. A write that fails
(a full disk) gives one warning in the process that tried it. A relative path is taken from the working
directory at import; the files are readable by their owner only (spans may name objects).

The file is Chrome's trace format: ``{"traceEvents": [...], "otherData": {...}}`` with complete
events (``"ph": "X"``, ``ts`` and ``dur`` in microseconds, ``pid``, ``tid``) and ``thread_name``
/ ``process_name`` metadata events.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["CHILD_WRITE_EVERY_S", "MAX_EVENTS", "TRACE_ENV", "enabled", "path_of", "span", "write"]

log = logging.getLogger(__name__)

TRACE_ENV = "STREAMIO_TRACE"
MAX_EVENTS = 500_000
"""Events one process keeps (about 100 bytes each in memory); later ones are counted as dropped."""
CHILD_WRITE_EVERY_S = 10.0
"""A forked child rewrites its file from the periodic report at most this often (always at the
end of a dataset iterator)."""

_OFF = contextlib.nullcontext()
Event = tuple[str, int, int, dict[str, Any]]


def path_of(given: str | os.PathLike[str], pid: int) -> Path:
    """The file of process ``pid`` for ``STREAMIO_TRACE=given``: ``<stem>.<pid>.json`` beside it."""
    given = Path(given)
    return given.with_name(f"{given.stem if given.suffix == '.json' else given.name}.{pid}.json")


def _usable(given: str) -> str | None:
    """``given`` if a trace file can be written beside it; else one warning and None."""
    target = path_of(given, os.getpid())
    why = None
    if Path(given).is_dir():
        why = "it is a directory (give a file name: /path/trace.json)"
    elif not target.parent.is_dir():
        why = f"its folder {str(target.parent)!r} does not exist"
    elif not os.access(target.parent, os.W_OK):
        why = f"its folder {str(target.parent)!r} is not writable"
    if why is None:
        return given
    log.warning("%s=%r: no trace is written, %s", TRACE_ENV, given, why)
    return None


class _Buffer:
    """One thread's events, with its ids (the thread that made it is the only one appending)."""

    def __init__(self) -> None:
        thread = threading.current_thread()
        self.tid, self.thread_name, self.events = threading.get_native_id(), thread.name, []


class _Recorder:
    """This process's events: one buffer per thread, a bound shared through one atomic counter."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.buffers: list[_Buffer] = []
        self.lock = threading.Lock()
        self.seen = itertools.count()  # next() is atomic under the GIL: the bound needs no lock
        self.peeks = 0  # next(seen) calls made by document(), not by spans
        self.written_at = 0.0

    def buffer(self) -> _Buffer:
        buf = getattr(self.local, "buf", None)
        if buf is None:
            buf = self.local.buf = _Buffer()
            with self.lock:
                self.buffers.append(buf)
        return buf

    def document(self) -> dict[str, Any]:
        pid = os.getpid()
        with self.lock:
            buffers = list(self.buffers)
            attempted = next(self.seen) - self.peeks  # the spans offered so far
            self.peeks += 1
        out: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                      "args": {"name": f"streamio {pid}"}}]
        kept = 0
        for buf in buffers:
            events = list(buf.events)
            kept += len(events)
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": buf.tid,
                        "args": {"name": buf.thread_name}})
            out.extend({"name": name, "cat": "streamio", "ph": "X", "ts": start / 1000, "dur": dur / 1000,
                        "pid": pid, "tid": buf.tid, "args": args} for name, start, dur, args in events)
        meta = {"pid": pid, "events": kept, "dropped": max(0, attempted - kept), "max_events": MAX_EVENTS}
        return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"streamio": meta}}


_PATH = os.environ.get(TRACE_ENV) or None
if _PATH is not None:  # absolute: a later chdir must not move where the files go
    _PATH = _usable(os.path.abspath(_PATH))
_rec = _Recorder()
_write_failed = False


def enabled() -> bool:
    """Whether this process records spans."""
    return _PATH is not None


def span(name: str, **args: Any) -> contextlib.AbstractContextManager[None]:
    """A context manager that records ``name`` (with ``args``) from entry to exit in this thread."""
    if _PATH is None:
        return _OFF
    return _Span(name, args)


class _Span:
    """One span being recorded (a class, not a generator: a third of the cost per span)."""

    __slots__ = ("args", "name", "start")

    def __init__(self, name: str, args: dict[str, Any]) -> None:
        self.name, self.args, self.start = name, args, 0

    def __enter__(self) -> None:
        self.start = time.perf_counter_ns()

    def __exit__(self, *exc: object) -> None:
        end = time.perf_counter_ns()
        if next(_rec.seen) < MAX_EVENTS:
            _rec.buffer().events.append((self.name, self.start, end - self.start, self.args))


def write(*, periodic: bool = False) -> Path | None:
    """Write this process's trace file now (atexit and :func:`streamio.metrics.report` call this).

    Args:
        periodic: called by the periodic report: skipped when the last write is recent.

    Returns:
        The file written, or None (tracing off, skipped, or the write failed: one warning).
    """
    global _write_failed
    if _PATH is None or _write_failed:
        return None
    if periodic and time.monotonic() - _rec.written_at < CHILD_WRITE_EVERY_S:
        return None
    _rec.written_at = time.monotonic()
    target = path_of(_PATH, os.getpid())
    tmp = None
    try:  # a fresh temp file (O_EXCL: never a link planted in a shared /tmp), then a rename
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(_rec.document(), f, default=str)
        os.replace(tmp, target)
    except OSError as exc:  # a full disk or a folder removed: the trace is lost, training goes on
        _write_failed = True
        log.warning("%s: cannot write the trace %s: %s", TRACE_ENV, target, exc)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return None
    return target


def _before_fork() -> None:
    """A folder removed or made unwritable since the import: one warning here, and tracing off in
    this process and the children it forks now (each of them would warn of its own otherwise)."""
    global _PATH
    if _PATH is not None and not _write_failed and _usable(_PATH) is None:
        _PATH = None


def _after_fork_in_child() -> None:
    global _rec
    _rec = _Recorder()


if _PATH is not None:
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    atexit.register(write)
