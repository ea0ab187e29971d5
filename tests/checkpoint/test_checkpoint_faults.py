"""kill -9 during a save, at every phase and at byte counts through the fault proxy.

A zygote process imports torch once and forks one child per kill point (each child: save step 1,
then step 2). Kills come from the child itself at a phase boundary (test hook) or from the
proxy at an exact number of uploaded bytes (``FaultProxy.on_upload_bytes``: kill and wait until
the process is gone before forwarding more). Afterwards a fresh manager must restore step 1 or 2,
bit-exact, and the pointer must name a checkpoint that verifies.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio.checkpoint import CheckpointManager
from streamio.checkpoint.admin import check_pointer, verify_checkpoint
from streamio.storage import Store
from streamio.testing import S3Endpoint
from streamio.testing.proxy import FaultProxy
from support.ckpt import light_state_for

pytestmark = pytest.mark.slow

PHASES = ["parts", "markers", "manifest", "pointer", "delete", "retention"]
PHASE_EXPECT = {"parts": 1, "markers": 1, "manifest": 1, "pointer": 2, "delete": 2, "retention": 2}


class Zygote:
    """The forking helper process; ``run(cmd)`` returns the child's pid."""

    def __init__(self) -> None:
        script = (Path(__file__).parents[1] / "support" / "ckpt.py")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.proc = subprocess.Popen([sys.executable, str(script), "zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "zygote ready"
        self._pids: dict[str, queue.Queue[int]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "pid":
                self._queue(parts[1]).put(int(parts[2]))

    def _queue(self, token: str) -> queue.Queue[int]:
        with self._lock:
            return self._pids.setdefault(token, queue.Queue())

    def run(self, root: str, phase: str, options: dict[str, Any]) -> int:
        token = uuid.uuid4().hex
        with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"token": token, "root": root, "phase": phase, "options": options}) + "\n")
            self.proc.stdin.flush()
        return self._queue(token).get(timeout=60)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_gone(pid: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not _gone(pid):
        assert time.monotonic() < deadline, f"child {pid} did not finish"
        time.sleep(0.01)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        return
    _wait_gone(pid, 10)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def _case(zygote: Zygote, s3: S3Endpoint, phase: str, kill_at: int | None) -> tuple[str, int, Any]:
    """Run one child; returns (root, step restored, proxy log of the child's uploads)."""
    t0 = time.monotonic()
    root = s3.url(f"kill-{uuid.uuid4().hex[:8]}")
    with FaultProxy(s3.endpoint_url) as proxy:
        pid_box: list[int] = []
        if kill_at is not None:
            proxy.on_upload_bytes(kill_at, lambda: _kill(pid_box[0]))
        pid_box.append(zygote.run(root, phase, s3.storage_options(proxy.endpoint_url)))
        _wait_gone(pid_box[0])
        log = [r for r in proxy.log() if r.method in ("PUT", "POST") and r.request_bytes > 0]
    store = Store(root, s3.storage_options())
    pointed, problems = check_pointer(store)
    assert problems == [], problems
    assert pointed is not None and verify_checkpoint(store, pointed) == []
    mgr = CheckpointManager(root, storage_options=s3.storage_options())
    got: dict[str, Any] = {"model": light_state_for(0)["model"], "moments": None, "counters": None, "extra": None}
    step = mgr.restore(got)
    want = light_state_for(step)
    for (k, a), (_, b) in zip(got["model"].state_dict().items(), want["model"].state_dict().items(), strict=True):
        assert torch.equal(a, b), (phase, kill_at, k)
    assert all(torch.equal(got["moments"][k], v) for k, v in want["moments"].items())
    assert got["counters"] == {"step": step} and torch.equal(got["extra"], want["extra"])
    # and the job goes on: the next step saves, even over a manifest the killed save left unpointed
    mgr.save(step + 1, light_state_for(step + 1))
    mgr.wait()
    assert CheckpointManager(root, storage_options=s3.storage_options()).latest_step() == step + 1
    print(f"case {phase} {kill_at}: {time.monotonic() - t0:.1f}s")
    return root, step, log


def test_kill_minus_9_anywhere_leaves_a_restorable_checkpoint(zygote: Zygote, s3: S3Endpoint) -> None:
    # Calibration: an uninterrupted child, to learn where each request of step 2 lies in bytes.
    _, step, log = _case(zygote, s3, "-", None)
    assert step == 2
    uploads = [(r.path, r.request_bytes, r.status) for r in log]
    first_pointer = next(i for i, (p, _, _) in enumerate(uploads) if p.endswith("latest.json"))
    # a retried request (a slow, loaded machine) would count twice: one successful upload per object
    step1 = {p: n for p, n, status in uploads[: first_pointer + 1] if 200 <= status < 300}
    t1 = sum(step1.values())  # everything step 1 uploaded
    s2 = list({p: n for p, n, status in uploads[first_pointer + 1 :] if 200 <= status < 300}.items())
    parts = sum(n for p, n in s2 if "/part-" in p)
    marker = sum(n for p, n in s2 if "/done-" in p)
    manifest = sum(n for p, n in s2 if p.endswith("manifest.json"))
    pointer = sum(n for p, n in s2 if p.endswith("latest.json"))
    assert parts > 100_000 and marker and manifest and pointer, s2
    # Cut points in step 2's uploads. Until the manifest's last byte is forwarded the child waits
    # for that response, so it can never have sent the pointer: step 1 must come back. Inside the
    # pointer PUT, bytes already in the socket still reach the server after the kill (as on a
    # real network), so either step may come back; both must be complete and exact.
    offsets = {int(parts * f): {1} for f in (0.0, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.85, 0.97, 1.0)}
    offsets[parts + marker // 2] = {1}
    offsets[parts + marker + manifest // 2] = {1}
    offsets[parts + marker + manifest] = {1}
    offsets[parts + marker + manifest + pointer // 2] = {1, 2}
    cases = [(p, None, {PHASE_EXPECT[p]}) for p in PHASES] + [("-", t1 + off, want) for off, want in offsets.items()]
    assert len(cases) == 20  # the "20 different points": 6 phases + 14 byte counts
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: _case(zygote, s3, c[0], c[1]), cases))
    bad = [(c[0], c[1], r[1]) for c, r in zip(cases, results, strict=True) if r[1] not in c[2]]
    assert not bad, f"(phase, kill at byte, step restored) outside expectations: {bad}"
