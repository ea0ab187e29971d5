"""kill -9 at every phase of a local commit and of a background upload, and at byte counts of an upload (issue 25).

A child (forked by the zygote of test_checkpoint_faults.py) saves steps 1-4 on a local tier with
``durable_every=2`` over moto S3 (steps 2 and 4 are uploaded in the background; the root keeps
one), and dies at one phase of step 3 or 4: a local phase in the save thread, a root phase in the
upload thread (``support.ckpt.tiers_scenario``), or where the fault proxy cuts an upload at a byte
count. Then, in this process:

* the root's pointer names a checkpoint that verifies (the one before the killed upload, or the
  uploaded one from the pointer swap on; none if the first upload was cut);
* a new manager on the same local directory and root restores the newest step that some tier
  holds complete, bit for bit: the killed save from its local pointer on, else the one before;
* the job goes on: its next save, made durable, moves the root's pointer there.
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from test_checkpoint_faults import Zygote, _kill, _wait_gone

from streamio.checkpoint import CheckpointManager, LocalTier, SaveOptions
from streamio.checkpoint.admin import check_pointer, verify_checkpoint
from streamio.checkpoint.root import read_pointer
from streamio.storage import Store
from streamio.storage.backends.base import TMP_SUFFIX
from streamio.testing import FaultProxy, S3Endpoint
from support.ckpt import FAULT_PART_SIZE, light_state_for

pytestmark = pytest.mark.slow

LOCAL_PHASES = ["local-parts", "local-manifest", "local-pointer"]
ROOT_PHASES = ["parts", "markers", "manifest", "pointer", "delete", "retention"]
OPTIONS = SaveOptions(part_size=FAULT_PART_SIZE, concurrency=4, durable_every=2)


class TiersZygote(Zygote):
    def run(self, root: str, phase: str, options: dict[str, Any], *, local: str = "", die_step: int = 0) -> int:
        token = uuid.uuid4().hex
        with self._lock:
            assert self.proc.stdin is not None
            line = {"token": token, "root": root, "phase": phase, "options": options, "scenario": "tiers",
                    "kwargs": {"local": local, "die_step": die_step}}
            self.proc.stdin.write(json.dumps(line) + "\n")
            self.proc.stdin.flush()
        return self._queue(token).get(timeout=60)


@pytest.fixture(scope="module")
def zygote() -> Any:
    z = TiersZygote()
    yield z
    z.close()


def _expected(die_step: int, phase: str) -> tuple[int, set[int | None]]:
    """(the step restored, the steps the root's pointer may name) after a kill at ``phase`` of ``die_step``."""
    if phase in LOCAL_PHASES:  # the local pointer is the local commit
        return (die_step if phase == "local-pointer" else die_step - 1), {2}
    return 4, ({2} if phase in ("parts", "markers", "manifest") else {4})


def _check_state(got: dict[str, Any], step: int, where: Any) -> None:
    want = light_state_for(step)
    for (k, a), (_, b) in zip(got["model"].state_dict().items(), want["model"].state_dict().items(), strict=True):
        assert torch.equal(a, b), (where, k)
    assert got["moments"].keys() == want["moments"].keys(), where
    assert all(torch.equal(got["moments"][k], v) for k, v in want["moments"].items()), where
    assert got["counters"] == {"step": step} and torch.equal(got["extra"], want["extra"]), where


def _template() -> dict[str, Any]:
    return {"model": light_state_for(0)["model"], "moments": None, "counters": None, "extra": None}


def _after(root: str, local: str, options: dict[str, Any], where: Any) -> tuple[int, int | None]:
    """Check what a killed child left; returns (step restored, step the root's pointer names)."""
    store = Store(root, options)
    pointed = None
    if read_pointer(store) is not None:  # none: the first upload was cut
        pointed, problems = check_pointer(store)
        assert problems == [] and pointed is not None and verify_checkpoint(store, pointed) == [], (where, problems)
    tier = LocalTier(local, keep=2)
    with CheckpointManager(root, storage_options=options, local=tier, options=OPTIONS) as mgr:
        got = _template()
        step = mgr.restore(got)
        _check_state(got, step, where)
        # the job goes on: its next save, durable, moves the root's pointer forward
        mgr.save(step + 1, light_state_for(step + 1), durable=True)
        mgr.wait()
        assert mgr.durable_step == step + 1, where
    pointer_now, problems = check_pointer(store)
    assert pointer_now == step + 1 and problems == [] and verify_checkpoint(store, step + 1) == [], where
    # the local tier keeps its 2 newest saves of the job's timeline, and nothing a killed commit left
    assert _local_saves(local) == [step, step + 1], where
    return step, pointed


def _local_saves(local: str) -> list[int]:
    """The steps of every save directory in rank 0's local root (each must hold a manifest, and
    no temp file of an unfinished write may be left anywhere)."""
    rank_root = Path(local) / "rank-00000"
    assert not [p for p in rank_root.rglob("*") if p.name.endswith(TMP_SUFFIX)], list(rank_root.rglob("*"))
    dirs = sorted(p for p in rank_root.iterdir() if p.is_dir())
    assert all((d / "manifest.json").exists() for d in dirs), dirs
    return [int(d.name.split("-")[1]) for d in dirs]


def _phase_case(zygote: TiersZygote, s3: S3Endpoint, local: str, die_step: int, phase: str) -> tuple[Any, Any]:
    root = s3.url(f"tk-{uuid.uuid4().hex[:8]}")
    _wait_gone(zygote.run(root, phase, s3.storage_options(), local=local, die_step=die_step))
    if phase == "local-parts":  # and what a kill inside a part's write leaves: its temp file beside the parts
        [parts] = [p for p in Path(local).glob(f"rank-00000/step-{die_step:09d}-*/rank-00000")
                   if not (p.parent / "manifest.json").exists()]
        (parts / f".part-x-00099.bin.k1ll3d{TMP_SUFFIX}").write_bytes(b"half a part")
    return _after(root, local, s3.storage_options(), (die_step, phase))


def _byte_case(
    zygote: TiersZygote, s3: S3Endpoint, local: str, kill_at: int | None
) -> tuple[int, int | None, list[Any]]:
    """One child whose uploads go through a proxy that kills it after ``kill_at`` bytes (None: never)."""
    root = s3.url(f"tb-{uuid.uuid4().hex[:8]}")
    with FaultProxy(s3.endpoint_url) as proxy:
        pid: list[int] = []
        if kill_at is not None:
            proxy.on_upload_bytes(kill_at, lambda: _kill(pid[0]))
        pid.append(zygote.run(root, "-", s3.storage_options(proxy.endpoint_url), local=local))
        _wait_gone(pid[0])
        log = [r for r in proxy.log() if r.method in ("PUT", "POST") and r.request_bytes > 0]
    step, pointed = _after(root, local, s3.storage_options(), ("bytes", kill_at))
    return step, pointed, log


def test_kill_minus_9_at_every_phase_of_a_local_commit_and_of_an_upload(
    zygote: TiersZygote, s3: S3Endpoint, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    cases = [(3, p) for p in LOCAL_PHASES] + [(4, p) for p in LOCAL_PHASES + ROOT_PHASES]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda c: _phase_case(zygote, s3, str(tmp_path / f"{c[0]}-{c[1]}"), *c), cases))
    outcomes = {case: (step, pointed) for case, (step, pointed) in zip(cases, got, strict=True)}
    wrong = {case: o for case, o in outcomes.items() if o[0] != _expected(*case)[0] or o[1] not in _expected(*case)[1]}
    assert not wrong, f"(die step, phase) -> (step restored, root pointer), outside expectations: {wrong}"
    print(f"{len(cases)} phase cases: {time.monotonic() - t0:.1f}s")


