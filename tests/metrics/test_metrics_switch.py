"""STREAMIO_METRICS=off: every recording method does nothing (read at import, so each case runs in
a process of its own); any other word keeps recording, and an unknown one says so once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_RECORD = """
import json
from streamio.metrics import catalog as c, instruments, snapshot
c.STORE_REQUESTS.add(2, "get", "ok")
c.STORE_BYTES_READ.add(100)
c.STORE_SECONDS.observe(0.02, "get")
c.CACHE_BYTES.set(7)
c.PREFETCH_DEPTH.add(3)
c.CHECKPOINT_SECONDS.observe(1.5, "blocked")
print(json.dumps({"recording": instruments.RECORDING, "snap": snapshot()}))
"""


def _record(value: str | None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMIO_METRICS"}
    if value is not None:
        env["STREAMIO_METRICS"] = value
    proc = subprocess.run([sys.executable, "-c", _RECORD], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false", "no"])
def test_off_records_nothing(value: str) -> None:
    out, err = _record(value)
    assert out["recording"] is False and err == ""
    snap = out["snap"]
    assert snap["streamio_store_requests_total"] == {} and snap["streamio_store_bytes_read_total"] == 0.0
    assert snap["streamio_cache_bytes"] == 0.0 and snap["streamio_prefetch_depth"] == 0.0
    assert snap["streamio_checkpoint_seconds"] == {} and snap["streamio_store_request_seconds"] == {}


@pytest.mark.parametrize(("value", "warns"), [(None, False), ("on", False), ("1", False), ("of", True)])
def test_anything_else_records_and_an_unknown_word_is_named(value: str | None, warns: bool) -> None:
    out, err = _record(value)
    snap = out["snap"]
    assert out["recording"] is True
    assert snap["streamio_store_requests_total"] == {'op="get",outcome="ok"': 2.0}
    assert snap["streamio_store_bytes_read_total"] == 100.0 and snap["streamio_cache_bytes"] == 7.0
    assert snap["streamio_checkpoint_seconds"]['phase="blocked"']["count"] == 1
    if warns:
        assert err.count("\n") == 1 and "STREAMIO_METRICS='of' is neither on nor off" in err
    else:
        assert err == ""


def test_off_makes_no_directory_for_forked_children() -> None:
    code = ("import os; from streamio.metrics import processes\n"
            "pid = os.fork()\nif pid == 0: os._exit(0)\nos.waitpid(pid, 0); print(processes._state.own_dir)")
    env = {**os.environ, "STREAMIO_METRICS": "off"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"
