#!/usr/bin/env bash
# GPU check of the reference trainer (issue 8). Run on a machine with CUDA GPUs, from the repo root:
#
#   scripts/gpu_check.sh            # all GPUs, 300 steps
#   STEPS=600 scripts/gpu_check.sh
#   GPU_CHECK_DEVICE=cpu NPROC=2 STEPS=40 scripts/gpu_check.sh   # dry run of this script on CPU
#
# What it checks, against a local S3 (moto on 127.0.0.1):
#   1. CUDA RNG restore: streamio.checkpoint.rng.RNGState captures every device's generator; draws and
#      dropout masks after a restore are identical on every GPU.
#   2. The trainer with NCCL + bf16 autocast + pinned memory, one rank per GPU, streaming the
#      synthetic demo data (sharded into the local S3) with StreamingDataset, for $STEPS optimizer
#      steps with async checkpoints every $CKPT_EVERY steps; crashed by --fail-at-step at half way;
#      restarted; it must resume from latest.json and finish.
#   3. An uninterrupted reference run of the same job: per-step losses and final weights compared
#      (GPU kernels are not bitwise deterministic, so the largest difference is reported; on CPU
#      it must be 0).
#   4. Lightning's ModelParallelStrategy through streamio.lightning (FSDP2 fully_shard, $NPROC ranks,
#      NCCL on CUDA): sharded checkpoints every 3 steps to the local S3, a kill -9 after step 5,
#      fit(ckpt_path="last"), compared with an uninterrupted run (tests/support/lightning_sharded.py;
#      on CPU it must be identical). Skipped with a message where Lightning is not installed.
# Prints samples/s, data-stall fraction and checkpoint blocked ms of each run, and exits non-zero if
# a check fails. Takes about 2-4 minutes (mostly process start-up); needs no network.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
export GPU_CHECK_DEVICE="${GPU_CHECK_DEVICE:-cuda}"
export STEPS="${STEPS:-300}" CKPT_EVERY="${CKPT_EVERY:-50}" NPROC="${NPROC:-0}"
export OUT="${OUT:-demo-out/gpu-check}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" PYTHONUNBUFFERED=1
rm -rf "$OUT"  # metrics files are appended to (a resumed run continues its log): start clean
timeout 900 "$PY" - <<'PYEOF'
import json, os, subprocess, sys, time
from pathlib import Path

import torch

from streamio.checkpoint.rng import RNGState
from streamio.testing import local_s3
from streamio.train.demo import Location, compare, shard_demo_data
from streamio.train.telemetry import read_metrics

device = os.environ["GPU_CHECK_DEVICE"]
steps, every = int(os.environ["STEPS"]), int(os.environ["CKPT_EVERY"])
out = Path(os.environ["OUT"])
failures = []

print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, devices: {torch.cuda.device_count()}")
if device == "cuda":
    assert torch.cuda.is_available(), "no CUDA device: run with GPU_CHECK_DEVICE=cpu for a dry run"
    for i in range(torch.cuda.device_count()):
        print(f"  cuda:{i} {torch.cuda.get_device_name(i)}, bf16 supported: {torch.cuda.is_bf16_supported()}")
    nproc = int(os.environ["NPROC"]) or torch.cuda.device_count()
    # 1. CUDA RNG restore on every device
    for i in range(torch.cuda.device_count()):
        torch.rand(1, device=f"cuda:{i}")  # initialise each device's generator
    rng = RNGState(seed=1, rank=0, world_size=1)
    state = rng.state_dict()
    assert len(state["cuda"]) == torch.cuda.device_count(), "RNGState did not capture every CUDA device"
    def draws():
        return [(torch.rand(8, device=f"cuda:{i}").cpu(),
                 torch.nn.functional.dropout(torch.ones(64, device=f"cuda:{i}"), 0.5).cpu())
                for i in range(torch.cuda.device_count())]
    first = draws()
    rng.load_state_dict(state)
    again = draws()
    ok = all(torch.equal(a, b) for pa, pb in zip(first, again) for a, b in zip(pa, pb))
    print(f"1. CUDA RNG restore on {torch.cuda.device_count()} device(s): {'OK' if ok else 'FAILED'}")
    if not ok:
        failures.append("CUDA RNG restore")
else:
    nproc = int(os.environ["NPROC"]) or 2
    print("1. CUDA RNG restore: skipped (CPU dry run)")

