"""kill -9 at every phase of the first save on a new timeline (issue 14), on S3 and local disk.

A child (forked by the zygote of test_checkpoint_faults.py) builds a root of three timelines,
rolls back to step 3 of the first and dies at one phase of its first save there
(``support.ckpt.timeline_scenario``). Then, in this process:

* restore returns the newest committed step of the current timeline, bit for bit: timeline 3's
  step 8 when the child died before its pointer swap, the new step 4 from the swap on;
* with that checkpoint damaged, the walk goes back along the current timeline only (step 7 of
  timeline 3, or step 3 of timeline 1), never to a step of an abandoned one;
* the resumed job saves the next step, which retires every abandoned save, and every save left
  is on the current timeline.
"""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from test_checkpoint_faults import Zygote, _wait_gone

from streamio.checkpoint import CheckpointManager
from streamio.checkpoint.admin import check_pointer, verify_checkpoint
from streamio.checkpoint.format.timeline import Tip, classify
from streamio.checkpoint.root import committed_saves, read_manifest, read_pointer
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.ckpt import light_state_for

pytestmark = pytest.mark.slow

PHASES = ["parts", "markers", "manifest", "pointer", "delete", "retention"]
BEFORE_SWAP = {"parts", "markers", "manifest"}


class TimelineZygote(Zygote):
    def run(self, root: str, phase: str, options: dict[str, Any]) -> int:
        token = uuid.uuid4().hex
        with self._lock:
            assert self.proc.stdin is not None
            line = {"token": token, "root": root, "phase": phase, "options": options, "scenario": "timeline"}
            self.proc.stdin.write(json.dumps(line) + "\n")
            self.proc.stdin.flush()
        return self._queue(token).get(timeout=60)


def _template() -> dict[str, Any]:
    return {"model": light_state_for(0)["model"], "moments": None, "counters": None, "extra": None}


def _restore(root: str, options: dict[str, Any]) -> tuple[CheckpointManager, int, int]:
    """A resumed job: its manager, the step restored and which state it was (100 * timeline + step)."""
    mgr = CheckpointManager(root, storage_options=options, async_save=False)
    got = _template()
    step = mgr.restore(got)
    seed = got["counters"]["step"]
    want = light_state_for(seed)
    for (k, a), (_, b) in zip(got["model"].state_dict().items(), want["model"].state_dict().items(), strict=True):
        assert torch.equal(a, b), (root, k)
    assert all(torch.equal(got["moments"][k], v) for k, v in want["moments"].items())
    return mgr, step, seed


def _damage_pointed(store: Store) -> None:
    pointer = read_pointer(store)
    assert pointer is not None
    part = read_manifest(store, pointer.step, path=pointer.path).files[0].path
    data = bytearray(store.read(f"{pointer.path}/{part}"))
    data[len(data) // 2] ^= 0xFF
    store.put(f"{pointer.path}/{part}", bytes(data))


def _case(zygote: TimelineZygote, root: str, options: dict[str, Any], phase: str) -> None:
    _wait_gone(zygote.run(root, phase, options))
    store = Store(root, options)
    pointed, problems = check_pointer(store)
    assert problems == [] and pointed is not None and verify_checkpoint(store, pointed) == [], (phase, problems)
    # the newest committed step of the current timeline, bit for bit
    _, step, seed = _restore(root, options)
    expected = (8, 308) if phase in BEFORE_SWAP else (4, 404)
    assert (step, seed) == expected, (phase, step, seed)
    # with it damaged, the walk stays on the current timeline
    _damage_pointed(store)
    mgr, step, seed = _restore(root, options)
    assert (step, seed) == ((7, 307) if phase in BEFORE_SWAP else (3, 103)), (phase, step, seed)
    # and the job goes on: its next save supersedes everything abandoned
    mgr.save(step + 1, light_state_for(900 + step + 1))
    pointer = read_pointer(store)
    assert pointer is not None and pointer.step == step + 1
    tip = Tip(pointer.timeline, pointer.step)
    for ref in committed_saves(store):
        m = read_manifest(store, ref.step, path=ref.path)
        assert classify(tip, m.line, m.step) == "current", (phase, ref)
    steps = [r.step for r in committed_saves(store)]
    assert steps == list(range(1, step + 2)), (phase, steps)
    assert CheckpointManager(root, storage_options=options).latest_step() == step + 1


@pytest.fixture(scope="module")
def zygote() -> Any:
    z = TimelineZygote()
    yield z
    z.close()


def test_kill_minus_9_at_every_phase_of_the_first_save_on_a_new_timeline(
    zygote: TimelineZygote, s3: S3Endpoint, tmp_path: Path
) -> None:
    cases = [(s3.url(f"tl-{phase}"), s3.storage_options(), phase) for phase in PHASES]
    cases += [(str(tmp_path / phase), {}, phase) for phase in PHASES]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda c: _case(zygote, *c), cases))
