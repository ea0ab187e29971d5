"""One Lightning process (no process group) with a ``PreemptionCheckpoint`` that sends itself SIGTERM.

``python lightning_preempt_one.py DIRPATH SIGNAL_AT [SIGNAL]``: trains 6 steps, saving through
``streamio.lightning.CheckpointIO`` under DIRPATH (a ``ModelCheckpoint`` that saves nothing on its
own); after step ``SIGNAL_AT`` the process sends itself SIGNAL (default SIGTERM). With
``SLURM_JOB_ID`` in the environment the trainer runs under Lightning's
``SLURMEnvironment(auto_requeue=True)``. Its exit status is what is checked.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

from streamio.lightning import CheckpointIO, ModelCheckpoint, PreemptionCheckpoint


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.net(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SignalAt(L.Callback):
    def __init__(self, step: int, number: int) -> None:
        self.step, self.number = step, number

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.number)


def main() -> None:
    dirpath, signal_at = sys.argv[1], int(sys.argv[2])
    number = signal.Signals[sys.argv[3]] if len(sys.argv) > 3 else signal.SIGTERM
    slurm = [SLURMEnvironment(auto_requeue=True)] if "SLURM_JOB_ID" in os.environ else []
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=[CheckpointIO(), *slurm], default_root_dir=dirpath,
                        callbacks=[SignalAt(signal_at, number), PreemptionCheckpoint(),
                                   ModelCheckpoint(dirpath=dirpath, save_top_k=0, save_last=False)])
    trainer.fit(Model(), torch.utils.data.DataLoader(torch.zeros(12, 2), batch_size=2))


if __name__ == "__main__":
    main()
