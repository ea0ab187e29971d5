"""CheckpointManager alone, added to an existing training loop (plain DataLoader, no streamio dataset).

What it shows: the four lines a loop needs (construct, ``restore`` at start, ``save`` in the loop,
``close`` at the end), a retention policy that keeps the last two checkpoints and the best one by
validation loss, RNG state, and a plain value (the epoch) saved beside the stateful objects.

A plain ``torch.utils.data.DataLoader`` has no ``state_dict``: it cannot resume inside an epoch.
So this loop checkpoints at epoch ends and makes each epoch's shuffle a function of the epoch
(a ``torch.Generator`` seeded with it), which makes the resume exact: a resumed epoch ends with
the same weights, bit for bit, as it did in the run that saved the checkpoint (compare the
checksums it prints; ``--restore-step`` rolls back to an older checkpoint and trains on from
there). For resume inside an epoch, stream the data with ``streamio.StreamingDataset`` +
``StreamingDataLoader`` (examples/image_classification.py).

Run it (CPU, a few seconds), against a local S3:

    python -m streamio.testing s3 --bucket examples --env-file s3.env &
    until [ -s s3.env ] || ! kill -0 $! 2>/dev/null; do sleep 0.2; done; source s3.env
    python examples/checkpoint_only.py --epochs 2      # starts at epoch 0
    python examples/checkpoint_only.py --epochs 4      # resumed at epoch 2
    python examples/checkpoint_only.py --epochs 4 --restore-step 60   # back to epoch 3: same weights
    streamio ckpt ls s3://examples/checkpoint-only     # what the root holds

``--url`` takes any bucket prefix or a local directory.
"""

from __future__ import annotations

import argparse
import hashlib

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import streamio


def make_data() -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1200, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long()
    return TensorDataset(x[:1000], y[:1000]), TensorDataset(x[1000:], y[1000:])


def weights_checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="s3://examples/checkpoint-only", help="checkpoint root")
    p.add_argument("--epochs", type=int, default=4, help="train until this many epochs are done")
    p.add_argument("--restore-step", type=int, default=None, help="restore this step, not the newest")
    args = p.parse_args()

    # ---- the existing job: model, optimizer, schedule, data
    torch.manual_seed(0)
    train_set, val_set = make_data()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)

    # ---- added: a checkpoint root, and what makes up the job's state
    ckpt = streamio.CheckpointManager(
        args.url, retention=streamio.KeepLast(2) | streamio.KeepBest("val_loss", mode="min")
    )
    rng = streamio.RNGState(seed=0)  # python, numpy and torch RNGs (dropout masks here)
    state = {"model": model, "optim": optim, "sched": sched, "rng": rng, "epoch": 0}
    try:
        step = ckpt.restore(state, step=args.restore_step)  # in place; the plain value state["epoch"] is replaced
        print(f"resumed at epoch {state['epoch']} (step {step})", flush=True)
    except streamio.errors.CheckpointNotFoundError:
        step = 0
        print(f"no checkpoint under {args.url}: starting at epoch 0", flush=True)

    for epoch in range(state["epoch"], args.epochs):
        # the epoch's order is a function of the epoch, so a resumed run sees the same batches
        order = torch.Generator().manual_seed(epoch)
        model.train()
        for x, y in DataLoader(train_set, batch_size=50, shuffle=True, generator=order):
            loss = nn.functional.cross_entropy(model(x), y)
            optim.zero_grad()
            loss.backward()
            optim.step()
            step += 1
        sched.step()
        model.eval()
        with torch.no_grad():
            x, y = val_set.tensors
            val_loss = nn.functional.cross_entropy(model(x), y).item()
        state["epoch"] = epoch + 1  # the epoch to start from when this checkpoint is restored
        ckpt.save(step, state, metrics={"val_loss": val_loss})  # returns after the host copy
        print(f"epoch {epoch}: val_loss {val_loss:.4f}, weights {weights_checksum(model)}, checkpoint at step {step}",
              flush=True)

    ckpt.close()  # the last upload is durable when this returns
    print(f"done at epoch {state['epoch']}; kept checkpoints {ckpt.steps()}")


if __name__ == "__main__":
    main()
