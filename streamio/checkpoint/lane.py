"""Checkpoint bytes broadcast over the job's GPU interconnect (NCCL), when the job has one.

A restore's fan-out moves every shared part from the rank that read it to every other rank
(docs/design.md "Restore fan-out"). Over the checkpoint's gloo group those bytes cross host TCP;
in an NCCL job they can take NVLink or InfiniBand instead. :func:`broadcast_staged` stages them
through a device buffer of at most ``chunk`` bytes, a chunk at a time, so a share of many
gigabytes costs ``chunk`` bytes of GPU memory. The NCCL group is the checkpoint's own (made once,
beside its gloo groups: :class:`~.comm.Comm`), so its collectives never interleave with the
training loop's on the default group; only a restore uses it, which runs in the training thread
with no save in flight. The same function runs over gloo with a CPU "device" (the tests).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from streamio.distributed import group_initialized

__all__ = ["CHUNK_BYTES", "MIN_BYTES", "broadcast_staged", "lane_device"]

CHUNK_BYTES = 64 << 20
"""The largest device buffer a broadcast stages through."""

MIN_BYTES = 1 << 20
"""Smaller payloads go over gloo: two copies and a launch cost more than they save."""


def lane_device() -> torch.device | None:
    """The device this rank's checkpoint broadcasts are staged on: the current CUDA device in a
    job whose default process group is NCCL; ``None`` otherwise (gloo jobs, CPU machines)."""
    if not group_initialized() or dist.get_backend() != "nccl" or not torch.cuda.is_available():
        return None
    return torch.device("cuda", torch.cuda.current_device())


def broadcast_staged(
    buf: torch.Tensor, *, src: int, rank: int, group: Any, device: torch.device | str, chunk: int = CHUNK_BYTES
) -> None:
    """Broadcast ``buf`` (a flat ``uint8`` host tensor, filled on rank ``src``) into every rank's
    ``buf`` over ``group`` (all ranks of the job), through a buffer on ``device`` of at most
    ``chunk`` bytes.

    Raises:
        RuntimeError: the collective failed (a rank died, the group timed out).
    """
    size = buf.numel()
    if size == 0:
        return
    stage = torch.empty(min(chunk, size), dtype=torch.uint8, device=device)
    for start in range(0, size, chunk):
        n = min(chunk, size - start)
        piece = stage[:n]
        if rank == src:
            piece.copy_(buf[start:start + n])
        dist.broadcast(piece, src=src, group=group)
        if rank != src:
            buf[start:start + n].copy_(piece)
