"""torchrun workers (2 gloo ranks) for the checkpoint collective and model-wrapper tests.

    torchrun --nproc_per_node 2 tests/support/ckpt_collective.py misuse ROOT OUT.json TIMEOUT_S
    torchrun --nproc_per_node 2 tests/support/ckpt_collective.py wrappers ROOT OUT.json

``misuse`` calls save/restore on one rank only (and constructs a manager on one rank only) and
records, per scenario, the error each rank got and how long it took; ``wrappers`` restores a
checkpoint of a plain module into ``DDP(module)`` and saves ``DDP(module)`` for the parent to
restore into a plain one. Rank 0 writes what every rank recorded to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from streamio.checkpoint import CheckpointManager, SaveOptions
from streamio.distributed import leave
from streamio.errors import CheckpointError

SHORT_WAITS, SHORT_WAIT_S = 60, 0.05099


def wrapper_model() -> torch.nn.Module:
    """The model of the wrapper tests (a BatchNorm for buffers and versioned metadata)."""
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))


def _attempt(fn: Any) -> dict[str, Any]:
    """Run ``fn``; what it raised (a CheckpointError's message) and how long it took."""
    start = time.monotonic()
    try:
        value = fn()
    except CheckpointError as exc:
        return {"error": str(exc), "s": time.monotonic() - start}
    return {"error": None, "value": value, "s": time.monotonic() - start}


def _misuse(root: str, timeout_s: float) -> dict[str, Any]:
    rank = dist.get_rank()
    opts = SaveOptions(collective_timeout_s=timeout_s)
    out: dict[str, Any] = {}

    def state(step: int) -> dict[str, Any]:
        return {"model": torch.nn.Linear(4, 4), "progress": {"step": step}}

    def manager() -> CheckpointManager:
        return CheckpointManager(root, options=opts)

    # rank 0 saves alone (the torch.save habit): the error surfaces from wait(); close() returns
    mgr = manager()
    if rank == 0:
        mgr.save(1, state(1))
        out["save_alone"] = _attempt(mgr.wait)
        mgr.save(2, state(2))  # the manager's ranks fell out of step: refused at once
        out["save_after"] = _attempt(mgr.wait)
    out["close"] = _attempt(mgr.close)
    dist.barrier()

    mgr = manager()
    if rank == 0:  # restore on rank 0 only
        out["restore_alone_0"] = _attempt(lambda: mgr.restore(state(0)))
    mgr.close()
    dist.barrier()

    mgr = manager()
    if rank == 1:  # restore on rank 1 only: it waits for rank 0
        out["restore_alone_1"] = _attempt(lambda: mgr.restore(state(0)))
    mgr.close()
    dist.barrier()

    mgr = manager()
    mgr.save(10 + rank, state(10))  # different steps on the two ranks
    out["different_steps"] = _attempt(mgr.wait)
    mgr.save(20, state(20))  # agreeing again: it works
    out["agreed_save"] = _attempt(lambda: mgr.wait() is not None)
    out["agreed_restore"] = _attempt(lambda: mgr.restore(state(0)))
    mgr.close()
    dist.barrier()

    out["short_waits"] = _short_waits(rank)
    dist.barrier()

    if rank == 0:  # a manager constructed on rank 0 only (last: the ranks' group counts now differ)
        out["construct_alone"] = _attempt(lambda: manager().rank)
    return out


def _short_waits(rank: int) -> list[bool | None]:
    """Rank 0 waits SHORT_WAITS times for a message rank 1 never sends, each time until a deadline a
    fraction of a millisecond short of a whole one (torch hands gloo its waits in whole
    milliseconds): what the arrival's wait made of each (``False``: timed out; ``None``: the
    connection closed), one fresh group each (a timed-out wait closes its group's connections)."""
    from streamio.checkpoint import comm

    said, kept = [], []
    for _ in range(SHORT_WAITS):
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=30))
        if rank == 0:
            kept.append(torch.zeros(1, dtype=torch.int64))
            work = dist.irecv(kept[-1], src=1, group=group, tag=9)
            said.append(comm._wait(work, time.monotonic() + SHORT_WAIT_S))
        dist.barrier()
    return said


def _wrappers(root: str) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel

    options = SaveOptions(part_size=64 << 10)
    storage = json.loads(os.environ.get("CKPT_TEST_STORAGE_OPTIONS", "{}"))
    out: dict[str, Any] = {}
    # plain -> DDP: the parent saved wrapper_model() with its weights + 1 as step 1
    ddp = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                                      torch.nn.Linear(8, 2)))
    with CheckpointManager(root, options=options, storage_options=storage) as mgr:
        step = mgr.restore({"model": ddp})
        want = {k: v + 1 for k, v in wrapper_model().state_dict().items()}
        got = ddp.module.state_dict()
        out["plain_to_ddp"] = step == 1 and all(torch.equal(got[k], want[k]) for k in want)
        # DDP -> plain: the parent restores step 2 into a plain module and compares with these
        with torch.no_grad():
            for p in ddp.parameters():
                p.mul_(3)
        ddp.module[1].running_mean.fill_(0.25)
        mgr.save(2, {"model": ddp})
        mgr.wait()
    return out


def main() -> None:
    mode, root, out_path = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    if mode == "misuse":
        result = _misuse(root, float(sys.argv[4]))
    elif mode == "wrappers":
        result = _wrappers(root)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f, default=repr)
    leave(0)  # KNOWN: after gloo/DDP use a rank sometimes aborts at interpreter exit


if __name__ == "__main__":
    main()
