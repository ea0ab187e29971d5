"""Validation that every rank agrees on: :func:`validate`.

Each rank sums loss / correct / count over its own share of the validation set, however many
batches that is (the share may be uneven across ranks), then ONE ``all_reduce`` of those sums:
every rank makes the same collective calls, so no rank waits forever for another, and every rank
gets the same result. The forward pass uses the bare module (not its DDP wrapper), so it makes no
collective call either.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from streamio.train.data import Batch
from streamio.train.distributed import Distributed


def to_device(batch: Batch, device: torch.device) -> Batch:
    """``(x, y)`` on ``device``, copied asynchronously (from pinned memory on GPUs)."""
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


@torch.no_grad()
def validate(
    net: nn.Module, batches: Iterable[Batch], d: Distributed, autocast: AbstractContextManager[Any]
) -> dict[str, float]:
    """``val_loss``, ``val_accuracy`` and ``val_count`` over every rank's ``batches``, identical on every rank."""
    net.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=d.device)
    for batch in batches:
        x, y = to_device(batch, d.device)
        with autocast:
            logits = net(x).float()
        totals[0] += F.cross_entropy(logits, y, reduction="sum").double()
        totals[1] += (logits.argmax(dim=1) == y).sum().double()
        totals[2] += len(y)
    if d.initialized:
        dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    return {"val_loss": loss_sum / max(count, 1), "val_accuracy": correct / max(count, 1), "val_count": count}
