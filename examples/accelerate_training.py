"""HF Accelerate training with streamio's loader and checkpoints: ``streamio.accelerate``.

What it shows, against a plain Accelerate script:

* ``streamio.accelerate.prepare(accelerator, model, optimizer, loader, scheduler)`` instead of
  ``accelerator.prepare(...)``: the model, optimizer and scheduler are Accelerate's as usual, while
  the ``StreamingDataLoader`` keeps its own sharding (a disjoint share per rank, the same number of
  batches on every rank) and only has its batches moved to ``accelerator.device``.
* ``load_state(accelerator, ckpt)`` / ``save_state(accelerator, ckpt, step)`` instead of
  ``accelerator.load_state(dir)`` / ``save_state(dir)``: the same content (models, optimizers,
  schedulers, scaler, registered objects), plus every rank's RNG streams and the loader's exact
  position, as one streamio checkpoint on S3/GCS/local disk: parallel parts, the pointer written
  last, nothing pickled. ``load_state`` returns ``None`` when there is nothing to resume.
* Run it again with more ``--steps`` and it continues at the exact next batch, also on another
  number of processes. docs/accelerate.md is the guide.
* ``streamio.Preemption``: a ``SIGTERM``/``SIGUSR1`` to any process (``kill <pid>``, Slurm,
  Kubernetes) makes every process save the same step, wait until it is durable, and exit 143;
  run it again to continue from there.

Run it (CPU; ``pip install 'streamio-torch[accelerate]'``), against a local S3:

    python -m streamio.testing s3 --bucket examples --env-file s3.env &
    until [ -s s3.env ] || ! kill -0 $! 2>/dev/null; do sleep 0.2; done; source s3.env
    python examples/accelerate_training.py --steps 8                                     # one process
    torchrun --standalone --nproc-per-node 2 examples/accelerate_training.py --steps 16  # resumed at 8

(``accelerate launch --num_processes 2 ...`` starts the processes the same way on GPUs.)
``--url`` takes any bucket prefix or a local directory.
"""

from __future__ import annotations

import argparse
import io
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator

import streamio
from streamio.accelerate import load_state, prepare, save_state

FEATURES = 8


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_data_once(accelerator: Accelerator, url: str, samples: int) -> None:
    """The main process writes a small regression dataset (y = x . w + noise) unless one is there."""
    if accelerator.is_main_process and not streamio.Store(url).exists("index.json"):
        rng = np.random.default_rng(0)
        w = rng.normal(size=FEATURES).astype(np.float32)
        xs = rng.normal(size=(samples, FEATURES)).astype(np.float32)
        ys = xs @ w + 0.01 * rng.normal(size=samples).astype(np.float32)
        streamio.write_dataset(
            ({"__key__": f"{i:06d}", "x.npy": npy(xs[i]), "y.npy": npy(ys[i : i + 1])} for i in range(samples)),
            url, spec=streamio.ShardSpec(max_count=128),
        )
    accelerator.wait_for_everyone()


def to_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    return {"x": torch.from_numpy(sample["x.npy"]), "y": torch.from_numpy(sample["y.npy"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="s3://examples/accelerate", help="dataset and checkpoints go below it")
    p.add_argument("--steps", type=int, default=8, help="train up to this step")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--ckpt-every", type=int, default=4)
    args = p.parse_args()

    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # under torchrun: CPU ranks only with cpu=True
    write_data_once(accelerator, f"{args.url}/data", args.samples)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.8)
    dataset = streamio.StreamingDataset(f"{args.url}/data", batch_size=16, seed=0, decode="auto",
                                       transform=to_tensors)
    stop = streamio.Preemption()  # before the loader's workers start: they leave the signals to their rank
    loader = streamio.StreamingDataLoader(dataset, num_workers=1, worker_init_fn=stop.worker_init_fn)
    model, optimizer, loader, scheduler = prepare(accelerator, model, optimizer, loader, scheduler)

    ckpt = streamio.CheckpointManager(f"{args.url}/ckpt", retention=streamio.KeepLast(2))
    step = load_state(accelerator, ckpt) or 0
    accelerator.print(f"resumed at step {step}, {accelerator.num_processes} process(es)" if step
                      else f"nothing to resume under {args.url}/ckpt: starting at step 0")
    while step < args.steps:
        for batch in loader:  # on accelerator.device already; sharded by streamio, not by Accelerate
            loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            stopping = stop.requested(step)  # the same answer on every process (one tiny all-reduce)
            if step % args.ckpt_every == 0 or stopping:
                save_state(accelerator, ckpt, step)  # collective: every process calls it
                accelerator.print(f"step {step}: loss {loss.item():.4f}, checkpoint saved")
            if stopping:
                ckpt.close()  # the save durable before any process leaves
                stop.exit()  # waits for every process, then exits streamio.Preemption.EXIT_CODE (143)
            if step == args.steps:
                break
    ckpt.close()  # waits for the last upload
    accelerator.wait_for_everyone()
    accelerator.print(f"finished at step {step}; checkpoints: {ckpt.steps()}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
