"""What ``Preemption.requested(step)`` costs per step in the reference trainer (issue 37).

Run: ``.venv/bin/python -m benchmarks.bench_preemption [--world 2] [--steps 60] [--every 10] [--json out.json]``.

Each of ``--world`` gloo ranks (``torch.multiprocessing``) builds the reference trainer with the
demo's settings (``streamio.train.demo``: batch 32, 2 micro-batches, the default MLP; in-memory
data, no checkpoints) and times, in alternating blocks of 10 optimizer steps: the step alone, the
step followed by ``requested(step)`` with ``check_every=1``, and with ``check_every=--every``;
and the time spent inside ``requested()`` per step (what the loop waits for; the difference of
whole steps is within the noise of a loaded machine).
It also times ``requested()`` alone, back to back (the bare all-reduce of one int32). Rank 0
prints ms per step and the overhead in % of the step alone (medians over blocks), or writes them
to ``--json`` (what ``benchmarks/run.py``'s ``preemption`` section reads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch.multiprocessing as mp

from benchmarks.common import free_port


def _rank(rank: int, world: int, port: int, cfg: dict[str, Any]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from streamio.preemption import Preemption
    from streamio.train.config import TrainConfig
    from streamio.train.distributed import setup_distributed, teardown_distributed
    from streamio.train.loop import Trainer
    from streamio.train.telemetry import Meter

    train = TrainConfig(batch_size=32, grad_accum=2, num_workers=0, epochs=1000,
                        train_samples=(3 * cfg["steps"] + 10) * 32 * 2 * world,
                        out_dir=cfg["out"], device="cpu")
    d = setup_distributed(train)
    trainer = Trainer(train, d)
    batches = iter(trainer.data.train)
    stops = {1: Preemption(check_every=1), cfg["every"]: Preemption(check_every=cfg["every"])}
    times: dict[str, list[float]] = {"alone": [], "every 1": [], f"every {cfg['every']}": []}
    inside: dict[str, float] = dict.fromkeys(times, 0.0)  # seconds spent in requested(), the loop's direct cost
    step = 0
    for _ in range(3):  # warm-up
        trainer.train_step(batches, Meter())
    for stop in stops.values():  # the first due step makes the vote's group (collective, once)
        stop.requested(0)
    for _ in range(cfg["steps"] // 10):
        for name, stop in (("alone", None), ("every 1", stops[1]), (f"every {cfg['every']}", stops[cfg["every"]])):
            start = time.perf_counter()
            for _ in range(10):
                trainer.train_step(batches, Meter())
                step += 1
                if stop is not None:
                    t0 = time.perf_counter()
                    stop.requested(step)
                    inside[name] += time.perf_counter() - t0
            times[name].append((time.perf_counter() - start) / 10)
    start = time.perf_counter()
    for i in range(cfg["calls"]):
        stops[1].requested(i)
    bare = (time.perf_counter() - start) / cfg["calls"]
    if rank == 0 and cfg["json"]:
        alone = statistics.median(times["alone"])
        inside_ms = {name: 1000 * inside[name] / (10 * len(times[name])) for name in list(times)[1:]}
        result = {
            "world": world, "steps": cfg["steps"], "every": cfg["every"], "calls": cfg["calls"],
            "step_ms": {name: [1000 * t for t in runs] for name, runs in times.items()},
            "inside_ms": inside_ms, "bare_ms": 1000 * bare,
            "ratios": {**{f"inside requested() / step, check {name}": v / (1000 * alone)
                          for name, v in inside_ms.items()},
                       "requested() back to back / step": bare / alone},
        }
        with open(cfg["json"], "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    elif rank == 0:
        alone = statistics.median(times["alone"])
        print(f"world {world}: step alone {1000 * alone:.2f} ms (median of {len(times['alone'])} blocks of 10)")
        for name in list(times)[1:]:
            t = statistics.median(times[name])
            per_step = inside[name] / (10 * len(times[name]))
            print(f"  step + requested(), check {name}: {1000 * t:.2f} ms, overhead {1000 * (t - alone):+.3f} ms "
                  f"({100 * (t - alone) / alone:+.2f} %); inside requested() {1000 * per_step:.3f} ms per step "
                  f"({100 * per_step / alone:.2f} %)")
        print(f"  requested() alone, back to back: {1000 * bare:.3f} ms per call "
              f"({100 * bare / alone:.2f} % of a step)")
    for stop in stops.values():
        stop.close()
    trainer.metrics.close()
    teardown_distributed(d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--json", default=None, help="write the results here (else print them)")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        cfg = {"steps": args.steps, "every": args.every, "calls": args.calls, "out": out, "json": args.json}
        mp.spawn(_rank, args=(args.world, free_port(), cfg), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
