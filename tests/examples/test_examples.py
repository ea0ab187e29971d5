"""Every example runs end to end, as a user runs it (a subprocess), in its reduced size, against a
local S3 server reached only through the environment that ``python -m streamio.testing s3`` prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamio.testing import S3Endpoint

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

pytestmark = pytest.mark.slow


def run(args: list[str], s3: S3Endpoint, timeout: float = 240) -> str:
    """Run an example with the local server's environment; its output, or a failure showing it.
    One torch thread per process: the examples run beside their DataLoader workers on 2 cores."""
    out = subprocess.run(
        args, env={**os.environ, **s3.env(), "OMP_NUM_THREADS": "1"}, cwd=EXAMPLES.parent,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )
    assert out.returncode == 0, f"{args} exited {out.returncode}:\n{out.stdout[-6000:]}"
    return out.stdout


def test_image_classification_is_killed_and_resumes(s3: S3Endpoint) -> None:
    out = run([sys.executable, str(EXAMPLES / "image_classification.py"), "--small", "--url", s3.url("ic")], s3)
    assert "5 shards, 320 samples" in out  # what `streamio shard` reported
    saved = [int(s) for s in re.findall(r"\[run 1\] checkpoint at step (\d+)", out)]
    assert "killed with SIGKILL" in out and len(saved) == 2
    resumed = int(re.search(r"the killed run resumed at step (\d+)", out).group(1))  # type: ignore[union-attr]
    assert resumed in saved
    run2 = out[out.index("-- run 2"):]
    assert f"resumed at step {resumed}" in run2 and re.search(r"finished at step \d+", run2)
    # the steps trained twice (after the checkpoint, before the kill) see the same batches, same loss
    before = dict(re.findall(r"\[run 1\] step (\d+) loss (\S+)", out))
    after = dict(re.findall(r"^step (\d+) loss (\S+)", run2, re.MULTILINE))
    again = sorted(set(before) & set(after), key=int)
    assert len(again) == max(map(int, before)) - resumed  # every step run 1 took after the checkpoint
    assert [before[s] for s in again] == [after[s] for s in again]


def test_ddp_under_torchrun_checkpoints_and_resumes(s3: S3Endpoint) -> None:
    script = [str(EXAMPLES / "ddp_torchrun.py"), "--url", s3.url("ddp"), "--samples", "512", "--ckpt-every", "2"]
    first = run([*TORCHRUN, *script, "--steps", "4"], s3)
    assert "no checkpoint under" in first and "finished at step 4; checkpoints: [2, 4]" in first
    second = run([*TORCHRUN, *script, "--steps", "6"], s3)
    assert "resumed at step 4 (epoch 0), world size 2" in second
    assert "finished at step 6; checkpoints: [4, 6]" in second


def test_checkpoint_only_resume_gives_the_same_weights(s3: S3Endpoint) -> None:
    script = [sys.executable, str(EXAMPLES / "checkpoint_only.py"), "--url", s3.url("plain")]
    first = run([*script, "--epochs", "2"], s3)
    assert "no checkpoint under" in first and "kept checkpoints [20, 40]" in first
    again = run([*script, "--epochs", "2", "--restore-step", "20"], s3)  # back to the end of epoch 0
    assert "resumed at epoch 1 (step 20)" in again
    weights = [re.search(r"epoch 1: .* weights (\w+)", out).group(1) for out in (first, again)]  # type: ignore[union-attr]
    assert weights[0] == weights[1]  # epoch 1 trained again from its checkpoint: the same bits


def test_llm_token_stream_draws_the_mixture(s3: S3Endpoint) -> None:
    """One run (resume is what the other examples check; a mixture's resume: tests/data)."""
    out = run([sys.executable, str(EXAMPLES / "llm_tokens.py"), "--small", "--url", s3.url("llm"),
               "--ckpt-every", "3", "--steps", "6"], s3)
    assert re.search(r"wrote web: \d+ blocks of 65 tokens", out) and re.search(r"wrote code: \d+ blocks", out)
    assert "step 3 epoch 0" in out and "step 6 epoch 0" in out and "finished at step 6" in out
    web, code = map(int, re.search(r"blocks drawn: web (\d+)%, code (\d+)%", out).groups())  # type: ignore[union-attr]
    assert web + code in (99, 100, 101) and 60 <= web <= 90  # the 75/25 mixture, over 6 batches of 16


def test_prepare_in_processes_retries_a_partition_and_commits_once(s3: S3Endpoint) -> None:
    out = run([sys.executable, str(EXAMPLES / "prepare_in_processes.py"), "--url", s3.url("prepared")], s3)
    assert "partition 2: worker lost (first attempt): running partition 2 again" in out
    assert "committed s3://" in out and "18 shards, 1500 samples" in out
    verified = run([sys.executable, "-m", "streamio.cli.main", "verify", s3.url("prepared")], s3)
    assert "all 18 shards OK" in verified


def test_lightning_checkpoints_resume_from_last_on_s3(s3: S3Endpoint) -> None:
    pytest.importorskip("lightning")
    script = [sys.executable, str(EXAMPLES / "lightning_checkpoints.py"), "--url", s3.url("lightning")]
    assert "started from scratch" in run([*script, "--steps", "8"], s3)
    out = run([*script, "--steps", "12"], s3)
    assert f"resumed from {s3.url('lightning')}/last.ckpt/" in out and "stopped at global step 12" in out


def test_accelerate_training_resumes_at_the_saved_step(s3: S3Endpoint) -> None:
    pytest.importorskip("accelerate")
    script = [sys.executable, str(EXAMPLES / "accelerate_training.py"), "--url", s3.url("accelerate")]
    first = run([*script, "--steps", "4", "--ckpt-every", "2"], s3)
    assert "nothing to resume under" in first and "finished at step 4; checkpoints: [2, 4]" in first
    second = run([*script, "--steps", "6", "--ckpt-every", "2"], s3)
    assert "resumed at step 4, 1 process(es)" in second and "finished at step 6; checkpoints: [4, 6]" in second


def test_transformers_trainer_resumes_from_its_root_on_s3(s3: S3Endpoint) -> None:
    pytest.importorskip("transformers")
    script = [sys.executable, str(EXAMPLES / "transformers_trainer.py"), "--url", s3.url("hf")]
    first = run([*script, "--steps", "8"], s3)
    assert "started from scratch" in first and "stopped at global step 8" in first
    second = run([*script, "--steps", "12"], s3)
    assert "resumed at step 8, nothing replayed" in second and "stopped at global step 12" in second
    assert f"checkpoints in {s3.url('hf')}/ckpt: steps [8, 12]" in second
