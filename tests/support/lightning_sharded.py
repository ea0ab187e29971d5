"""A Lightning ``ModelParallelStrategy`` run (FSDP2 on gloo, CPU) checkpointing through streamio to S3 (moto).

``python -m torch.distributed.run --nproc_per_node N lightning_sharded.py DIRPATH OUT MAX_STEPS KILL_AT RESUME``:
trains a small deterministic model (no dropout) sharded with ``fully_shard`` over the N ranks,
saving every 3 steps with top-2 by step and ``last.ckpt``. Each step's inputs derive from the step
and the rank, so the loader's position does not matter. ``KILL_AT`` > 0: rank 0 sends SIGKILL to
the whole process group after that step. ``RESUME`` = 1: ``fit(ckpt_path="last")``. Rank 0 writes
the final (full) weights, its per-step losses and the Adam step count to OUT as JSON (floats as
``float.hex``, so equality is bit equality). ``LIGHTNING_ACCELERATOR=gpu`` runs it on CUDA (NCCL),
as scripts/gpu_check.sh does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader

from streamio.lightning import CheckpointIO, ModelCheckpoint, ModelParallelStrategy


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        self.losses: dict[int, str] = {}

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 * self.global_step + self.global_rank)
        x = torch.randn(16, 8, generator=g).to(self.device)
        loss = torch.nn.functional.mse_loss(self.net(x), x.sum(1, keepdim=True))
        self.losses[self.global_step] = float(loss).hex()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


class KillAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.is_global_zero:
            os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> None:
    dirpath, out, max_steps, kill_at, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    world = int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model()
    callbacks: list[L.Callback] = [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=3, save_top_k=2,
                                                   monitor="step", mode="max", save_last=True)]
    if kill_at > 0:
        callbacks.append(KillAt(kill_at))
    trainer = L.Trainer(accelerator=os.environ.get("LIGHTNING_ACCELERATOR", "cpu"), devices=world,
                        max_steps=max_steps, logger=False,
                        strategy=ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1),
                        enable_progress_bar=False, enable_model_summary=False, plugins=[CheckpointIO()],
                        callbacks=callbacks)
    trainer.fit(model, DataLoader(torch.zeros(1000, 1), batch_size=1), ckpt_path="last" if resume == "1" else None)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    optimizer = trainer.optimizers[0]
    steps = sorted({int(s["step"]) for s in optimizer.state.values()})
    if trainer.is_global_zero:
        weights = {k: [float(v).hex() for v in t.flatten().tolist()] for k, t in full.items()}
        with open(out, "w") as f:
            json.dump({"weights": weights, "losses": model.losses, "global_step": trainer.global_step,
                       "adam_steps": steps}, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
