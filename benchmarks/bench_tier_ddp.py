"""A local-tier save under DDP against one process (issue 34, item 19): ``SaveStats.local_s``.

Run: ``.venv/bin/python -m benchmarks.bench_tier_ddp [--world 2] [--saves 12] [--durable-every 1]
[--s3] [--latency 0]``.

Each rank saves a tiny state (16 floats) at every step, 50 ms apart, never waiting (a training
loop), with a ``LocalTier`` in a temp directory; the root is a temp directory, or moto S3
(``--s3``, behind a FaultProxy with ``--latency`` seconds per request). Prints the median
``local_s`` of each rank (the first save excluded: it also plans against the root), i.e. the time
from the ``save`` call to every rank's local pointer naming the step. ``--world 1`` is one
process without a process group. Ranks are spawned with ``torch.multiprocessing`` over gloo.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import clean_aws_env, free_port


def _rank(rank: int, world: int, port: int, cfg: dict[str, Any]) -> None:
    from streamio import CheckpointManager, LocalTier, SaveOptions

    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    mgr = CheckpointManager(cfg["root"], storage_options=cfg["storage"], local=LocalTier(cfg["local"]),
                            options=SaveOptions(durable_every=cfg["durable_every"]))
    local_s = []
    for step in range(1, cfg["saves"] + 1):
        mgr.save(step, {"w": torch.full((16,), float(step)), "progress": {"step": step}})
        if mgr.last_stats is not None and mgr.last_stats.local_s is not None:
            local_s.append(mgr.last_stats.local_s)
        time.sleep(0.05)
    mgr.wait()
    mgr.close()
    print(f"rank {rank}/{world}: median local_s {statistics.median(local_s[1:]):.3f} s over {len(local_s) - 1} "
          f"saves (all: {', '.join(f'{s:.3f}' for s in local_s)})", flush=True)
    if world > 1:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo ranks sometimes abort at interpreter exit (docs: KNOWN-BEHAVIOUR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--saves", type=int, default=12)
    parser.add_argument("--durable-every", type=int, default=1)
    parser.add_argument("--s3", action="store_true", help="the root on moto S3 (else a temp directory)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per S3 request (with --s3)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-tier-ddp-")
    cfg = {"root": f"{tmp}/root", "storage": None, "local": f"{tmp}/local", "saves": args.saves,
           "durable_every": args.durable_every}
    if not args.s3:
        mp.start_processes(_rank, args=(args.world, free_port(), cfg), nprocs=args.world, start_method="spawn")
        return
    clean_aws_env()
    from streamio.testing import FaultProxy, MotoServer, S3Endpoint

    server = MotoServer()
    endpoint = server.start()
    try:
        s3 = S3Endpoint(endpoint, "unused").new_bucket()
        with FaultProxy(endpoint) as proxy:
            proxy.set_latency(args.latency)
            cfg.update(root=s3.url("root"), storage=s3.storage_options(proxy.endpoint_url))
            mp.start_processes(_rank, args=(args.world, free_port(), cfg), nprocs=args.world, start_method="spawn")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
