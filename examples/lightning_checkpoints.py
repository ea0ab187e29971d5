"""PyTorch Lightning writing its checkpoints through streamio, and ``fit(ckpt_path="last")`` over S3.

What it shows: the two things a Lightning script changes (``plugins=[CheckpointIO()]`` and
``streamio.lightning.ModelCheckpoint`` instead of Lightning's), a run that stops at ``--steps``,
and a second run that resumes from the newest committed ``last.ckpt`` under ``--url``. Each
checkpoint path (``epoch=0-step=8.ckpt``, ``last.ckpt``) is a streamio checkpoint root: parts,
manifest, and a pointer written last (``streamio ckpt ls|verify|inspect PATH`` read it); nothing
in it is pickled. docs/lightning.md is the guide.

Run it (CPU, a few seconds per run; ``pip install 'streamio-torch[lightning]'``), against a local S3:

    python -m streamio.testing s3 --bucket examples --env-file s3.env &
    until [ -s s3.env ] || ! kill -0 $! 2>/dev/null; do sleep 0.2; done; source s3.env
    python examples/lightning_checkpoints.py --steps 8     # from scratch
    python examples/lightning_checkpoints.py --steps 16    # resumed at step 8
    streamio ckpt ls s3://examples/lightning/last.ckpt

``--url`` takes any bucket prefix or a local directory.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from streamio.lightning import CheckpointIO, ModelCheckpoint


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="s3://examples/lightning", help="where the checkpoints go")
    parser.add_argument("--steps", type=int, default=8, help="train up to this global step")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    data = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=args.steps, logger=False, enable_progress_bar=False,
        plugins=[CheckpointIO()],  # storage_options=... if the environment does not say where S3 is
        callbacks=[ModelCheckpoint(dirpath=args.url, every_n_train_steps=4, save_top_k=2, monitor="step",
                                   mode="max", save_last=True)],
    )
    trainer.fit(Regression(), data, ckpt_path="last")  # nothing there yet: starts from scratch
    print(f"resumed from {trainer.ckpt_path}" if trainer.ckpt_path else "started from scratch")
    print(f"stopped at global step {trainer.global_step}; last checkpoint: {args.url}/last.ckpt")


if __name__ == "__main__":
    main()
