"""One rank of :mod:`benchmarks.bench_fanout` (run under torchrun, gloo).

    torchrun --nproc_per_node W -m benchmarks.fanout_rank MODE ROOT SIZE_MB OUT_DIR

``BENCH_STORAGE_OPTIONS`` (JSON): the store's options. MODE ``save`` saves step 1 of an MLP of
``SIZE_MB`` replicated float32 parameters; ``restore`` / ``restore-nofanout`` restores it into a
model of other values and writes ``OUT_DIR/rank-N.json``: ``{"seconds", "ok"}``.

MODE ``save-paced`` / ``save-unpaced`` (:mod:`benchmarks.bench_throttle`) saves steps 1 ..
``BENCH_SAVES`` in parts of ``BENCH_PART_KB`` KiB (many small writes), with the job's writes capped at
``BENCH_WRITE_RATE`` per second (``none``: no cap), paced or not (``RetryPolicy(pace_writes=...)``);
rank 0 puts ``between-N`` into the root before step N (a mark in the store's log); the result
has ``"each"``: every save's seconds. ``BENCH_KEY_PREFIXES``: ``SaveOptions.key_prefixes``;
``BENCH_PACER_LOG=FILE``: each rank appends a line per save with what its pacer met (writes
admitted, seconds, throttles), to find the rank a slow save waited for.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from streamio.checkpoint import CheckpointManager, SaveOptions
from streamio.storage import RetryPolicy, write_pacer

WIDTH = 1024


def model(size_mb: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = max(1, round(size_mb * (1 << 20) / 4 / (WIDTH * WIDTH + WIDTH)))
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])


def saves(mgr: CheckpointManager, size_mb: int) -> list[float]:
    """Steps 1 .. BENCH_SAVES saved by every rank at once; the seconds of each (this rank's)."""
    each = []
    for step in range(1, int(os.environ.get("BENCH_SAVES", "1")) + 1):
        dist.barrier()
        if step > 1 and dist.get_rank() == 0:
            mgr.store.put(f"between-{step}", b"")
        state = {"model": model(size_mb, step)}
        dist.barrier()
        t0 = time.perf_counter()
        mgr.save(step, state)
        each.append(time.perf_counter() - t0)
        pacer = write_pacer(mgr.store)
        share = pacer.last_share if pacer is not None else None
        if share is not None and os.environ.get("BENCH_PACER_LOG"):  # a diagnosis of the pacing, one line a save
            with open(os.environ["BENCH_PACER_LOG"], "a") as f:
                f.write(f"rank {dist.get_rank()} save {step}: {each[-1]:.1f} s, admitted {share.admitted} in "
                        f"{share.seconds:.1f} s, {share.throttles} throttles, rate now {pacer.rate:.1f}/s\n")
    return each


def _options(mode: str) -> tuple[SaveOptions, RetryPolicy]:
    if not mode.startswith("save-"):
        return SaveOptions(restore_fanout=mode != "restore-nofanout"), RetryPolicy()
    rate = os.environ.get("BENCH_WRITE_RATE", "none")
    save_options = SaveOptions(part_size=int(os.environ.get("BENCH_PART_KB", "128")) << 10,
                               write_rate=None if rate == "none" else float(rate),
                               key_prefixes=int(os.environ.get("BENCH_KEY_PREFIXES", "16")))
    return save_options, RetryPolicy(max_attempts=30, max_total=600, pace_writes=mode == "save-paced")


def main(mode: str, root: str, size_mb: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    options = json.loads(os.environ["BENCH_STORAGE_OPTIONS"])
    save_options, retry = _options(mode)
    with CheckpointManager(root, storage_options=options, options=save_options, async_save=False,
                           retry=retry) as mgr:
        if mode.startswith("save-"):
            result = {"ok": True, "seconds": 0.0, "each": saves(mgr, int(size_mb))}
        elif mode == "save":
            mgr.save(1, {"model": model(int(size_mb), 1)})
            result = {"ok": True, "seconds": 0.0}
        else:
            got = {"model": model(int(size_mb), 2)}
            dist.barrier()
            t0 = time.perf_counter()
            mgr.restore(got)
            seconds = time.perf_counter() - t0
            want = model(int(size_mb), 1).state_dict()
            ok = all(torch.equal(v, want[k]) for k, v in got["model"].state_dict().items())
            result = {"ok": ok, "seconds": seconds}
    Path(out_dir, f"rank-{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(*sys.argv[1:5])