big = device == "cuda"
common = ["--device", device, "--batch-size", "256" if big else "16", "--grad-accum", "2",
          "--hidden", "1024" if big else "64", "--epochs", "100", "--max-steps", str(steps), "--ckpt-every", str(every),
          "--log-every", "50", "--num-workers", "4" if big else "2", "--collective-timeout-s", "120", "--patience", "0"]

def torchrun(args, env, log):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "streamio.train", *args]
    log.parent.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    return code, time.perf_counter() - t

def report(name, run_dir):
    summary = [r for r in read_metrics(run_dir / "rank-00000.jsonl") if r["event"] == "summary"][-1]
    print(f"   {name}: {summary['steps']} steps, {summary['samples_per_s']:,.0f} samples/s, "
          f"data stall {100 * summary['data_stall_fraction']:.1f}%, ckpt blocked total "
          f"{summary['ckpt_blocked_ms_total']:.0f} ms / max {summary['ckpt_blocked_ms_max']:.0f} ms "
          f"over {summary['checkpoints']} saves, resumed from {summary['resumed_from']}")

with local_s3() as s3:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | s3.env()
    url = s3.url("gpu-check")
    train = 65536 if big else 2048
    data_url = shard_demo_data(Location(url, env, s3.storage_options()), train=train, val=4097 if big else 129,
                               per_shard=4096 if big else 256)
    common += ["--data-url", data_url]
    runs = {
        "reference": ([*common, "--ckpt-url", f"{url}/ckpt-ref"], 0),
        "crashed": ([*common, "--ckpt-url", f"{url}/ckpt", "--fail-at-step", str(steps // 2 + every // 2)], None),
        "resumed": ([*common, "--ckpt-url", f"{url}/ckpt"], 0),
    }
    print(f"2. trainer: {nproc} rank(s), {device}, {steps} steps, checkpoints every {every} to local S3")
    for name, (args, expect) in runs.items():
        code, wall = torchrun([*args, "--out-dir", str(out / name)], env, out / f"{name}.log")
        print(f"   {name} run: exit {code} in {wall:.0f} s (log: {out / name}.log)")
        if (expect == 0) != (code == 0):
            failures.append(f"{name} run exit {code}")
    for name in ("reference", "resumed"):
        try:
            report(name, out / name)
        except (IndexError, FileNotFoundError) as exc:
            failures.append(f"{name} summary missing: {exc}")

    try:
        import lightning  # noqa: F401
    except ImportError:
        print("4. Lightning ModelParallelStrategy: skipped (pip install 'streamio-torch[lightning]')")
    else:
        script = Path("tests/support/lightning_sharded.py").resolve()
        lenv = env | {"LIGHTNING_ACCELERATOR": "gpu" if device == "cuda" else "cpu"}
        results = {}
        for name, kill, resume in (("reference", 0, "0"), ("killed", 5, "0"), ("resumed", 0, "1")):
            dest = out / f"lightning-{name}.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   str(script), f"{url}/lightning-{'ref' if name == 'reference' else 'ckpt'}", str(dest), "8",
                   str(kill), resume]
            with (out / f"lightning-{name}.log").open("w") as f:
                code = subprocess.run(cmd, env=lenv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                      timeout=600).returncode
            if (code == 0) != (kill == 0):
                failures.append(f"lightning {name} run exit {code} (log: {out}/lightning-{name}.log)")
            elif dest.exists():
                results[name] = json.loads(dest.read_text())
        if {"reference", "resumed"} <= results.keys():
            ref, res = results["reference"], results["resumed"]
            diff = max(abs(float.fromhex(a) - float.fromhex(b)) for k in ref["weights"]
                       for a, b in zip(ref["weights"][k], res["weights"][k]))
            print(f"4. Lightning ModelParallelStrategy, {nproc} rank(s), {device}: resumed at step "
                  f"{min(map(int, res['losses']))}, largest weight difference {diff:.3g}")
            if device == "cpu" and (ref["weights"] != res["weights"] or min(map(int, res["losses"])) != 3):
                failures.append("Lightning sharded resume not bit-identical on CPU")

if not failures:
    identical, lines = compare(out / "reference", out / "crashed", out / "resumed", nproc)
    print("3. " + "\n   ".join(lines[1:-1]))
    if device == "cpu" and not identical:
        failures.append("CPU resume not bit-identical")
print("GPU CHECK", "FAILED: " + "; ".join(failures) if failures else "PASSED")
sys.exit(1 if failures else 0)
PYEOF
