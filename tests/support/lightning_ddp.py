"""A Lightning DDP run (2 gloo ranks under torchrun) checkpointing through streamio to S3 (moto).

``python -m torch.distributed.run --nproc_per_node 2 lightning_ddp.py DIRPATH OUT MAX_STEPS KILL_AT RESUME [DATASET]``:
trains a small model with dropout (each rank's torch stream, seeded by rank, shows in the weights),
saving every 4 steps with top-2 by step and ``last.ckpt``. Without DATASET each step's inputs derive
from the step and the rank (the loader's position does not matter); with it, from the keys of the
samples a ``StreamingDataLoader`` over DATASET hands out. ``KILL_AT`` > 0: rank 0 sends SIGKILL to
the whole process group after that step. ``RESUME`` = 1: ``fit(ckpt_path="last")``. Rank 0 writes
the final weights and its per-step losses to OUT as JSON (floats as ``float.hex``, so equality is
bit equality); with DATASET every rank writes ``OUT.rank<r>`` with ``[epoch, step, batch_idx,
keys]`` of each of its steps. Every rank writes ``OUT.rng<r>``: per step, a draw of torch, Python
``random`` and NumPy's global RNG. With ``SIGTERM_AT`` in the environment the trainer has a
``PreemptionCheckpoint`` too, and rank 1 alone sends itself SIGTERM after step ``SIGTERM_AT`` (> 0).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import zlib
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from streamio import StreamingDataLoader, StreamingDataset
from streamio.lightning import CheckpointIO, ModelCheckpoint, PreemptionCheckpoint


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.2),
                                       torch.nn.Linear(16, 1))
        self.losses: dict[int, str] = {}
        self.draws: dict[int, list[str]] = {}
        self.seen: list[list[Any]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if isinstance(batch, dict):  # a StreamingDataLoader's samples: inputs from their keys
            keys = list(batch["__key__"])
            self.seen.append([self.current_epoch, self.global_step, batch_idx, keys])
            x = torch.stack([torch.randn(8, generator=torch.Generator().manual_seed(zlib.crc32(k.encode())))
                             for k in keys])
        else:
            g = torch.Generator().manual_seed(1000 * self.global_step + self.global_rank)
            x = torch.randn(16, 8, generator=g)
        draws = (float(torch.rand(1)), random.random(), float(np.random.rand()))
        self.draws[self.global_step] = [d.hex() for d in draws]
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


class SigtermAt(L.Callback):
    """Rank 1 alone gets SIGTERM after ``step``: one rank's process only, as ``kill <pid>`` does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    dirpath, out, max_steps, kill_at, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Model()
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)  # each rank its own streams (what a resumed rank must get back)
    random.seed(200 + rank)
    np.random.seed(300 + rank)
    callbacks: list[L.Callback] = [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=4, save_top_k=2,
                                                   monitor="step", mode="max", save_last=True)]
    if kill_at > 0:
        callbacks.append(KillAt(kill_at))
    if "SIGTERM_AT" in os.environ:
        sigterm_at = int(os.environ["SIGTERM_AT"])
        callbacks += [SigtermAt(sigterm_at)] if sigterm_at > 0 else []
        callbacks.append(PreemptionCheckpoint())
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=max_steps, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, plugins=[CheckpointIO()],
                        callbacks=callbacks)
    if len(sys.argv) > 6:
        loader: Any = StreamingDataLoader(StreamingDataset(sys.argv[6], batch_size=2, seed=3))
    else:
        loader = DataLoader(torch.zeros(1000, 1), batch_size=1)
    trainer.fit(model, loader, ckpt_path="last" if resume == "1" else None)
    if len(sys.argv) > 6:
        with open(f"{out}.rank{trainer.global_rank}", "w") as f:
            json.dump(model.seen, f)
    with open(f"{out}.rng{trainer.global_rank}", "w") as f:
        json.dump(model.draws, f)
    if trainer.is_global_zero:
        weights = {k: [float(v).hex() for v in t.flatten().tolist()] for k, t in model.state_dict().items()}
        with open(out, "w") as f:
            json.dump({"weights": weights, "losses": model.losses, "global_step": trainer.global_step}, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
