"""A process's metrics include those of the processes it forked (DataLoader workers).

Forked children report to their parent through files, not a pipe or shared memory that needs a
lock: before a process forks it makes a private directory (``mkdtemp``, mode 0700, removed at its
exit by this process only, a ``multiprocessing`` child's included); a child that records anything
writes its totals (its own and, recursively, its children's) into
``<that directory>/<pid>-<token>.json`` (a temp file, then a rename: a reader sees the previous
report or the new one whole) at the end of each dataset iterator (:func:`report`) and every
:data:`REPORT_EVERY_S` seconds from a daemon thread. The parent's totals are its own plus the last
report of each child. Its snapshot is therefore exact once its children reported: a DataLoader's
iterator ends only after every worker's dataset iterator ended, which reports first. A worker that
is killed (``SIGKILL``, the loader's shutdown) loses at most the last :data:`REPORT_EVERY_S`.

A child starts from zero at the fork (:meth:`~.instruments.Instrument.forget`), so nothing is
counted twice. The files of children that exited are folded into the parent's running total and
removed when the parent next reads them; the token keeps a reused pid from overwriting a dead
child's last report. Only ``fork`` children report (Linux's default start method for DataLoader
workers); ``spawn``/``forkserver`` children are processes of their own, with their own metrics.
Reports are JSON of numbers the parent bounds before using (a file there is written by our own
children only: the directory is private to the user); a report skipped as invalid is named in one
warning, not one per snapshot. The parent checks the directory at each read: one removed while in
use (a ``/tmp`` cleaner) is made again, private, with one warning (the reports children tried to
write meanwhile are lost until their next one); one that is not a private directory of this user
(made by someone else after a removal) is not read, with one warning. With
``STREAMIO_METRICS=off`` no directory is made and children report nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import math
import multiprocessing.util
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from streamio.metrics import trace
from streamio.metrics.instruments import RECORDING, Gauge, Histogram, Instrument, LabelKey, merge_values

__all__ = [
    "REPORT_EVERY_S", "Family", "bind", "children_values", "forget_children", "in_forked_child", "recording_started",
    "report",
]

log = logging.getLogger(__name__)

REPORT_EVERY_S = 1.0
"""How often a forked child that recorded something reports its totals to its parent."""
MAX_REPORT_BYTES = 4 << 20
"""A child's report larger than this is skipped with a warning (a bounded read)."""
MAX_LABEL_CHARS = 256
"""A report whose label value is longer than this is skipped with a warning."""
MAX_SERIES = 1000
"""A report with more label sets than this for one instrument is skipped with a warning."""

Family = dict[str, dict[tuple[str, ...], Any]]
"""Values of several instruments: name -> label key -> value."""


class _State:
    """This process's place in the fork tree (replaced whole in a forked child)."""

    def __init__(self, parent_dir: str | None) -> None:
        self.parent_dir = parent_dir  # where this process reports (None: it reports to no one)
        self.own_dir: str | None = None  # where its forked children report (made before its first fork)
        self.name = f"{os.getpid()}-{secrets.token_hex(4)}.json"
        self.retired: Family = {}  # the last reports of children that exited
        self.reporter: threading.Thread | None = None
        self.lock = threading.Lock()
        self.report_lock = threading.Lock()  # held by the thread writing this process's report
        self.baseline: dict[str, Family] = {}  # a live child's report at the last reset, by file name
        self.warned: set[str] = set()  # what was warned about once (a bad report's name, the directory)


_state = _State(None)
_instruments: Callable[[], Iterable[Instrument]] = list  # set by the registry
_own_values: Callable[[], Family] = dict  # set by the registry


def bind(instruments: Callable[[], Iterable[Instrument]], own_values: Callable[[], Family]) -> None:
    """Tell this module how to reach the registry's instruments and this process's own values."""
    global _instruments, _own_values
    _instruments, _own_values = instruments, own_values


def _before_fork() -> None:
    if _state.own_dir is not None or not RECORDING:
        return
    try:
        _state.own_dir = tempfile.mkdtemp(prefix=f"streamio-metrics-{os.getpid()}-")
    except OSError as exc:  # metrics of children are lost, the fork goes on
        log.warning("streamio metrics: cannot make a directory for forked children's reports: %s", exc)
        return
    # Exit handlers are inherited by a fork: _remove_own_dir removes the directory of the process
    # that runs it (a child that exits normally must not remove its parent's). A multiprocessing
    # child (a DataLoader worker that forks) ends with os._exit after running its finalizers only.
    atexit.register(_remove_own_dir)
    multiprocessing.util.Finalize(None, _remove_own_dir, exitpriority=0)


