"""torchrun, 2 gloo ranks, a real ``accelerate.Accelerator``: streamio's loader through
``streamio.accelerate.prepare``, ``save_state`` / ``load_state`` to S3 (moto), kill -9 of the whole job.

One family of launches (tests/support/accelerate_run.py) serves every test here: an uninterrupted
run of 14 steps on 2 ranks, a run killed at step 10 (saves every 4 steps), a resume of its
checkpoint on 1 rank (saving nothing), then its resume on 2 ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamio.checkpoint.root import read_pointer
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.dataset import all_keys, make_dataset

pytest.importorskip("accelerate")
pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "support" / "accelerate_run.py"
COUNTS = [7, 5, 9, 3]  # 24 samples: 6 batches of 2 per rank and epoch on 2 ranks


def _run(s3: S3Endpoint, ckpt: str, out: Path, *, ranks: int = 2, steps: int = 14, kill_at: int = 0,
         save_every: int = 4) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3.env())
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), str(SCRIPT),
         s3.url("ds"), s3.url(ckpt), str(out), str(steps), str(kill_at), str(save_every)],
        env=env, capture_output=True, text=True, timeout=300, start_new_session=True,  # its own process group
    )
    assert proc.returncode == 0 or kill_at, proc.stderr[-3000:]
    return proc.returncode


def _steps(out: Path, rank: int) -> list[list[Any]]:
    return json.loads(Path(f"{out}.rank{rank}").read_text())


@pytest.fixture(scope="module")
def runs(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[S3Endpoint, Path]]:
    s3 = S3Endpoint(moto_endpoint, "unused").new_bucket()
    tmp = tmp_path_factory.mktemp("accelerate")
    make_dataset(s3.url("ds"), s3.storage_options(), COUNTS)
    _run(s3, "full", tmp / "full.json")
    killed = _run(s3, "ckpt", tmp / "killed.json", kill_at=10)
    assert killed != 0 and not (tmp / "killed.json").exists()
    pointer = read_pointer(Store(s3.url("ckpt"), s3.storage_options()))
    assert pointer is not None and pointer.step == 8  # saves every 4; every rank waited for step 8's before the kill
    _run(s3, "ckpt", tmp / "one.json", ranks=1, steps=16, save_every=100)  # step 8 of 2 ranks on 1, saving nothing
    _run(s3, "ckpt", tmp / "resumed.json")  # step 8 on 2 ranks again, saving at 12
    yield s3, tmp


def test_every_sample_once_per_epoch_equal_batches_on_the_accelerator_device(runs: tuple[S3Endpoint, Path]) -> None:
    _, tmp = runs
    full = [_steps(tmp / "full.json", rank) for rank in (0, 1)]
    assert [len(steps) for steps in full] == [14, 14]
    for epoch in (0, 1):  # 14 steps: epochs 0 and 1 whole, 2 begun
        per_rank = [[k for _, e, keys, *_ in steps if e == epoch for k in keys] for steps in full]
        assert len(per_rank[0]) == len(per_rank[1]) == 12  # 6 batches of 2 on each rank
        assert sorted(per_rank[0] + per_rank[1]) == sorted(all_keys(COUNTS))
    for steps in full:
        for _, _, _, _, device, accelerator_device, _ in steps:
            assert device.split(":")[0] == accelerator_device.split(":")[0] == "cpu"
        # GradientState saw the loader end each epoch at its last batch (steps 6 and 12), nowhere else
        assert [s for s, *_, end in steps if end] == [6, 12]


def test_kill_9_then_load_state_gives_the_uninterrupted_losses_and_weights(runs: tuple[S3Endpoint, Path]) -> None:
    _, tmp = runs
    full = json.loads((tmp / "full.json").read_text())
    resumed = json.loads((tmp / "resumed.json").read_text())
    assert full["start"] == 0 and resumed["start"] == 8
    assert resumed["weights"] == full["weights"]
    for rank in (0, 1):
        rest = _steps(tmp / "resumed.json", rank)
        assert [s[0] for s in rest] == list(range(9, 15))
        assert rest == _steps(tmp / "full.json", rank)[8:], rank  # same batches, same losses bit for bit


def test_a_checkpoint_of_2_ranks_resumes_on_1_with_every_sample_of_the_epoch_once(
    runs: tuple[S3Endpoint, Path],
) -> None:
    _, tmp = runs
    one = json.loads((tmp / "one.json").read_text())
    assert one["start"] == 8
    before = [k for rank in (0, 1) for step, e, keys, *_ in _steps(tmp / "full.json", rank)
              if e == 1 and step <= 8 for k in keys]  # what the 2 ranks read of epoch 1 before the save
    after = _steps(tmp / "one.json", 0)
    assert [s[0] for s in after] == list(range(9, 17)) and {s[1] for s in after} == {1}
    assert sorted(before + [k for s in after for k in s[2]]) == sorted(all_keys(COUNTS))
    assert after[-1][-1] is True  # its last batch ends the epoch
