"""This rank's place in the job and its process group: :func:`setup_distributed`, :func:`teardown_distributed`.

NCCL on GPUs, gloo on CPUs, with a finite collective timeout so a lost rank fails the job instead
of hanging it. Without torchrun's environment (no ``WORLD_SIZE``) the trainer runs as one plain
process and no process group is made. On CPUs the ranks of a node share its cores: each gets a
torch thread pool of ``cores / LOCAL_WORLD_SIZE`` threads, so they do not oversubscribe them.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from streamio.distributed import local_rank_and_world
from streamio.errors import ConfigError
from streamio.train.config import TrainConfig


@dataclass(frozen=True)
class Distributed:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    initialized: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(cfg: TrainConfig) -> Distributed:
    """Join the process group torchrun describes (NCCL on CUDA, gloo on CPU), or run alone.

    The collective timeout is finite (``cfg.collective_timeout_s``): a rank that died or diverged
    makes the others fail with a clear error instead of hanging the job forever.

    Raises:
        ValueError: ``cfg.device`` is not ``auto``, ``cpu`` or ``cuda``.
        RuntimeError: ``cfg.device`` is ``cuda`` but torch sees no CUDA device.
        PlanError: ``LOCAL_RANK`` or ``LOCAL_WORLD_SIZE`` is set but not an integer (a ``ValueError``).
    """
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"--device {cfg.device!r} is not one of auto, cpu, cuda")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"--device cuda, but this torch {torch.__version__} sees no CUDA device: "
            "use --device auto (or cpu), or install a CUDA build of torch"
        )
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    local_rank, local_world = local_rank_and_world()
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
        # ranks share the cores: one thread pool each of the right size, no oversubscription
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if "WORLD_SIZE" not in os.environ:
        return Distributed(0, 1, 0, device, initialized=False)
    dist.init_process_group(
        backend="nccl" if use_cuda else "gloo",
        timeout=datetime.timedelta(seconds=cfg.collective_timeout_s),
        device_id=device if use_cuda else None,
    )
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, device, initialized=True)


def teardown_distributed(d: Distributed) -> None:
    """Leave the process group (the caller then flushes and ``os._exit``s; see ``__main__``)."""
    if d.initialized and dist.is_initialized():
        dist.destroy_process_group()
