"""DDP under torchrun with CheckpointManager: every rank streams its share and checkpoints together.

What it shows:

* ``StreamingDataset`` under ``torchrun``: the rank and world size come from torchrun's
  environment / the process group; each rank reads a disjoint share of every epoch and every rank
  gets the same number of batches (no end-of-epoch hang).
* ``CheckpointManager.save`` / ``restore`` are *collective*: every rank constructs the manager
  and calls them with the same step (not ``if rank == 0:`` as with ``torch.save``). Each rank
  uploads its share of the model and optimizer and its own RNG and data position.
* Run it again with more ``--steps`` and it resumes where the last run stopped, also with another
  ``--nproc-per-node`` (the data position is remapped; RNG streams are re-seeded, with a warning).

Run it (CPU: gloo, 2 processes, ~20 s each), against a local S3:

    python -m streamio.testing s3 --bucket examples --env-file s3.env &
    until [ -s s3.env ] || ! kill -0 $! 2>/dev/null; do sleep 0.2; done; source s3.env
    torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py --steps 20
    torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py --steps 40    # resumed at step 20

On GPUs the same script uses NCCL, one process per GPU. Under Slurm, start one torchrun per node
(README "torchrun / Slurm"). ``--url`` takes any bucket prefix or a local directory.
"""

from __future__ import annotations

import argparse
import io
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import streamio
from streamio.distributed import leave

FEATURES = 8


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_data_once(url: str, samples: int) -> None:
    """Rank 0 writes a small regression dataset (y = x . w + noise) unless one is there; all wait."""
    if dist.get_rank() == 0 and not streamio.Store(url).exists("index.json"):
        rng = np.random.default_rng(0)
        w = rng.normal(size=FEATURES).astype(np.float32)
        xs = rng.normal(size=(samples, FEATURES)).astype(np.float32)
        ys = xs @ w + 0.01 * rng.normal(size=samples).astype(np.float32)
        streamio.write_dataset(
            ({"__key__": f"{i:06d}", "x.npy": npy(xs[i]), "y.npy": npy(ys[i : i + 1])} for i in range(samples)),
            url, spec=streamio.ShardSpec(max_count=128),
        )
        print(f"wrote {samples} samples to {url}", flush=True)
    dist.barrier()


def to_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    return {"x": torch.from_numpy(sample["x.npy"]), "y": torch.from_numpy(sample["y.npy"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="s3://examples/ddp", help="data and checkpoints go under it")
    p.add_argument("--steps", type=int, default=20, help="train until this global step")
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--samples", type=int, default=2048)
    args = p.parse_args()

    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")  # torchrun's environment says where and who
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    log = print if rank == 0 else (lambda *a, **k: None)

    write_data_once(f"{args.url}/data", args.samples)
    ds = streamio.StreamingDataset(f"{args.url}/data", batch_size=32, decode="auto", transform=to_tensors, seed=0)
    loader = streamio.StreamingDataLoader(ds)  # num_workers=N as usual; none needed for this data
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DDP(nn.Linear(FEATURES, 1).to(device))
    optim = torch.optim.Adam(model.parameters(), lr=0.05)
    rng = streamio.RNGState(seed=0)
    state = {"model": model, "optim": optim, "data": loader, "rng": rng}
    ckpt = streamio.CheckpointManager(f"{args.url}/ckpt", retention=streamio.KeepLast(2))  # on EVERY rank

    try:
        step = ckpt.restore(state)  # collective: every rank, same call
        log(f"resumed at step {step} (epoch {ds.epoch}), world size {world}", flush=True)
    except streamio.errors.CheckpointNotFoundError:
        step = 0
        log(f"no checkpoint under {args.url}/ckpt: starting at step 0, world size {world}", flush=True)

    epoch = ds.epoch
    while step < args.steps:
        ds.set_epoch(epoch)
        for batch in loader:
            loss = nn.functional.mse_loss(model(batch["x"].to(device)), batch["y"].to(device))
            optim.zero_grad()
            loss.backward()  # DDP averages the gradients across ranks
            optim.step()
            step += 1
            if step % args.ckpt_every == 0 or step == args.steps:
                ckpt.save(step, state, metrics={"loss": loss.item()})  # collective: every rank, same step
                log(f"step {step} loss {loss.item():.4f} (checkpoint)", flush=True)
            if step == args.steps:
                break
        else:
            epoch += 1
    ckpt.close()  # waits until the last checkpoint is durable
    log(f"finished at step {step}; checkpoints: {ckpt.steps()}", flush=True)

    # Leave cleanly: after DDP, a rank can abort at interpreter exit ("terminate called without an
    # active exception") now and then; destroying the group, flushing and os._exit avoids it.
    leave(0)


if __name__ == "__main__":
    main()
