"""What each rank of a checkpoint-tier test runs (forked by :mod:`support.sharded_procs`).

The states are :func:`support.sharded_worker.build`'s (every tensor at a value known exactly in
every process): ``plain`` (a model + Adam replicated on every rank, per-rank ``data``) or ``fsdp``
(FSDP2 shards and a DTensor, besides the replicated and per-rank entries). The ranks share one
local tier directory (``rank-0000R/`` each), as the ranks of one node do, or have one each.

Scenarios (``SCENARIOS``): ``save`` (``args["steps"]`` with ``durable_every=2``, each waited for),
``restore`` (into fresh objects; which step, and whether every element is exact) and ``cadence``
(a training loop's saves, none waited for: what each cost).
"""

from __future__ import annotations

from typing import Any

from support.sharded_worker import build, check

OPTIONS = {"part_size": 32 << 10, "block_size": 1024, "concurrency": 4, "durable_every": 2}


def _manager(args: dict[str, Any]) -> Any:
    """This rank's manager: ``args["local"]`` may name a directory per rank (``{rank}``: one node
    each), ``args["storage"]`` options per rank (a list: each rank through a proxy of its own)."""
    import torch.distributed as dist

    from streamio.checkpoint import CheckpointManager, LocalTier, SaveOptions

    rank = dist.get_rank()
    storage = args["storage"][rank] if isinstance(args["storage"], list) else args["storage"]
    return CheckpointManager(args["root"], storage_options=storage, options=SaveOptions(**OPTIONS),
                             local=LocalTier(args["local"].format(rank=rank), keep=2))


def save(args: dict[str, Any]) -> dict[str, Any]:
    """Save ``args["steps"]`` of ``args["kind"]`` on the local tier and (every second) the root."""
    with _manager(args) as mgr:
        for step in args["steps"]:
            mgr.save(step, build(args["kind"], step))
            mgr.wait()
        return {"durable": mgr.durable_step}


def cadence(args: dict[str, Any]) -> dict[str, Any]:
    """A training loop's saves of a tiny state, every one due for the root (``durable_every=1``),
    a short step apart and never waited for: each save's ``local_s`` as the next save reports it."""
    import time

    import torch
    import torch.distributed as dist

    from streamio.checkpoint import CheckpointManager, LocalTier, SaveOptions
    from streamio.storage import RetryPolicy

    local_s = []
    retry = RetryPolicy(max_attempts=args.get("attempts", 8), initial_backoff=0.01)
    with CheckpointManager(args["root"], storage_options=args["storage"], options=SaveOptions(durable_every=1),
                           local=LocalTier(args["local"].format(rank=dist.get_rank()), keep=2), retry=retry) as mgr:
        for step in args["steps"]:
            mgr.save(step, {"w": torch.full((16,), float(step)), "progress": {"step": step}})
            if mgr.last_stats is not None:
                local_s.append(mgr.last_stats.local_s)
            time.sleep(0.05)  # the training step
        mgr.wait()
        return {"local_s": local_s, "durable": mgr.durable_step}


def restore(args: dict[str, Any]) -> dict[str, Any]:
    """Restore the newest step into fresh objects and check every element of it."""
    state = build(args["kind"], 999)
    with _manager(args) as mgr:
        step = mgr.restore(state)
    return {"step": step, "checks": check(state, step, saved_world=args["world"])}


SCENARIOS = {"save": save, "restore": restore, "cadence": cadence}
