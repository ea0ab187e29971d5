"""This rank's place in the job and how the model is spread over it: the process group, and FSDP2.

**The process group** (:func:`setup_distributed`, :func:`teardown_distributed`): NCCL on GPUs,
gloo on CPUs, with a finite collective timeout so a lost rank fails the job instead of hanging it.
Without torchrun's environment (no ``WORLD_SIZE``) the trainer runs as one plain process and no
process group is made. On CPUs the ranks of a node share its cores: each gets a torch thread pool
of ``cores / LOCAL_WORLD_SIZE`` threads, so they do not oversubscribe them.

**The FSDP2 mode** (``--fsdp``: :func:`shard_model`, :func:`model_state`, :func:`full_weights`).
By default the model is replicated with ``DistributedDataParallel`` (:mod:`streamio.train.model`).
With ``--fsdp`` every parameter, gradient and optimizer moment is a ``DTensor`` sharded over the
ranks (FSDP2's ``fully_shard``) instead of a full replica per rank. What changes in the trainer,
and only this:

* **Sharding** (:func:`shard_model`): ``fully_shard`` on each block holding parameters (its
  parameters are all-gathered just before the block runs and freed after), then on the root, over
  a 1-D mesh of all ranks (``init_device_mesh(device, (world,))``). The model is built from the
  same seed on every rank first, so the shards together are exactly the DDP run's initial weights.
  The optimizer is built afterwards, over the sharded parameters.
* **Checkpoints** (:func:`model_state`): the ``"model"`` and ``"optimizer"`` entries of the state
  become one ``"app": ShardedModelState(net, optimizer)`` entry (torch DCP's ``get_state_dict`` /
  ``set_state_dict``: optimizer state keyed by parameter name, so it loads onto any sharding).
  Each rank writes only its own shards; a checkpoint saved by N ranks restores onto M ranks
  (docs/sharded-checkpoints.md). Everything else in the state is as under DDP.
* **Gradient accumulation**: gradients are reduce-scattered after every micro-batch and
  accumulate sharded. (Skipping the sync, like ``DDP.no_sync``, would keep every rank's unsharded
  gradients of the whole model until the last micro-batch: the memory FSDP exists to save.)
* **Validation**: a forward pass all-gathers parameters, a collective, so every rank runs the same
  number of validation batches (:func:`streamio.train.data.make_data` pads shorter shares with
  empty batches).
* **Final weights** (:func:`full_weights`): gathered onto rank 0 once, at the end.

Without a process group (no torchrun) there is nothing to shard over: the model stays plain, and
its checkpoints still take the ``"app"`` form, so a run moves between FSDP on N ranks and one
plain process both ways.

**Resuming on another number of ranks** needs no flag; it is not bit-exact, and this is what holds
(tests/train/test_train_fsdp.py resumes a 2-rank run on 1 process):

* model and optimizer: exact, every element (resharded on load);
* scheduler (optimizer steps taken), progress counters, early stopping: exact; the schedule's
  length is recomputed for the new topology (its steps per epoch), so the decay from that step
  on follows the new length;
* data position: the samples of the current epoch not consumed yet are dealt to the new ranks
  (``StreamingDataset``'s planner with ``--data-url``, :class:`~streamio.train.data.InMemoryLoader`
  likewise), nothing consumed is repeated; what does not divide into whole batches is cut; later
  epochs are planned for the new world size;
* RNG streams: re-seeded per rank from ``(seed, reseeds, world size, rank)`` with a warning
  (:class:`~streamio.checkpoint.RNGState`), so dropout draws differ;
* the global batch (ranks x batch size x accumulation) changes, so the loss trajectory differs.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

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


def shard_model(net: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """``fully_shard`` each child of ``net`` that holds parameters, then ``net``; return ``net``.

    Collective: every rank of the default process group calls it, with the same model.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    for block in net.children():
        if any(True for _ in block.parameters()):
            fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def model_state(net: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model and optimizer entries of the trainer's state under ``--fsdp``: ``{"app": ...}``."""
    from streamio.checkpoint import ShardedModelState

    return {"app": ShardedModelState(net, optimizer)}


def full_weights(net: nn.Module, *, sharded: bool) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU, keyed as ``net.state_dict()``: on rank 0 (empty elsewhere).

    Under FSDP this gathers every parameter onto rank 0, a collective every rank must call.
    """
    if not sharded:
        return net.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(net, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
