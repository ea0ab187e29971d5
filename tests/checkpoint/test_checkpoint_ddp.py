"""torchrun, 2 ranks, gloo: DDP model + Adam + per-rank RNG saved and restored through S3 (moto).

The worker (tests/support/ckpt.py ``ddp``) saves asynchronously, trains on, restores into fresh
objects and checks bit-exactness on each rank; here we check the outcome and that the replicated
bytes were split about evenly between the ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamio.checkpoint.root import read_manifest
from streamio.storage import Store
from streamio.testing import S3Endpoint

pytestmark = pytest.mark.slow


def test_ddp_two_ranks_save_restore_and_share_uploads(s3: S3Endpoint, tmp_path: Path) -> None:
    root = s3.url("ddp")
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["CKPT_TEST_STORAGE_OPTIONS"] = json.dumps(s3.storage_options())
    env["OMP_NUM_THREADS"] = "1"
    script = (Path(__file__).parents[1] / "support" / "ckpt.py")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(script), "ddp", root, str(out)],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [r["ok"] for r in results] == [True, True], results
    manifest = read_manifest(Store(root, s3.storage_options()), 3)
    assert manifest.world_size == 2
    replicated = sum(e.nbytes for e in manifest.replicated.tensors.values())
    by_rank = [sum(e.nbytes for e in manifest.replicated.tensors.values() if e.rank == r) for r in (0, 1)]
    assert all(0.4 * replicated <= b <= 0.6 * replicated for b in by_rank), (by_rank, replicated)
    assert all(s.tensors for s in manifest.per_rank)  # each rank saved its own RNG state
    # each rank uploaded its share (+ its per-rank state, + 64-byte alignment)
    assert all(0.4 * replicated <= r["bytes"] <= 0.65 * replicated for r in results), (results, replicated)
