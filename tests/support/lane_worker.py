"""Rank scenarios of tests/checkpoint/test_lane.py (forked by :class:`support.sharded_procs.Zygote`)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _payload(size: int, src: int) -> torch.Tensor:
    return torch.arange(size, dtype=torch.int64).mul_(31).add_(src).remainder_(251).to(torch.uint8)


def staged(args: dict[str, Any]) -> dict[str, Any]:
    """Every (size, chunk, src) of ``args["cases"]`` broadcast through :func:`broadcast_staged` on a
    gloo group with a CPU stage; whether each rank received exactly the source's bytes."""
    from streamio.checkpoint.comm import Comm
    from streamio.checkpoint.lane import broadcast_staged, lane_device

    rank = dist.get_rank()
    group = dist.new_group(backend="gloo")
    ok = []
    for size, chunk, src in args["cases"]:
        want = _payload(size, src)
        buf = want.clone() if rank == src else torch.zeros(size, dtype=torch.uint8)
        broadcast_staged(buf, src=src, rank=rank, group=group, device="cpu", chunk=chunk)
        ok.append(bool(torch.equal(buf, want)))
    comm = Comm()
    data = bytes(_payload(3000, 1).numpy()) if rank == 1 else None
    got = comm.broadcast_bytes(data, src=1, size=3000)  # a gloo job: no lane, the gloo group
    return {"ok": ok, "lane": lane_device() is not None or comm._lane is not None,
            "comm": bytes(got) == bytes(_payload(3000, 1).numpy())}


SCENARIOS = {"staged": staged}
