"""Planner benchmark: cost of planning one rank's epoch, of an elastic resume, and shuffle quality.

Run: ``.venv/bin/python benchmarks/bench_plan.py`` (``--quick`` for fewer repeats).

1. Planning: 5,000 shards x 10,000 samples (50 M samples), world 512, 8 workers, batch 32: time
   and peak Python memory (tracemalloc) of ``plan_epoch`` + every worker stream's runs of one rank,
   without and with a 4,096-sample shuffle window (its first window's permutation included, the
   start-up cost a reader pays). The same with 100x the samples per shard (memory must not move:
   it is O(shards)) and 10x the shards (it moves with shards).
2. Elastic resume: a state taken mid-window at 512 x 8 resumed at 384 x 6 (re-plans the rest).
3. Shuffle quality of one worker's stream for window sizes: fraction of adjacent yielded samples
   from the same shard, and mean / max displacement from the sequential position.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamio.data.plan import EpochPlan, Sampling, Shuffle, Topology, plan_epoch  # noqa: E402


def _one_rank(counts: np.ndarray, window: int, rank: int = 137, world: int = 512, workers: int = 8) -> int:
    sampling = Sampling(Shuffle(window=window))
    plan = plan_epoch(counts, seed=17, epoch=4, topology=Topology(world, workers, 32), sampling=sampling)
    runs = 0
    for s in plan.streams(rank):
        runs += len(s.runs)
        if window > 1:
            next(s.windows(), None)  # a reader's start-up: first window's runs + permutation
    return runs


def _measure(fn: Callable[[], Any], repeat: int) -> tuple[float, float, float, Any]:
    """Median wall ms, median CPU ms (robust on a shared machine), peak traced MiB, result."""
    fn()  # warm up (first touch of fresh memory is slow on these VMs)
    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times) * 1e3, statistics.median(cpu) * 1e3, peak / 2**20, out


def bench_planning(repeat: int) -> list[dict[str, Any]]:
    rows = []
    for shards, per_shard in ((5_000, 10_000), (5_000, 1_000_000), (50_000, 10_000)):
        counts = np.full(shards, per_shard, dtype=np.int64)
        for window in (0, 4096):
            ms, cpu, mib, runs = _measure(partial(_one_rank, counts, window), repeat)
            rows.append({"shards": shards, "samples": shards * per_shard, "window": window, "ms": round(ms, 2),
                         "cpu_ms": round(cpu, 2), "peak_MiB": round(mib, 2), "runs_rank": runs})
    return rows


def bench_resume(repeat: int) -> dict[str, Any]:
    counts = np.full(5_000, 10_000, dtype=np.int64)
    kw: dict[str, Any] = {"seed": 17, "epoch": 4, "sampling": Sampling(Shuffle(window=4096))}
    plan = plan_epoch(counts, topology=Topology(512, 8, 32), **kw)
    state = plan.state_dict(1000)  # 32,000 samples per rank: mid-window on most workers
    state = json.loads(json.dumps(state))

    def resume() -> int:
        p = plan_epoch(counts, topology=Topology(384, 6, 32), resume=state, **kw)
        return sum(len(s.runs) for s in p.streams(5))

    ms, cpu, mib, runs = _measure(resume, max(1, repeat // 3))
    p = plan_epoch(counts, topology=Topology(384, 6, 32), resume=state, **kw)
    wins = [w for s in p.streams(5) for w in s.windows()]
    reads = sum(len(w.spans) for w in wins)
    read = sum(sp.end - sp.first for w in wins for sp in w.spans)
    return {
        "from": "512x8 (1000 batches of 32 in)", "to": "384x6", "state_bytes": len(json.dumps(state)),
        "ms": round(ms, 1), "cpu_ms": round(cpu, 1), "peak_MiB": round(mib, 1), "runs_rank": runs, "reads_rank": reads,
        "read_amplification": round(read / p.samples_per_rank, 3),
        "samples_per_rank": p.samples_per_rank,
    }


def _quality(plan: EpochPlan, window: int) -> dict[str, Any]:
    stream = plan.stream(3, 1)
    pairs = list(stream)
    shards = np.array([s for s, _ in pairs])
    # sequential position of each yielded sample = its index in the stream's storage order
    seq = {p: i for i, p in enumerate((run.shard, i) for run in stream.runs for i in range(run.first, run.end))}
    disp = np.abs(np.array([seq[p] for p in pairs]) - np.arange(len(pairs)))
    return {
        "window": window,
        "samples": len(pairs),
        "same_shard_adjacent": round(float(np.mean(shards[1:] == shards[:-1])), 3),
        "mean_displacement": round(float(disp.mean()), 1),
        "max_displacement": int(disp.max()),
    }


def bench_quality() -> list[dict[str, Any]]:
    counts = np.full(400, 1_000, dtype=np.int64)  # 400k samples, shards of 1,000
    def plan(window: int) -> EpochPlan:
        return plan_epoch(counts, seed=1, epoch=0, topology=Topology(8, 4), sampling=Sampling(Shuffle(window=window)))

    return [_quality(plan(w), w) for w in (0, 256, 1024, 4096, 16384)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every part and print one JSON line per result; returns them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args(argv)
    repeat = 3 if args.quick else 15
    out: dict[str, Any] = {"planning": bench_planning(repeat), "elastic_resume": bench_resume(repeat),
                           "shuffle_quality": bench_quality()}
    for part, rows in out.items():
        for row in rows if isinstance(rows, list) else [rows]:
            print(json.dumps({"bench": f"plan.{part}", **row}))
    return out


if __name__ == "__main__":
    main()
