"""StreamingDataset under torchrun: 2 ranks x 2 DataLoader workers over S3 (moto, real HTTP), a DDP
model stepping every batch, 37 uneven shards (tiny ones included), 2 epochs; stop at 40% of epoch
1 and resume on the same and on another topology (3 ranks x 1 worker); a seed mismatch raises."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamio.testing import S3Endpoint
from support.dataset import UNEVEN_37, all_keys, make_dataset

pytestmark = pytest.mark.slow
WORKER = str(Path(__file__).parents[1] / "support" / "ddp_dataset_worker.py")


def run(s3: S3Endpoint, nproc: int, args: list[str], out: Path, workers: int = 2) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_"))}
    env.update(s3.env(), OMP_NUM_THREADS="1", TEST_WORKERS=str(workers), PYTHONPATH=str(Path(__file__).parent))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
        WORKER, *args[:1], str(out), *args[1:],
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture
def ds_url(s3: S3Endpoint) -> str:
    make_dataset(s3.url("uneven37"), s3.storage_options(), UNEVEN_37)
    return s3.url("uneven37")


def test_ddp_epochs_stop_and_resume_on_same_and_other_topology(s3: S3Endpoint, ds_url: str, tmp_path: Path) -> None:
    total = set(all_keys(UNEVEN_37))
    full = run(s3, 2, [ds_url, "full"], tmp_path / "full")
    for epoch in (0, 1):
        keys = full[0][f"epoch{epoch}"] + full[1][f"epoch{epoch}"]
        counts = collections.Counter(keys)
        assert max(counts.values()) == 1 and len(total) - len(counts) <= 1  # drop: 349 % 2 = 1 sample
        assert full[0][f"batches{epoch}"] == full[1][f"batches{epoch}"] > 0
        assert full[0][f"len{epoch}"] == full[1][f"len{epoch}"] == len(full[0][f"epoch{epoch}"])
    assert full[0]["epoch0"] != full[0]["epoch1"]  # reshuffled per epoch
    for r in full:  # ranks constructed with different seeds were stopped, naming the seed
        assert r["seed_error"] and "ranks disagree" in r["seed_error"] and "seed" in r["seed_error"]

    state = tmp_path / "state.json"
    head = run(s3, 2, [ds_url, "stop", str(state)], tmp_path / "stop")
    same = run(s3, 2, [ds_url, "resume", str(state)], tmp_path / "same")
    for r in (0, 1):
        assert head[r]["epoch1"] + same[r]["epoch1"] == full[r]["epoch1"]  # identical order

    other = run(s3, 3, [ds_url, "resume", str(state)], tmp_path / "other", workers=1)
    consumed = head[0]["epoch1"] + head[1]["epoch1"]
    rest = [k for r in other for k in r["epoch1"]]
    counts = collections.Counter(consumed + rest)
    assert max(counts.values()) == 1
    assert len(total) - len(counts) <= 1 + 2  # first stage drops 1, the 3-rank stage drops < 3
    assert len({r["batches1"] for r in other}) == 1

