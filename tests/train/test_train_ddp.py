"""The trainer under torchrun: 2 CPU ranks (gloo), data and checkpoints over real HTTP to moto.

Bit-exact resume (docs/design.md "Bit-exact resume"): 40 optimizer steps uninterrupted vs the same run crashed
by ``--fail-at-step 20`` (every rank ``os._exit``s: no cleanup, the async save in flight is lost,
as after kill -9) and resumed from ``latest.json``; with dropout, shuffling, 2 DataLoader workers
per rank (StreamingDataset + StreamingDataLoader over 11 uneven shards), gradient accumulation
(no_sync), async CheckpointManager saves and an uneven validation set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.testing import S3Endpoint
from streamio.train.data import iter_samples
from streamio.train.telemetry import read_metrics

pytestmark = pytest.mark.slow

COMMON = [
    "--batch-size", "16", "--grad-accum", "2",  # 2048 samples / 2 ranks / 16 / 2: 32 steps per epoch
    "--num-workers", "2", "--dropout", "0.2", "--hidden", "64", "--epochs", "4", "--max-steps", "40",
    "--val-batch-size", "64",  # 129 validation samples: rank 0 has 2 batches, rank 1 has 1
    "--ckpt-every", "5", "--log-every", "10", "--collective-timeout-s", "60", "--keep-last", "2",
]


def _env(s3: S3Endpoint) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    return {**env, **s3.env(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _torchrun(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "-m", "streamio.train", *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _steps(out: Path) -> dict[int, list[float]]:
    """step -> [loss of rank 0, loss of rank 1]."""
    per_rank = [
        {r["step"]: r["loss"] for r in read_metrics(out / f"rank-{k:05d}.jsonl") if r["event"] == "step"}
        for k in (0, 1)
    ]
    assert per_rank[0].keys() == per_rank[1].keys()
    return {s: [per_rank[0][s], per_rank[1][s]] for s in per_rank[0]}


def _records(out: Path, rank: int, event: str) -> list[dict[str, Any]]:
    return [r for r in read_metrics(out / f"rank-{rank:05d}.jsonl") if r["event"] == event]


def _shard_demo_data(s3: S3Endpoint, train: int, val: int) -> str:
    """The demo's synthetic samples as streamio datasets in moto: 11 uneven train shards."""
    for split, n in (("train", train), ("val", val)):
        write_dataset(
            iter_samples(n, split=split), s3.url(f"data/{split}"), s3.storage_options(),
            spec=ShardSpec(max_count=200, prefix=split),
        )
    return s3.url("data")


def test_crash_and_resume_is_bit_exact(tmp_path: Path, s3: S3Endpoint) -> None:
    env = _env(s3)
    data = ["--data-url", _shard_demo_data(s3, 2048, 129)]
    ref_out, run_out, resumed_out = tmp_path / "ref", tmp_path / "run", tmp_path / "resumed"

    ref = _torchrun([*COMMON, *data, "--ckpt-url", s3.url("ref"), "--out-dir", str(ref_out)], env)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]
    assert "samples/s" in ref.stdout and "data stall" in ref.stdout and "ckpt blocked" in ref.stdout

    # the run to crash: every rank leaves with os._exit right after step 20 (no cleanup, no flush
    # of the checkpoint in flight), which is what kill -9 leaves behind in storage
    crashed = _torchrun(
        [*COMMON, *data, "--ckpt-url", s3.url("run"), "--out-dir", str(run_out), "--fail-at-step", "20"], env
    )
    assert crashed.returncode != 0 and "simulating a crash" in crashed.stdout
    killed_at = max(_steps(run_out))
    assert killed_at == 20

    resumed = _torchrun([*COMMON, *data, "--ckpt-url", s3.url("run"), "--out-dir", str(resumed_out)], env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    resumed_from = _records(resumed_out, 0, "resume")[0]["step"]
    assert resumed_from % 5 == 0 and 5 <= resumed_from <= killed_at and "resumed from" in resumed.stdout

    ref_steps, before, after = _steps(ref_out), _steps(run_out), _steps(resumed_out)
    assert sorted(ref_steps) == list(range(1, 41))
    assert sorted(after) == list(range(resumed_from + 1, 41))
    for step, losses in {**before, **after}.items():
        assert losses == ref_steps[step], f"step {step}: {losses} != {ref_steps[step]}"
    assert ref_steps[1][0] != ref_steps[1][1]  # the ranks really saw different data

    ref_model = torch.load(ref_out / "final_model.pt", weights_only=True)
    got_model = torch.load(resumed_out / "final_model.pt", weights_only=True)
    assert ref_model.keys() == got_model.keys()
    assert all(torch.equal(ref_model[k], got_model[k]) for k in ref_model)

    # validation after epoch 0 covered the uneven set once, with the same result on both ranks
    for out in (ref_out, run_out if killed_at > 32 else resumed_out):
        vals = [_records(out, k, "val")[0] for k in (0, 1)]
        assert vals[0]["val_count"] == vals[1]["val_count"] == 129
        assert vals[0]["val_loss"] == vals[1]["val_loss"]
    summary = json.loads(resumed.stdout.split("summary: ", 1)[1].splitlines()[0])
    assert summary["steps"] == 40 and summary["resumed_from"] == resumed_from


def test_a_rank_without_validation_batches_does_not_hang_and_fail_at_step_exits_at_once(
    tmp_path: Path, s3: S3Endpoint
) -> None:
    """One validation sample: rank 1 has no batch at all, yet both ranks finish validation; then
    --fail-at-step ends the job with an error right after the step, with no checkpoint wait."""
    out = tmp_path / "out"
    args = ["--train-samples", "128", "--batch-size", "16", "--grad-accum", "1", "--num-workers", "0", "--epochs", "3",
            "--val-samples", "1", "--ckpt-every", "3", "--collective-timeout-s", "30", "--ckpt-url", s3.url("c"),
            "--out-dir", str(out), "--fail-at-step", "6"]  # 4 steps per epoch: crash inside epoch 1
    crashed = _torchrun(args, _env(s3), timeout=90)
    assert crashed.returncode != 0 and "simulating a crash" in crashed.stdout
    assert max(_steps(out)) == 6
    for k in (0, 1):
        vals = _records(out, k, "val")
        assert [(v["epoch"], v["val_count"]) for v in vals] == [(0, 1.0)]
        assert not _records(out, k, "summary")