def _remove_own_dir() -> None:
    if _state.own_dir is not None:
        shutil.rmtree(_state.own_dir, ignore_errors=True)


def _after_fork_in_child() -> None:
    global _state
    _state = _State(_state.own_dir)
    for instrument in _instruments():
        instrument.forget()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def in_forked_child() -> bool:
    """Whether this process reports to a parent (its totals are part of the parent's)."""
    return _state.parent_dir is not None


def recording_started() -> None:
    """Called the first time a thread records: a forked child starts reporting periodically."""
    state = _state
    if state.parent_dir is None or state.reporter is not None:
        return
    with state.lock:
        if state.reporter is None:
            state.reporter = threading.Thread(
                target=_report_forever, args=(state,), name="streamio-metrics", daemon=True
            )
            state.reporter.start()


def _report_forever(state: _State) -> None:
    while state is _state:
        time.sleep(REPORT_EVERY_S)
        _report(periodic=True)


def report() -> None:
    """Write this process's totals where its parent reads them, and its trace file (nothing if it
    was not forked: the main process writes its trace at exit)."""
    _report(periodic=False)


def _report(*, periodic: bool) -> None:
    state = _state
    if state.parent_dir is None:
        return
    # One report at a time (the periodic thread's and the iterator's end): two writers of the one
    # temp file would interleave their bytes, and the totals read first could be renamed last.
    with state.report_lock:
        trace.write(periodic=periodic)
        totals = _own_values()
        known = _by_name()
        for name, values in children_values().items():
            merge_values(known[name], totals.setdefault(name, {}), values)
        rows = {n: [[list(k), v] for k, v in vals.items()] for n, vals in totals.items()}
        body = json.dumps({"v": 1, "metrics": rows})
        path = os.path.join(state.parent_dir, state.name)
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(body)
            os.replace(tmp, path)
        except OSError as exc:  # the parent went away, or its directory did
            log.debug("streamio metrics: cannot report to %s: %s", state.parent_dir, exc)


def children_values() -> Family:
    """The totals this process's forked children reported (with theirs), children that exited included."""
    state = _state
    if state.own_dir is None:
        return {}
    known = _by_name()
    out: Family = {}
    with state.lock:
        for name, values in state.retired.items():
            out[name] = dict(values)
        if not _private_dir(state):
            return out
        try:
            entries = [e for e in os.scandir(state.own_dir) if e.name.endswith(".json")]
        except OSError:
            return out
        for entry in entries:
            # asked before reading: a child that exits after the read may have replaced what was read
            # by its last report, which the unlink below would lose
            gone = not _alive(entry.name)
            reported = _read_report(entry.path, known, state)
            if reported is None:
                continue
            if gone:
                base = state.baseline.pop(entry.name, {})
            else:
                base = state.baseline.get(entry.name, {})
            for name, values in reported.items():
                values = _since(known[name], values, base.get(name, {}))
                instrument = known[name]
                if gone and isinstance(instrument, Gauge) and instrument.mode == "sum":
                    continue  # what an exited process held (shards fetched ahead) is held no more
                merge_values(instrument, out.setdefault(name, {}), values)
                if gone:
                    merge_values(instrument, state.retired.setdefault(name, {}), values)
            if gone:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    return out


def forget_children() -> None:
    """Drop what children reported so far (:func:`streamio.metrics.reset`): the reports of exited
    children, and of live ones (a persistent worker) what they reported until now, kept as the
    baseline their next reports are counted from (a report holds the child's totals since its fork)."""
    state = _state
    known = _by_name()
    with state.lock:
        state.retired, state.baseline = {}, {}
        if state.own_dir is None or not _private_dir(state):
            return
        with contextlib.suppress(OSError):
            for entry in os.scandir(state.own_dir):
                if entry.name.endswith(".json") and _alive(entry.name):
                    state.baseline[entry.name] = _read_report(entry.path, known, state) or {}
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


def _since(instrument: Instrument, values: dict[LabelKey, Any], base: dict[LabelKey, Any]) -> dict[LabelKey, Any]:
    """A child's ``values`` less its ``base`` (what it had reported at a reset): counters and
    histograms only, a gauge says what holds now."""
    if not base or isinstance(instrument, Gauge):
        return values
    out = {}
    for key, value in values.items():
        was = base.get(key)
        if was is None:
            out[key] = value
        elif isinstance(instrument, Histogram):
            out[key] = [max(0, a - b) for a, b in zip(value, was, strict=True)]
        else:
            out[key] = max(0.0, value - was)
    return out


