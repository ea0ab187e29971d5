"""A forked child's report is a claim from outside the parent: whatever its file holds, the
parent's snapshot() never raises and never takes a value that is not a finite count of the right
shape; it skips the report with a warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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
