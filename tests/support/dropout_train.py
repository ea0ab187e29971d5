"""The README quick start's training script, with dropout: the child of tests/data/test_resume_rng.py.

    python tests/support/dropout_train.py DATA_URL CKPT_URL OUT [DIE_AT]

The quick start's state and loop (``{"model", "optim", "data": loader, "rng": RNGState(seed=0)}``,
``ckpt.restore(state)``, ``for epoch in range(ds.epoch, EPOCHS): ds.set_epoch(epoch); for x, y in
loader``) over a model with dropout, 2 DataLoader workers, one torch thread. Each step's loss goes
to OUT as ``step float.hex()``, one per line. A checkpoint every ``EVERY`` steps; with DIE_AT, the
script waits for the saves so far, then kills itself with SIGKILL after step DIE_AT.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

import streamio

EPOCHS, EVERY = 3, 5


def to_tensors(sample: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(sample["json"]["x"]), torch.tensor([sample["json"]["y"]])


def main(data_url: str, ckpt_url: str, out: str, die_at: int | None) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ds = streamio.StreamingDataset(data_url, batch_size=8, decode="auto", transform=to_tensors)
    loader = streamio.StreamingDataLoader(ds, num_workers=2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 1))
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt = streamio.CheckpointManager(ckpt_url, retention=streamio.KeepLast(3))
    state = {"model": model, "optim": optim, "data": loader, "rng": streamio.RNGState(seed=0)}
    try:
        step = ckpt.restore(state)
    except streamio.errors.CheckpointNotFoundError:
        step = 0
    with open(out, "w") as losses:
        for epoch in range(ds.epoch, EPOCHS):
            ds.set_epoch(epoch)
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                optim.zero_grad()
                loss.backward()
                optim.step()
                step += 1
                losses.write(f"{step} {loss.item().hex()}\n")
                losses.flush()
                if step % EVERY == 0:
                    ckpt.save(step, state)
                if step == die_at:
                    ckpt.wait()
                    os.kill(os.getpid(), signal.SIGKILL)
    ckpt.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else None)
