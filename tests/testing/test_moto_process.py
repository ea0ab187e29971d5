"""``MotoProcess``: the session's S3 server in a process of its own (tests/conftest.py), which
answers, stops, says why it did not start, and does not outlive the process that started it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from streamio.testing import MotoProcess, S3Endpoint

ORPHAN = """
import sys
from streamio.testing import MotoProcess
server = MotoProcess()
server.start()
print(server._proc.pid, flush=True)
sys.stdin.read()  # until killed
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_it_serves_until_stopped_and_stops_twice_quietly() -> None:
    server = MotoProcess()
    endpoint = server.start()
    assert endpoint.startswith("http://127.0.0.1:")
    s3 = S3Endpoint(endpoint, "unused").new_bucket()
    s3.boto3_client().put_object(Bucket=s3.bucket, Key="k", Body=b"v")
    assert s3.boto3_client().get_object(Bucket=s3.bucket, Key="k")["Body"].read() == b"v"
    pid = server._proc.pid  # type: ignore[union-attr]
    server.stop()
    server.stop()
    assert not _alive(pid)


def test_a_server_that_does_not_answer_in_time_is_stopped_and_named() -> None:
    class Impatient(MotoProcess):
        START_TIMEOUT_S = 0.001

    server = Impatient()
    with pytest.raises(RuntimeError, match=r"the moto process did not start within 0.001 s"):
        server.start()
    assert server._proc is None


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_it_ends_when_the_process_that_started_it_is_killed() -> None:
    with subprocess.Popen([sys.executable, "-c", ORPHAN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as parent:
        try:
            moto_pid = int(parent.stdout.readline())  # type: ignore[union-attr]
            assert _alive(moto_pid)
        finally:
            parent.kill()
    deadline = time.monotonic() + 15
    while _alive(moto_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(moto_pid), "the moto process outlived its parent"
