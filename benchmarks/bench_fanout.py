"""Restore fan-out (issue 26): store bytes and restore time at W = 1, 2, 4 ranks, with and without.

One DDP-style checkpoint (replicated MLP parameters, ``--size-mb``) saved by 2 ranks into moto
behind a FaultProxy with a 30 ms first-byte latency; then restored by W gloo rank processes
(torchrun), once with ``SaveOptions(restore_fanout=True)`` (the default: each part read once per
job and broadcast) and once with ``restore_fanout=False`` (what streamio did before: every rank
reads every part). Reported per case: bytes the store served (the proxy's GET log) as a multiple
of the checkpoint's size, and the restore's wall time (the slowest rank, after a barrier).

Run:  .venv/bin/python -m benchmarks.bench_fanout --size-mb 64 [--json OUT]
All ranks share this machine's cores with moto, so times are an upper bound of a real cluster's;
the byte counts are exact.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, S3Servers, emit_json, machine, machine_line, summary

WORLDS = (1, 2, 4)


def torchrun_ranks(
    world: int, mode: str, root: str, size_mb: int, options: dict[str, Any], out: Path,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``benchmarks.fanout_rank MODE`` on ``world`` gloo ranks; every rank's result."""
    out.mkdir(parents=True, exist_ok=True)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    child_env.update(BENCH_STORAGE_OPTIONS=json.dumps(options), OMP_NUM_THREADS="1", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
         "-m", "benchmarks.fanout_rank", mode, root, str(size_mb), str(out)],
        env=child_env, capture_output=True, text=True, timeout=900, cwd=REPO,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} on {world} ranks failed: {proc.stderr[-2000:]}")
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]
    if not all(r["ok"] for r in results):
        raise RuntimeError(f"{mode} on {world} ranks restored wrong values")
    return results


def _torchrun(world: int, mode: str, root: str, size_mb: int, options: dict[str, Any], out: Path) -> list[float]:
    return [r["seconds"] for r in torchrun_ranks(world, mode, root, size_mb, options, out)]


def run(size_mb: int, reps: int, log: Any = print) -> dict[str, Any]:
    with S3Servers(proxies=1, latency=0.03) as servers, tempfile.TemporaryDirectory() as scratch:
        options = servers.s3.storage_options(servers.proxies[0])
        root = servers.s3.url("fanout")
        _torchrun(2, "save", root, size_mb, options, Path(scratch, "save"))
        servers.clear()
        _torchrun(1, "restore", root, size_mb, options, Path(scratch, "probe"))
        size = servers.log_summary()[0]["bytes"]  # one restore on one rank reads the checkpoint once
        cases: dict[str, Any] = {}
        for world in WORLDS:
            for fanout in ((True, False) if world > 1 else (True,)):
                name = f"W={world} {'fan-out' if fanout else 'per rank'}"
                seconds, served = [], []
                for rep in range(reps):
                    servers.clear()
                    mode = "restore" if fanout else "restore-nofanout"
                    times = _torchrun(world, mode, root, size_mb, options, Path(scratch, f"{world}-{fanout}-{rep}"))
                    seconds.append(max(times))
                    served.append(servers.log_summary()[0]["bytes"])
                cases[name] = {"world": world, "fanout": fanout, "restore_s": summary(seconds),
                               "store_bytes": max(served), "store_x": max(served) / size}
                log(f"{name:>16}: restore {summary(seconds)['median']:.2f} s, store served "
                    f"{max(served) / size:.2f}x the checkpoint")
    ratios = {f"W={w}": cases[f"W={w} fan-out"]["restore_s"]["median"] / cases[f"W={w} per rank"]["restore_s"]["median"]
              for w in WORLDS if w > 1}
    return {"machine": machine(), "size_mb": size_mb, "checkpoint_bytes": size, "cases": cases,
            "time_fanout_over_per_rank": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the results here as JSON")
    args = ap.parse_args()
    result = run(args.size_mb, args.reps)
    print(machine_line(result["machine"]))
    print("restore time, fan-out / per rank:", {k: round(v, 2) for k, v in result["time_fanout_over_per_rank"].items()})
    if args.json:
        emit_json(result, args.json)


if __name__ == "__main__":
    main()
