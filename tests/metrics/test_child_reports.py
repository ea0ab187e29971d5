"""A forked child's report is a claim from outside the parent: whatever its file holds, the
parent's snapshot() never raises and never takes a value that is not a finite count of the right
shape; it skips the report with a warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamio.metrics import ALL
from streamio.metrics.processes import MAX_SERIES, _read_report

KNOWN = {i.name: i for i in ALL}
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_names = st.sampled_from(sorted(KNOWN))


@settings(max_examples=60)  # a file written and read per example
@given(st.dictionaries(_names, _json, max_size=3) | _json)
def test_any_json_report_is_read_or_skipped_never_raises(tmp_path_factory: Any, metrics: Any) -> None:
    path = tmp_path_factory.getbasetemp() / "1-a.json"
    path.write_text(json.dumps({"v": 1, "metrics": metrics}))
    got = _read_report(str(path), KNOWN)
    assert got is None or all(name in KNOWN for name in got)


_BAD = {
    "nan": {"streamio_store_bytes_read_total": [[[], float("nan")]]},
    "negative count": {"streamio_store_bytes_read_total": [[[], -5]]},
    "inf": {"streamio_store_bytes_read_total": [[[], float("inf")]]},
    "bool": {"streamio_store_bytes_read_total": [[[], True]]},
    "long label": {"streamio_store_requests_total": [[["x" * 1000, "ok"], 1]]},
    "too many series": {"streamio_store_requests_total": [[[str(i), "ok"], 1] for i in range(MAX_SERIES + 1)]},
    "histogram of strings": {"streamio_loader_wait_seconds": [[[], ["a"] * 18]]},
    "short gauge pair": {"streamio_cache_bytes": [[[], [1]]]},
    "pair for a counter": {"streamio_store_bytes_read_total": [[[], [1, 2]]]},
    "metrics a list": [],
}
_SCRIPT = """
import json, logging, os, sys
import streamio.metrics as m
from streamio.metrics import catalog as c, processes
c.STORE_BYTES_READ.add(10)
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
out = {}
for name, metrics in json.loads(sys.stdin.read()).items():
    body = '{"v": 1, "metrics": ' + ("[" * 100000 + "]" * 100000 if name == "deep" else json.dumps(metrics)) + "}"
    with open(os.path.join(processes._state.own_dir, f"{os.getpid()}-forged.json"), "w") as f:
        f.write(body)  # under this live pid: read at every snapshot
    snap = m.snapshot()
    out[name] = [snap["streamio_store_bytes_read_total"], snap["streamio_store_requests_total"],
                 snap["streamio_cache_bytes"], snap["streamio_loader_wait_seconds"]["count"]]
print(json.dumps(out))
"""


def test_a_forged_report_is_skipped_with_a_warning_and_the_snapshot_stands(tmp_path: Path) -> None:
    cases = {**_BAD, "deep": None}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {name: [10.0, {}, 0.0, 0] for name in cases}  # the parent's own count, nothing forged
    assert proc.stderr.count("skipped a worker's report") == len(cases), proc.stderr


_DIRECTORY = """
import json, os, shutil, sys
import streamio.metrics as m
from streamio.metrics import catalog as c, processes

def child(nbytes, then=None):
    pid = os.fork()
    if pid == 0:
        c.STORE_BYTES_READ.add(nbytes)
        m.report()
        os._exit(0)
    os.waitpid(pid, 0)

def read():
    return m.snapshot()["streamio_store_bytes_read_total"]

case = sys.argv[1]
child(100)
out = [read()]
own = processes._state.own_dir
shutil.rmtree(own)
if case == "squatted":  # someone else's directory where ours was, with a report claiming a lot
    os.mkdir(own)
    os.chmod(own, 0o777)
    with open(os.path.join(own, "999999999-ab.json"), "w") as f:
        json.dump({"v": 1, "metrics": {"streamio_store_bytes_read_total": [[[], 1e6]]}}, f)
out.append(read())
child(10)
out += [read(), read()]
with open(os.path.join(own, f"{os.getpid()}-bad.json"), "w") as f:
    f.write("{not json")
out += [read(), read()]
print(json.dumps(out))
"""


@pytest.mark.parametrize(("case", "after", "warning"), [
    ("removed", 110.0, "was removed while in use; made again"),
    ("squatted", 100.0, "is no longer a directory private to this user"),
])
def test_a_report_directory_removed_or_replaced_mid_run_gives_one_warning(
    case: str, after: float, warning: str
) -> None:
    proc = subprocess.run([sys.executable, "-c", _DIRECTORY, case], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [100.0, 100.0, after, after, after, after]  # nothing forged, nothing lost
    assert proc.stderr.count(warning) == 1, proc.stderr
    assert proc.stderr.count("skipped a worker's report") == (case == "removed"), proc.stderr  # once, not per read


_LAST_REPORT = """
import json, os
import streamio.metrics as m
from streamio.metrics import catalog as c, processes

