"""Two gloo ranks on CPU all_reduce, in real processes: the distributed plumbing every test above it uses.

Run STREAMIO_SMOKE_REPEAT times (3 by default, CI) back to back, because the failure this guards
against is intermittent: after a collective, a gloo rank sometimes aborts at interpreter exit
("terminate called without an active exception", exit 1). The worker's ending is the measured
fix (docs/design.md "Measured behaviour"): destroy_process_group(), flush stdout/stderr, then os._exit(0).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 2
REPEAT = int(os.environ.get("STREAMIO_SMOKE_REPEAT", "3"))


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    """One rank: all_reduce, record the result, tear down so the exit code is 0 every time."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
        t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        gathered = [None] * WORLD
        dist.all_gather_object(gathered, {"rank": rank, "pid": os.getpid()})
        dist.barrier()
        Path(out_dir, f"rank-{rank}.json").write_text(json.dumps({"sum": t.tolist(), "peers": gathered}))
        dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


@pytest.mark.slow
@pytest.mark.parametrize("run", range(REPEAT))
def test_two_process_gloo_all_reduce(tmp_path: Path, run: int) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # forkserver: torch is imported once, in the server, and each launch forks from it (a clean
    # single-threaded process, unlike this pytest process with its server threads)
    mp.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", __name__])
    ctx = mp.start_processes(
        _worker, args=(str(tmp_path / "init"), str(out)), nprocs=WORLD, join=False, start_method="forkserver"
    )
    while not ctx.join(timeout=120):
        pass
    assert [p.exitcode for p in ctx.processes] == [0] * WORLD
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    for r, res in enumerate(results):
        assert res["sum"] == [3.0, 30.0], (r, res)
        assert [p["rank"] for p in res["peers"]] == [0, 1]
    assert results[0]["peers"][1]["pid"] != results[0]["peers"][0]["pid"]
