"""STREAMIO_TRACE: one Chrome-format file per process (DataLoader workers included), bounded, and a
path that cannot be written costs one warning, never the run.

The switch is read at import, so each case runs in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamio.metrics.trace import path_of

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], trace: str, timeout: float = 120, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMIO_TRACE": trace, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_path_of_puts_the_pid_before_the_suffix() -> None:
    assert path_of("/tmp/run/trace.json", 12) == Path("/tmp/run/trace.12.json")
    assert path_of("/tmp/run/trace", 12) == Path("/tmp/run/trace.12.json")
    assert path_of("rel.trace.json", 7) == Path("rel.trace.7.json")


@pytest.mark.slow
def test_an_epoch_with_two_workers_writes_one_chrome_trace_per_process(tmp_path: Path) -> None:
    proc = _run(["tests/support/trace_epoch.py", str(tmp_path)], str(tmp_path / "trace.json"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    files = {int(p.name.split(".")[1]): json.loads(p.read_text()) for p in tmp_path.glob("trace.*.json")}
    assert out["pid"] in files and len(files) == 3, sorted(files)  # the main process and its 2 workers
    assert not list(tmp_path.glob(".trace*"))  # no temp file left
    for pid, doc in files.items():
        assert doc["otherData"]["streamio"] == {"pid": pid, "events": len(_spans(doc)), "dropped": 0,
                                                "max_events": doc["otherData"]["streamio"]["max_events"]}
        threads = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
        for event in _spans(doc):
            assert event["pid"] == pid and event["tid"] in threads and event["cat"] == "streamio"
            assert isinstance(event["ts"], float) and 0 <= event["dur"] < 120e6
    main = files.pop(out["pid"])
    waits = [e for e in _spans(main) if e["name"] == "wait"]
    assert len(waits) == out["batches"] + 1  # the script's own spans; the last one finds the end
    assert "fetch" in {e["name"] for e in _spans(main)}  # streamio's: the index read
    decoded = sorted(e["args"]["key"] for doc in files.values() for e in _spans(doc) if "key" in e["args"])
    assert len(decoded) == 5 + 7 + 3 + 9 == len(set(decoded))  # each sample decoded once, in one worker
    # the reader's and the script's decodes, and the shard streams' fetches
    assert {e["name"] for doc in files.values() for e in _spans(doc)} == {"decode", "fetch"}
    first = min(e["ts"] for doc in files.values() for e in _spans(doc))
    assert waits[0]["ts"] < first < waits[-1]["ts"]  # one clock for every process


_BOUNDED = """
import threading
from streamio.metrics import trace
trace.MAX_EVENTS = 10
def spans(n):
    for i in range(n):
        with trace.span("step", i=i):
            pass
threads = [threading.Thread(target=spans, args=(9,), name=f"t{k}") for k in range(3)]
for t in threads: t.start()
for t in threads: t.join()
import os
os.chdir("/")  # the relative STREAMIO_TRACE was resolved at import
"""


def test_a_process_keeps_at_most_max_events_and_counts_the_drops(tmp_path: Path) -> None:
    proc = _run(["-c", _BOUNDED], "t.json", timeout=60, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    (written,) = tmp_path.iterdir()  # one file, no temp file left
    assert written.name.startswith("t.") and written.stat().st_mode & 0o077 == 0  # the owner's only
    doc = json.loads(written.read_text())
    assert len(_spans(doc)) == 10
    assert doc["otherData"]["streamio"]["dropped"] == 27 - 10
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "M"} == {"process_name", "thread_name"}


_STREAMS = """
import sys
import time
from streamio.metrics import trace
from streamio.storage import Store
store = Store(sys.argv[1])
store.put("blob", bytes(range(256)) * 20000)  # 5 MB: 5 pieces of 1 MiB
pieces = 0
for piece in store.iter_bytes("blob", chunk_size=1 << 20):
    pieces += 1
    with trace.span("consume"):
        time.sleep(0.02)
print(pieces)
"""


def test_a_streamed_read_records_one_fetch_span_per_piece_without_the_consumers_time(tmp_path: Path) -> None:
    proc = _run(["-c", _STREAMS, str(tmp_path / "root")], str(tmp_path / "t.json"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    (doc,) = [json.loads(p.read_text()) for p in tmp_path.glob("t.*.json")]
    spans = _spans(doc)
    fetches = [e for e in spans if e["name"] == "fetch"]
    consumed = [e for e in spans if e["name"] == "consume"]
    assert len(consumed) == int(proc.stdout) == 5
    assert len(fetches) == 5 + 1  # one per piece, and the wait that found the end
    assert all(e["args"]["url"].endswith("/root/blob") for e in fetches)
    for f in fetches:  # a fetch never overlaps the consumer's time
        assert all(f["ts"] + f["dur"] <= c["ts"] or c["ts"] + c["dur"] <= f["ts"] for c in consumed)


_TRAINS = """
from streamio.metrics import trace
for i in range(3):
    with trace.span("step"):
        pass
print("trained", trace.enabled())
"""


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("{tmp}", "it is a directory"),
        ("{tmp}/missing/trace.json", "does not exist"),
        ("{tmp}/file/trace.json", "does not exist"),  # a regular file where the folder should be
        ("/proc/streamio-trace.json", "cannot write the trace"),  # passes the checks, fails at the write
    ],
)
def test_a_trace_path_that_cannot_be_written_warns_once_and_training_goes_on(
    tmp_path: Path, where: str, says: str
) -> None:
    (tmp_path / "file").write_text("x")
    proc = _run(["-c", _TRAINS], where.format(tmp=tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("trained")
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "STREAMIO_TRACE" in lines[0], proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing half-written anywhere


_FOLDER_REMOVED = """
import os, shutil
import streamio.metrics
from streamio.metrics import trace
with trace.span("step"):
    pass
shutil.rmtree(os.path.dirname(os.environ["STREAMIO_TRACE"]))
for epoch in range(2):
    for worker in range(2):  # as a DataLoader forks its workers each epoch
        pid = os.fork()
        if pid == 0:
            with trace.span("fetch"):
                pass
            streamio.metrics.report()
            os._exit(0)
        os.waitpid(pid, 0)
print("trained", trace.enabled())
"""


def test_a_trace_folder_removed_mid_run_warns_once_not_once_per_worker(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    proc = _run(["-c", _FOLDER_REMOVED], str(tmp_path / "traces" / "trace.json"), timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0], proc.stderr  # not one more per worker
    assert proc.stdout.strip() == "trained False"