go, ready = os.pipe(), os.pipe()
pid = os.fork()
if pid == 0:
    c.STORE_BYTES_READ.add(1)
    m.report()  # an early report (the periodic one)
    os.write(ready[1], b"x")
    os.read(go[0], 1)
    c.STORE_BYTES_READ.add(99)
    m.report()  # its last, written after the parent read the early one
    os._exit(0)
os.read(ready[0], 1)
read_report = processes._read_report

def read_then_let_the_child_finish(*args):
    got = read_report(*args)
    processes._read_report = read_report
    os.write(go[1], b"x")
    os.waitpid(pid, 0)  # the child replaced its report and exited between this read and what follows
    return got

processes._read_report = read_then_let_the_child_finish
first = m.snapshot()["streamio_store_bytes_read_total"]
print(json.dumps([first, m.snapshot()["streamio_store_bytes_read_total"]]))
"""


def test_a_child_that_reports_and_exits_while_its_report_is_read_loses_nothing() -> None:
    proc = subprocess.run([sys.executable, "-c", _LAST_REPORT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, then = json.loads(proc.stdout)
    assert first == 1.0 and then == 100.0  # the last report, not the one read before it


_RESET = """
import json, os, shutil
import streamio.metrics as m
from streamio.metrics import catalog as c, processes
go, ready = os.pipe(), os.pipe()
pid = os.fork()
if pid == 0:  # a persistent DataLoader worker: it reports its totals since the fork at each epoch's end
    for epoch in range(2):
        c.STORE_BYTES_READ.add(100)
        c.LOADER_WAIT.observe(0.01)
        m.report()
        os.write(ready[1], b"x")
        os.read(go[0], 1)
    os._exit(0)

def read():
    snap = m.snapshot()
    return [snap["streamio_store_bytes_read_total"], snap["streamio_loader_wait_seconds"]["count"]]

os.read(ready[0], 1)
out = [read()]
m.reset()
out.append(read())
os.write(go[1], b"x")
os.read(ready[0], 1)
out.append(read())
os.write(go[1], b"x")
os.waitpid(pid, 0)
out.append(read())  # folded once it exited: still counted from the reset
shutil.rmtree(processes._state.own_dir)
m.reset()  # with its directory gone
print(json.dumps(out))
"""


def test_reset_with_a_live_worker_counts_only_what_it_reads_after() -> None:
    proc = subprocess.run([sys.executable, "-c", _RESET], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[100.0, 1], [0.0, 0], [100.0, 1], [100.0, 1]]


_EXITS = """
import glob, json, multiprocessing, os, sys
import streamio.metrics as m
from streamio.metrics import catalog as c, processes

def forks_and_ends(queue):  # a multiprocessing child (a DataLoader worker) that forks a child of its own
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    queue.put(processes._state.own_dir)

a = os.fork()
if a == 0:
    c.STORE_BYTES_READ.add(100)
    m.report()
    os._exit(0)
os.waitpid(a, 0)
b = os.fork()
if b == 0:
    sys.exit(0)  # a child that ends as a Python program does: the exit handlers it inherited run
os.waitpid(b, 0)
queue = multiprocessing.get_context("fork").Queue()
worker = multiprocessing.get_context("fork").Process(target=forks_and_ends, args=(queue,))
worker.start()
its_dir = queue.get(timeout=30)
worker.join()
print(json.dumps([m.snapshot()["streamio_store_bytes_read_total"], os.path.isdir(its_dir)]))
"""


def test_a_directory_is_removed_by_the_process_that_made_it_only() -> None:
    proc = subprocess.run([sys.executable, "-c", _EXITS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    # the child that exited normally left its parent's directory (and its sibling's report) alone;
    # the multiprocessing child removed its own at its end
    assert json.loads(proc.stdout) == [100.0, False]


_TWO_WRITERS = """
import json, os, threading
import streamio.metrics as m
from streamio.metrics import catalog as c, processes

pid = os.fork()
if pid == 0:
    c.STORE_BYTES_READ.add(1)
    inside, written = threading.Event(), threading.Event()
    own_values = processes._own_values

    def slow_first_read():  # the periodic report reads its totals, then is descheduled
        processes._own_values = own_values
        totals = own_values()
        inside.set()
        written.wait(0.5)
        return totals

    processes._own_values = slow_first_read
    periodic = threading.Thread(target=m.report)
    periodic.start()
    inside.wait(10)
    c.STORE_BYTES_READ.add(99)
    m.report()  # the iterator's end: the last report
    written.set()
    periodic.join()
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps(m.snapshot()["streamio_store_bytes_read_total"]))
"""


def test_a_periodic_report_read_earlier_never_replaces_the_last_one() -> None:
    proc = subprocess.run([sys.executable, "-c", _TWO_WRITERS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == 100.0
