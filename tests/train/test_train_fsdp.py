"""The trainer with ``--fsdp`` (FSDP2 on 2 gloo ranks, torchrun): exact resume, and resume on 1 rank.

* Bit-exact resume, as for DDP (tests/train/test_train_ddp.py): an uninterrupted 2-rank FSDP run
  vs the same run crashed by ``--fail-at-step`` (``os._exit``: the save in flight is lost) and
  resumed from ``latest.json``: every step's loss on every rank and the final weights are equal
  bit for bit. The checkpoints are sharded (manifest format 3: each rank wrote its own shards).
  The validation set is uneven (rank 0 has 2 batches, rank 1 one): FSDP's forward is a
  collective, so the shorter share is padded with an empty batch instead of hanging.
* The crashed run's checkpoint resumed by ONE plain process (``--fsdp`` without torchrun): the
  model and optimizer are exactly the 2-rank state at that step (compared with the uninterrupted
  run's own checkpoint of the step, restored onto a plain model), and the data position is the
  2-rank run's, re-planned for 1 rank (the unconsumed rest of the epoch, in batches of 1 rank).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio.checkpoint import CheckpointManager, ShardedModelState
from streamio.checkpoint.root import read_manifest
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.storage import Store
from streamio.train.config import TrainConfig
from streamio.train.data import iter_samples
from streamio.train.distributed import Distributed
from streamio.train.loop import Trainer
from streamio.train.model import make_model
from streamio.train.telemetry import read_metrics

pytestmark = pytest.mark.slow

HIDDEN, TRAIN, VAL, BATCH, ACCUM = 64, 1024, 129, 16, 2  # 1024 / 2 ranks / 16 / 2: 16 steps per epoch
COMMON = [
    "--fsdp", "--batch-size", str(BATCH), "--grad-accum", str(ACCUM), "--num-workers", "0",
    "--dropout", "0.2", "--hidden", str(HIDDEN), "--epochs", "2", "--max-steps", "24",
    "--val-batch-size", "64",  # 129 validation samples: rank 0 has 2 batches, rank 1 has 1
    "--ckpt-every", "5", "--log-every", "0", "--collective-timeout-s", "60",
]
ONE = Distributed(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), initialized=False)


@pytest.fixture
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _torchrun(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           "-m", "streamio.train", *COMMON, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _losses(out: Path) -> dict[tuple[int, int], float]:
    return {(r["step"], rank): r["loss"] for rank in (0, 1) for r in read_metrics(out / f"rank-{rank:05d}.jsonl")
            if r["event"] == "step"}


def _records(out: Path, event: str, rank: int = 0) -> list[dict[str, Any]]:
    return [r for r in read_metrics(out / f"rank-{rank:05d}.jsonl") if r["event"] == event]


def _flat(tree: Any, path: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{path}/{key}").items()}
    return {path: tree}


def test_fsdp_crash_resume_is_bit_exact_and_resumes_on_one_rank(tmp_path: Path, _one_thread: None) -> None:
    data = tmp_path / "data"
    for split, n in (("train", TRAIN), ("val", VAL)):
        write_dataset(iter_samples(n, split=split), str(data / split), spec=ShardSpec(max_count=200, prefix=split))
    common = ["--data-url", str(data)]
    ref_out, run_out, resumed_out = tmp_path / "ref", tmp_path / "run", tmp_path / "resumed"
    ref_ckpt, run_ckpt = tmp_path / "ref-ckpt", tmp_path / "run-ckpt"

    ref = _torchrun([*common, "--ckpt-url", str(ref_ckpt), "--out-dir", str(ref_out), "--keep-last", "10"])
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    crashed = _torchrun([*common, "--ckpt-url", str(run_ckpt), "--out-dir", str(run_out), "--fail-at-step", "13"])
    assert crashed.returncode != 0 and "simulating a crash" in crashed.stdout, crashed.stdout[-3000:]
    one_ckpt = tmp_path / "one-ckpt"
    shutil.copytree(run_ckpt, one_ckpt)  # the same crashed state, for the 1-rank resume below

    resumed = _torchrun([*common, "--ckpt-url", str(run_ckpt), "--out-dir", str(resumed_out)])
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    step = _records(resumed_out, "resume")[0]["step"]
    assert step in (5, 10)
    manifest = read_manifest(Store(str(one_ckpt)), step)  # the crashed run's (retention removed it since)
    assert manifest.world_size == 2 and {c.rank for c in manifest.sharded["app/model/0.weight"].chunks} == {0, 1}

    ref_losses, combined = _losses(ref_out), {**_losses(run_out), **_losses(resumed_out)}
    assert sorted({s for s, _ in ref_losses}) == list(range(1, 25))
    assert combined == ref_losses
    assert ref_losses[(1, 0)] != ref_losses[(1, 1)]  # the ranks saw different data
    ref_w = torch.load(ref_out / "final_model.pt", weights_only=True)
    got_w = torch.load(resumed_out / "final_model.pt", weights_only=True)
    assert ref_w.keys() == got_w.keys() == make_model(hidden=HIDDEN).state_dict().keys()
    assert all(torch.equal(ref_w[k], got_w[k]) for k in ref_w)
    vals = [_records(ref_out, "val", rank)[0] for rank in (0, 1)]
    assert vals[0]["val_count"] == vals[1]["val_count"] == VAL and vals[0]["val_loss"] == vals[1]["val_loss"]

    # one plain process resumes the 2-rank FSDP checkpoint
    cfg = TrainConfig(fsdp=True, data_url=str(data), ckpt_url=str(one_ckpt), out_dir=str(tmp_path / "one"),
                      batch_size=BATCH, grad_accum=ACCUM, num_workers=0, dropout=0.2, hidden=HIDDEN, epochs=2,
                      max_steps=24, val_batch_size=64, ckpt_every=5, log_every=0)
    one = Trainer(cfg, ONE)
    assert one.resume() == step and one.progress.step == step and one.progress.epoch == 0
    # the data position: the 2-rank run's unconsumed rest of epoch 0, in 1 rank's batches
    consumed = step * ACCUM * BATCH * 2
    assert len(one.data.train) == (TRAIN - consumed) // BATCH
    # model and optimizer: the 2-rank state at that step, every element (the uninterrupted run's
    # checkpoint of the same step, restored onto a plain model, is that state: the runs are equal)
    torch.manual_seed(0)
    net = make_model(hidden=HIDDEN, dropout=0.2)
    expected = ShardedModelState(net, torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay))
    assert CheckpointManager(str(ref_ckpt)).restore({"app": expected}, step=step) == step
    want, got = _flat(expected.state_dict()), _flat(one.state()["app"].state_dict())
    assert want.keys() == got.keys() and any(k.endswith("exp_avg_sq") for k in want)
    for key, value in want.items():
        assert torch.equal(value, got[key]) if isinstance(value, torch.Tensor) else value == got[key], key
    summary = one.run()
    one.close()
    assert summary.resumed_from == step and summary.steps == 24
    assert sorted(r["step"] for r in _records(tmp_path / "one", "step")) == list(range(step + 1, 25))
    assert _records(tmp_path / "one", "val")[0]["val_count"] == VAL
