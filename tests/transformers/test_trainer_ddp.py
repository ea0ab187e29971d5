"""torchrun, 2 gloo ranks, the real transformers Trainer: ``StreamioTrainer`` over a token dataset and a
checkpoint root on S3 (moto). One family of launches (uninterrupted, killed with SIGKILL after the
save of step 8, resumed with ``train(resume_from_checkpoint=True)``; preempted by a SIGTERM to one
rank, resumed) serves every assertion.

2 ranks x batches of 2 over 24 samples: 6 batches a rank and epoch, 12 steps = 2 epochs; saves
every 4 steps, so step 8 is mid-epoch (epoch 1, its 2nd batch done)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamio.checkpoint.root import committed_saves, read_pointer
from streamio.storage import Store
from streamio.testing import S3Endpoint

pytest.importorskip("transformers")
from support.transformers_ddp import write_tokens  # noqa: E402 - needs transformers

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parents[1] / "support" / "transformers_ddp.py"
STEPS, KILL_AT, SAVED = 12, 10, 8


def _run(s3: S3Endpoint, root: str, out: Path, *, kill_at: int = 0, resume: bool = False,
         sigterm_at: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(s3.env(), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if sigterm_at is not None:  # preemption=Preemption(); rank 1 alone gets SIGTERM after that step (> 0)
        env["SIGTERM_AT"] = str(sigterm_at)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
         s3.url("ds"), root, str(out), str(STEPS), str(kill_at), "1" if resume else "0"],
        env=env, capture_output=True, text=True, timeout=300, start_new_session=True,  # its own process group
    )
    assert proc.returncode == 0 or kill_at or sigterm_at, proc.stderr[-3000:]
    return proc


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def runs(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    s3 = S3Endpoint(moto_endpoint, "unused").new_bucket()
    tmp = tmp_path_factory.mktemp("trainer")
    keys = write_tokens(s3.url("ds"), s3.storage_options(), 24)
    _run(s3, s3.url("full"), tmp / "full")
    killed = _run(s3, s3.url("ckpt"), tmp / "killed", kill_at=KILL_AT).returncode
    pointer = read_pointer(Store(s3.url("ckpt"), s3.storage_options()))
    _run(s3, s3.url("ckpt"), tmp / "resumed", resume=True)
    store = Store(s3.url("ckpt"), s3.storage_options())
    preempted = _run(s3, s3.url("pre"), tmp / "preempted", sigterm_at=KILL_AT)
    preempted_kept = [s.step for s in committed_saves(Store(s3.url("pre"), s3.storage_options()))]
    _run(s3, s3.url("pre"), tmp / "preempted-resumed", resume=True, sigterm_at=0)
    return {"preempted": preempted, "preempted_out": Path(f"{tmp / 'preempted'}.rank0").exists(),
            "preempted_kept": preempted_kept, "preempted_resumed": _ranks(tmp / "preempted-resumed"),
            "keys": keys, "killed": killed, "killed_out": Path(f"{tmp / 'killed'}.rank0").exists(),
            "pointer": pointer.step if pointer else None, "full": _ranks(tmp / "full"),
            "resumed": _ranks(tmp / "resumed"), "kept": [s.step for s in committed_saves(store)],
            "output_dir": sorted(p.name for p in (tmp / "resumed.output_dir").glob("*"))}


def test_every_sample_once_an_epoch_and_equal_batches_on_every_rank(runs: dict[str, Any]) -> None:
    full = runs["full"]
    assert [len(r["batches"]) for r in full] == [STEPS, STEPS]  # not re-sharded by Accelerate: 6 a rank and epoch
    for epoch in range(2):
        read = [k for r in full for b in r["batches"][epoch * 6:(epoch + 1) * 6] for k in b]
        assert sorted(read) == runs["keys"], epoch
    assert full[0]["batches"][:6] != full[0]["batches"][6:]  # a new order in the second epoch
    assert [r["fetched"] for r in full] == [24, 24]


def test_kill_9_after_a_save_then_resume_equals_the_uninterrupted_run(runs: dict[str, Any]) -> None:
    assert runs["killed"] != 0 and not runs["killed_out"]
    assert runs["pointer"] == SAVED
    full, resumed = runs["full"], runs["resumed"]
    assert [r["restored"] for r in resumed] == [SAVED, SAVED]
    assert resumed[0]["global_step"] == full[0]["global_step"] == STEPS
    assert sorted(map(int, resumed[0]["losses"])) == list(range(1, STEPS + 1))  # the log history came back too
    assert resumed[0]["losses"] == full[0]["losses"]  # bit for bit, dropout included
    assert resumed[0]["weights"] == full[0]["weights"]
    assert runs["kept"] == [8, 12]  # save_total_limit=2 is the root's retention
    assert runs["output_dir"] == []  # nothing written to output_dir's checkpoint-N folders


def test_resume_reads_no_batch_before_the_saved_step(runs: dict[str, Any]) -> None:
    full, resumed = runs["full"], runs["resumed"]
    for rank in (0, 1):
        assert resumed[rank]["batches"] == full[rank]["batches"][SAVED:], rank  # the exact next batch on each rank
        assert resumed[rank]["fetched"] == (STEPS - SAVED) * 2, rank  # the dataset produced no skipped sample


def test_sigterm_to_one_rank_saves_one_step_on_every_rank_then_resume_equals_the_uninterrupted_run(
        runs: dict[str, Any]) -> None:
    """preemption=Preemption(): SIGTERM to rank 1's process only, after step 10. The ranks agree one
    step later (the vote overlaps a step), both save step 11 and exit 143 (torchrun: 1)."""
    preempted = runs["preempted"]
    assert preempted.returncode == 1, preempted.stderr[-3000:]  # torchrun turns the ranks' 143 into 1
    assert re.search(r"exitcode\s*:\s*143", preempted.stderr), preempted.stderr[-3000:]
    assert preempted.stderr.count(f"preemption requested (signal SIGTERM): saving step {KILL_AT + 1}") == 1
    assert preempted.stderr.count(f"preemption requested (another rank's signal): saving step {KILL_AT + 1}") == 1
    assert not runs["preempted_out"]  # train() did not return to the script
    assert runs["preempted_kept"] == [SAVED, KILL_AT + 1]  # the periodic save, then the preemption's
    full, resumed = runs["full"], runs["preempted_resumed"]
    assert [r["restored"] for r in resumed] == [KILL_AT + 1] * 2
    assert resumed[0]["losses"] == full[0]["losses"]  # bit for bit, dropout included
    assert resumed[0]["weights"] == full[0]["weights"]
    for rank in (0, 1):
        assert resumed[rank]["batches"] == full[rank]["batches"][KILL_AT + 1:], rank
