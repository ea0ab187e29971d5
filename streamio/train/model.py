"""The model and what trains it: :func:`make_model`, :func:`build_components`, :func:`warmup_cosine`.

The demo model is a small MLP with dropout (so exact resume must restore the dropout RNG too),
sized for the bundled synthetic task (:mod:`streamio.train.data`). Built in an order that makes
every rank start alike and resume exactly:

1. ``torch.manual_seed(seed)``, then the model: the same initial weights on every rank;
2. wrapped in ``DistributedDataParallel`` when a process group exists (the bare module is kept:
   it is what checkpoints hold and what validation runs, with no collective call); with
   ``--fsdp``, sharded with FSDP2 instead (:mod:`streamio.train.distributed`: the sharded module
   is both what trains and what checkpoints hold);
3. ``torch.manual_seed`` of a seed derived from ``(seed, rank)`` with structure (never
   ``seed + rank``): each rank's own dropout stream;
4. AdamW, and a ``LambdaLR`` warmup-then-cosine schedule stepped once per optimizer step over
   ``min(max_steps, optimizer steps per epoch * epochs)`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from streamio.errors import ConfigError
from streamio.train.config import TrainConfig
from streamio.train.data import DIM, NUM_CLASSES
from streamio.train.distributed import Distributed, shard_model


def make_model(*, hidden: int = 128, dropout: float = 0.1, in_dim: int = DIM, classes: int = NUM_CLASSES) -> nn.Module:
    """``in_dim -> hidden -> hidden -> classes`` with GELU and dropout after each hidden layer."""
    return nn.Sequential(
        nn.Linear(in_dim, hidden),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, classes),
    )


@dataclass(frozen=True)
class Components:
    """What :func:`build_components` makes; the trainer keeps each as an attribute of the same name.

    Attributes:
        net: the bare model (checkpointed, validated); under FSDP, the sharded model itself.
        model: ``net`` wrapped in ``DistributedDataParallel`` under a process group, else ``net`` (trained).
        sharded: ``net`` is sharded with FSDP2 (``--fsdp`` under a process group).
        optimizer: AdamW over ``net``'s parameters.
        scheduler: the :func:`warmup_cosine` schedule, stepped once per optimizer step.
        total_steps: optimizer steps the schedule spans.
    """

    net: nn.Module
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    total_steps: int
    sharded: bool = False


def warmup_cosine(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup to 1 over ``warmup_steps``, cosine decay to 0.1 by ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def build_components(cfg: TrainConfig, d: Distributed, batches_per_epoch: int) -> Components:
    """Model, DDP wrapper or FSDP2 sharding, optimizer and schedule for this rank (order: module docstring).

    ``batches_per_epoch`` is the training loader's length before any resume: a whole epoch.

    Raises:
        ValueError: an epoch of ``batches_per_epoch`` micro-batches makes no optimizer step of
            ``cfg.grad_accum`` micro-batches.
    """
    cuda = d.device.type == "cuda"
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    net = make_model(hidden=cfg.hidden, dropout=cfg.dropout).to(d.device)
    model: nn.Module = net
    sharded = cfg.fsdp and d.initialized
    if sharded:
        model = net = shard_model(net, d.device, d.world_size)
    elif d.initialized:
        model = DistributedDataParallel(net, device_ids=[d.local_rank] if cuda else None)
    # each rank's own dropout stream, seeded with structure (seed, rank), never seed + rank
    torch.manual_seed(int(np.random.SeedSequence([cfg.seed, d.rank]).generate_state(1)[0]))
    optimizer = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = batches_per_epoch // cfg.grad_accum
    if steps_per_epoch == 0:
        raise ConfigError(
            f"{batches_per_epoch} batches per epoch per rank cannot make one optimizer step of "
            f"{cfg.grad_accum} micro-batches: lower --grad-accum or --batch-size, or add data"
        )
    total_steps = min(cfg.max_steps or 1 << 62, steps_per_epoch * cfg.epochs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.warmup_steps, total_steps))
    return Components(net, model, optimizer, scheduler, total_steps, sharded)
