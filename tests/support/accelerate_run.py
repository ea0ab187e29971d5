"""A training run under HF Accelerate (torchrun, gloo ranks) with data and checkpoints through streamio.

``python -m torch.distributed.run --nproc_per_node N accelerate_run.py DATASET CKPT OUT STEPS KILL_AT SAVE_EVERY``:
a small model with dropout, Adam and a StepLR scheduler, trained on the samples a
``StreamingDataLoader`` over DATASET hands out through ``streamio.accelerate.prepare`` (each input
derives from its sample's key), ``load_state`` at the start, ``save_state`` every SAVE_EVERY steps to
CKPT. ``KILL_AT`` > 0: at that step every rank waits for the save in flight, then rank 0 sends
SIGKILL to the whole process group. Each rank writes ``OUT.rank<r>``: its steps as
``[step, epoch, keys, loss, batch device, accelerator device, end_of_dataloader]`` (losses as
``float.hex``, so equality is bit equality); rank 0 writes OUT: the step it resumed from and the
final weights.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import zlib
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator

import streamio
from streamio import StreamingDataLoader, StreamingDataset
from streamio.accelerate import load_state, prepare, save_state


def features(sample: dict[str, Any]) -> dict[str, Any]:
    """The input of a sample: 8 numbers drawn from its key (the same wherever it is read)."""
    g = torch.Generator().manual_seed(zlib.crc32(sample["__key__"].encode()))
    return {"__key__": sample["__key__"], "x": torch.randn(8, generator=g)}


def main() -> None:
    dataset, ckpt_url, out = sys.argv[1], sys.argv[2], sys.argv[3]
    steps, kill_at, save_every = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    loader = StreamingDataLoader(StreamingDataset(dataset, batch_size=2, seed=3, transform=features))
    model, optimizer, loader, scheduler = prepare(accelerator, model, optimizer, loader, scheduler)
    ckpt = streamio.CheckpointManager(ckpt_url)
    start = step = load_state(accelerator, ckpt) or 0
    seen: list[list[Any]] = []
    while step < steps:
        for batch in loader:
            x = batch["x"]
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            seen.append([step, loader.dataset.epoch, list(batch["__key__"]), float(loss.detach()).hex(), str(x.device),
                         str(accelerator.device), accelerator.gradient_state.end_of_dataloader])
            if step % save_every == 0:
                save_state(accelerator, ckpt, step)
            if step == kill_at:
                ckpt.wait()
                accelerator.wait_for_everyone()
                if accelerator.is_main_process:
                    os.killpg(os.getpgid(0), signal.SIGKILL)
            if step == steps:
                break
    ckpt.close()
    with open(f"{out}.rank{accelerator.process_index}", "w") as f:
        json.dump(seen, f)
    if accelerator.is_main_process:
        weights = {k: [float(v).hex() for v in t.flatten().tolist()]
                   for k, t in accelerator.unwrap_model(model).state_dict().items()}
        with open(out, "w") as f:
            json.dump({"start": start, "weights": weights}, f)
    accelerator.wait_for_everyone()
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