def test_kill_minus_9_at_byte_counts_of_an_upload(zygote: TiersZygote, s3: S3Endpoint, tmp_path: Path) -> None:
    t0 = time.monotonic()
    # Calibration: an uninterrupted child, to learn where each upload request lies in bytes.
    step, pointed, log = _byte_case(zygote, s3, str(tmp_path / "calibrate"), None)
    assert (step, pointed) == (4, 4)
    ok = [(r.path, r.request_bytes) for r in log if 200 <= r.status < 300]
    first_pointer = next(i for i, (p, _) in enumerate(ok) if p.endswith("latest.json"))
    step2 = dict(ok[: first_pointer + 1])  # a retried request counts once: one upload per object
    pointer2 = sum(step2.values())  # step 2's pointer PUT ends here (then the root's retention.json)
    first4 = next(i for i, (p, _) in enumerate(ok) if "/step-000000004-" in p)
    t2 = sum(dict(ok[:first4]).values())  # step 4's upload starts here
    s4 = dict(ok[first4:])
    parts = sum(n for p, n in s4.items() if "/part-" in p)
    marker = sum(n for p, n in s4.items() if "/done-" in p)
    manifest = sum(n for p, n in s4.items() if p.endswith("manifest.json"))
    pointer = sum(n for p, n in s4.items() if p.endswith("latest.json"))
    step2_parts = sum(n for p, n in step2.items() if "/part-" in p)
    assert parts > 100_000 and marker and manifest and pointer and step2_parts, s4
    # Cut points: inside step 2's upload (the root gets no pointer: step 2 comes back from the local
    # tier, and the next job's durable save creates the pointer), and inside step 4's (the root keeps
    # step 2; inside the pointer PUT either may be current). Step 4 always comes back, from the local tier.
    cases = {step2_parts // 2: (2, {None}), pointer2 - 1: (2, {None})}
    for off, pointers in [(1, {2}), (parts // 2, {2}), (parts, {2}), (parts + marker // 2, {2}),
                          (parts + marker + manifest // 2, {2}), (parts + marker + manifest + pointer // 2, {2, 4})]:
        cases[t2 + off] = (4, pointers)
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda at: _byte_case(zygote, s3, str(tmp_path / f"at-{at}"), at), cases))
    wrong = {at: r[:2] for (at, (step, pointers)), r in zip(cases.items(), got, strict=True)
             if r[0] != step or r[1] not in pointers}
    assert not wrong, f"kill at byte -> (step restored, root pointer), outside expectations: {wrong}"
    print(f"{len(cases) + 1} byte cases: {time.monotonic() - t0:.1f}s")

