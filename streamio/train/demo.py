"""``make demo`` (``python -m streamio.train.demo``): crash a DDP job and prove the resume is exact.

``--fsdp`` runs the same demo with the model and optimizer sharded over the ranks by FSDP2 and
checkpointed shard by shard (:mod:`streamio.train.distributed`); the resume is exact in the same way.

What it does, in order:

1. Starts a local S3 server (moto, 127.0.0.1, from :mod:`streamio.testing`), unless ``--url``
   names a real bucket prefix (credentials then come the usual way: environment, profile, ...).
2. Generates the bundled synthetic dataset (:mod:`streamio.train.data`) and shards it into
   ``URL/data/{train,val}`` with ``streamio.data.write.writer.write_dataset``.
3. Trains ``--nproc`` ranks (2 CPU ranks with gloo, or one per GPU with NCCL) three times with
   ``python -m torch.distributed.run``: a *reference* run without interruption; the same run
   crashed by ``--fail-at-step`` (``os._exit``, no cleanup: the checkpoint in flight is lost); and
   a restart of that run, which finds ``latest.json`` and resumes.
4. Prints a summary comparing the crashed+resumed run with the reference, step by step and
   weight by weight. On CPU they are identical bit for bit; the command exits 1 if they are not.
   (On GPUs, kernels are not bitwise deterministic; the summary then reports the largest
   difference instead.)

Under ~3 minutes on a 2-core machine, most of it spent importing torch in 9 processes.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from streamio.train.data import iter_samples
from streamio.train.loop import FAIL_EXIT_CODE
from streamio.train.telemetry import read_metrics

log = logging.getLogger("streamio.train.demo")

TRAIN_ARGS = [
    "--batch-size", "32", "--grad-accum", "2",
    "--epochs", "3", "--ckpt-every", "10", "--log-every", "16", "--num-workers", "2", "--keep-last", "2",
    "--collective-timeout-s", "120",
]


@dataclass
class Location:
    """Where the demo writes (``url``) and how child processes reach it (``env``)."""

    url: str
    env: dict[str, str]
    storage_options: dict[str, Any] | None


@contextlib.contextmanager
def _location(url: str | None) -> Iterator[Location]:
    if url is not None:
        yield Location(url.rstrip("/"), dict(os.environ), None)
        return
    from streamio.testing import local_s3

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with local_s3() as s3:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        log.info("local S3 (moto) at %s, bucket %s", s3.endpoint_url, s3.bucket)
        yield Location(s3.url("demo"), {**env, **s3.env()}, s3.storage_options())


def shard_demo_data(loc: Location, *, seed: int = 0, train: int = 4096, val: int = 1001, per_shard: int = 512) -> str:
    """Write the synthetic train/val sets as shards + index under ``loc.url/data``; return that URL."""
    from streamio.data.write.writer import ShardSpec, write_dataset

    for split, n in (("train", train), ("val", val)):
        index = write_dataset(
            iter_samples(n, seed=seed, split=split), f"{loc.url}/data/{split}", loc.storage_options,
            spec=ShardSpec(max_count=per_shard, prefix=split), overwrite=True,
        )
        log.info("sharded %d %s samples into %d shards at %s/data/%s", n, split, len(index.shards), loc.url, split)
    return f"{loc.url}/data"


def _torchrun(nproc: int, args: list[str], env: dict[str, str], *, stderr_to: Path | None = None) -> int:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
           "-m", "streamio.train", *args]
    sys.stdout.flush()
    if stderr_to is None:
        return subprocess.run(cmd, env=env, check=False).returncode
    stderr_to.parent.mkdir(parents=True, exist_ok=True)
    with stderr_to.open("w") as err:  # torchrun's report of the intended crash: long, and expected
        return subprocess.run(cmd, env=env, stderr=err, check=False).returncode


def _losses(out: Path, nproc: int) -> dict[tuple[int, int], float]:
    return {
        (r["step"], rank): r["loss"]
        for rank in range(nproc)
        for r in read_metrics(out / f"rank-{rank:05d}.jsonl")
        if r["event"] == "step"
    }


def compare(
    ref_dir: Path, crashed_dir: Path, resumed_dir: Path, nproc: int, *, mode: str = "DDP"
) -> tuple[bool, list[str]]:
    """Compare the runs; return (identical, summary lines). ``mode`` names the parallelism in the title."""
    ref = _losses(ref_dir, nproc)
    before, after = _losses(crashed_dir, nproc), _losses(resumed_dir, nproc)
    combined = {**before, **after}
    resume = [r for r in read_metrics(resumed_dir / "rank-00000.jsonl") if r["event"] == "resume"]
    resumed_from = resume[-1]["step"] if resume else None
    loss_diff = max((abs(combined[k] - ref[k]) for k in ref if k in combined), default=float("inf"))
    missing = sorted({s for s, _ in ref} - {s for s, _ in combined})
    ref_w = torch.load(ref_dir / "final_model.pt", weights_only=True)
    got_w = torch.load(resumed_dir / "final_model.pt", weights_only=True)
    weights_equal = ref_w.keys() == got_w.keys() and all(torch.equal(ref_w[k], got_w[k]) for k in ref_w)
    weight_diff = max(float((ref_w[k].float() - got_w[k].float()).abs().max()) for k in ref_w)
    steps = sorted({s for s, _ in ref})
    vals = [r for r in read_metrics(ref_dir / "rank-00000.jsonl") if r["event"] == "val"]
    identical = not missing and loss_diff == 0.0 and weights_equal
    lines = [
        "=" * 72,
        f"streamio demo ({mode}): crash + resume vs uninterrupted",
        f"  ranks: {nproc}; optimizer steps: {len(steps)}; crashed after step {max(s for s, _ in before)}; "
        f"resumed from latest.json at step {resumed_from}",
        f"  loss (rank 0): step 1 {ref[(steps[0], 0)]:.4f} -> step {steps[-1]} {ref[(steps[-1], 0)]:.4f}; "
        + "validation: "
        + ", ".join(f"epoch {v['epoch']} {v['val_loss']:.4f} ({100 * v['val_accuracy']:.1f}%)" for v in vals),
        f"  per-step losses, every rank: {len(ref)} compared, max |difference| {loss_diff:.3g}"
        + (f", MISSING steps {missing}" if missing else ""),
        f"  final weights: {'bit-identical (torch.equal)' if weights_equal else f'max |difference| {weight_diff:.3g}'}",
        f"  RESULT: {'IDENTICAL - the resumed run matches the uninterrupted one' if identical else 'DIFFERENT'}",
        "=" * 72,
    ]
    return identical, lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 when the resumed run matches the uninterrupted one."""
    parser = argparse.ArgumentParser(prog="python -m streamio.train.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", help="bucket prefix to use instead of a local S3 (s3://bucket/prefix, gs://..., a path)"
    )
    parser.add_argument("--workdir", default="demo-out", help="local directory for logs and final weights")
    parser.add_argument("--nproc", type=int, default=0, help="ranks (default: all GPUs, else 2 CPU ranks)")
    parser.add_argument(
        "--fail-at-step", type=int, default=45, help="optimizer step after which the second run crashes"
    )
    parser.add_argument("--fsdp", action="store_true", help="shard model and optimizer with FSDP2 instead of DDP")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    logging.getLogger("streamio").setLevel(logging.INFO)
    gpus = torch.cuda.device_count()
    nproc = args.nproc or gpus or 2
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    started = time.perf_counter()
    with _location(args.url) as loc:
        run_id = f"run-{int(time.time())}"
        data_url = shard_demo_data(loc)
        env = {**loc.env, "OMP_NUM_THREADS": loc.env.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
        common = [*TRAIN_ARGS, *(["--fsdp"] if args.fsdp else []), "--data-url", data_url]
        runs = {
            "reference": [*common, "--ckpt-url", f"{loc.url}/{run_id}/ckpt-reference"],
            "crashed": [*common, "--ckpt-url", f"{loc.url}/{run_id}/ckpt", "--fail-at-step", str(args.fail_at_step)],
            "resumed": [*common, "--ckpt-url", f"{loc.url}/{run_id}/ckpt"],
        }
        for name, train_args in runs.items():
            log.info("--- %s run: torchrun --nproc-per-node %d -m streamio.train %s", name, nproc, " ".join(train_args))
            stderr_to = work / name / "torchrun-stderr.log" if name == "crashed" else None
            code = _torchrun(nproc, [*train_args, "--out-dir", str(work / name)], env, stderr_to=stderr_to)
            expected = "non-zero (crash)" if name == "crashed" else 0
            if (code == 0) != (name != "crashed"):
                log.error("the %s run exited with %d, expected %s: see its output above", name, code, expected)
                return 1
            if name == "crashed":
                log.info(
                    "--- the crashed run exited with %d (each rank: os._exit(%d)) as intended; "
                    "torchrun's report is in %s",
                    code, FAIL_EXIT_CODE, stderr_to,
                )
    mode = "FSDP2" if args.fsdp else "DDP"
    identical, lines = compare(work / "reference", work / "crashed", work / "resumed", nproc, mode=mode)
    for line in lines:
        log.info("%s", line)
    log.info("demo took %.0f s; logs and weights in %s/", time.perf_counter() - started, work)
    return 0 if identical or gpus else 1


if __name__ == "__main__":
    sys.exit(main())