def _warn_once(state: _State, key: str, message: str, *args: object) -> None:
    if key in state.warned:
        log.debug(message, *args)
    else:
        state.warned.add(key)
        log.warning(message, *args)


def _private_dir(state: _State) -> bool:
    """Whether ``state.own_dir`` is a directory of this user that no one else can write (made again
    if it was removed); see the module docstring."""
    path = str(state.own_dir)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, 0o700)  # fails if someone made it meanwhile: checked at the next read
        except OSError as exc:
            _warn_once(state, "dir", "streamio metrics: the directory %s where forked workers report was removed "
                       "and cannot be made again (%s): their counts are lost", path, exc)
            return False
        _warn_once(state, "dir", "streamio metrics: the directory %s where forked workers report was removed "
                   "while in use; made again (the reports written meanwhile are lost)", path)
        return True
    except OSError as exc:
        _warn_once(state, "dir", "streamio metrics: cannot read the directory %s of workers' reports: %s", path, exc)
        return False
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
        return True
    _warn_once(state, "dir", "streamio metrics: %s, where forked workers report, is no longer a directory private "
               "to this user (mode %o, owner %d): not read, their counts are lost", path, st.st_mode, st.st_uid)
    return False


def _by_name() -> dict[str, Instrument]:
    return {i.name: i for i in _instruments()}


def _alive(file_name: str) -> bool:
    try:
        os.kill(int(file_name.split("-", 1)[0]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _read_report(path: str, known: Mapping[str, Instrument], state: _State | None = None) -> Family | None:
    """The report at ``path`` checked, or None (gone; invalid: one warning per report, though a
    snapshot reads it again each time: ``state`` remembers which were warned about)."""
    raw = b""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_REPORT_BYTES + 1)
        if len(raw) > MAX_REPORT_BYTES:
            raise ValueError(f"over {MAX_REPORT_BYTES} bytes")
        doc = json.loads(raw)
        return {name: _values(known[name], rows) for name, rows in doc["metrics"].items() if name in known}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        message = "streamio metrics: skipped a worker's report %s: %s"
        if state is None:
            log.warning(message, path, exc)
        else:
            _warn_once(state, f"{path}:{hashlib.blake2b(raw, digest_size=8).hexdigest()}", message, path, exc)
        return None


def _values(instrument: Instrument, rows: Any) -> dict[tuple[str, ...], Any]:
    """A report's rows of ``instrument``, checked: label strings of bounded length, finite numbers
    (not negative where only a gauge may be), each value of the shape its instrument keeps."""
    if not isinstance(rows, list) or len(rows) > MAX_SERIES:
        raise ValueError(f"{instrument.name}: not a list of at most {MAX_SERIES} series")
    out: dict[tuple[str, ...], Any] = {}
    for labels, value in rows:
        if not isinstance(labels, list) or not all(isinstance(v, str) and len(v) <= MAX_LABEL_CHARS for v in labels):
            raise ValueError(f"{instrument.name}: labels {str(labels)[:100]}")
        key = tuple(labels)
        if len(key) != len(instrument.labels):
            raise ValueError(f"{instrument.name}: labels {key}")
        if isinstance(instrument, Histogram):
            if not isinstance(value, list) or len(value) != len(instrument.buckets) + 3:
                raise ValueError(f"{instrument.name}: not {len(instrument.buckets) + 3} histogram fields")
            out[key] = [_number(instrument, v) for v in value]
        elif isinstance(instrument, Gauge) and instrument.mode == "latest":
            if not isinstance(value, list) or len(value) != 2:
                raise ValueError(f"{instrument.name}: not a [value, time] pair")
            out[key] = (_number(instrument, value[0], signed=True), _number(instrument, value[1]))
        else:
            out[key] = _number(instrument, value, signed=isinstance(instrument, Gauge))
    return out


def _number(instrument: Instrument, value: Any, *, signed: bool = False) -> float:
    """``value`` as a float if it is a finite JSON number (not a bool), not negative unless ``signed``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{instrument.name}: {str(value)[:40]} is not a number")
    out = float(value)
    if not math.isfinite(out) or (out < 0 and not signed):
        raise ValueError(f"{instrument.name}: {out} is out of range")
    return out
