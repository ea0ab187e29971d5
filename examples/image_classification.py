"""Image classification from a directory of images: shard, train with workers, kill -9, resume.

What it shows:

1. A directory of ``00042.png`` + ``00042.cls`` files (made here: small coloured images of 3
   classes) packed into shards with ``streamio shard DIR URL``.
2. A training script (:func:`train`): ``StreamingDataset`` + ``StreamingDataLoader`` with 2
   workers, a tiny CNN, ``CheckpointManager`` saving model, optimizer, RNGs and the loader's exact
   position every few steps, and ``restore`` at start.
3. That script run in a child process and killed with SIGKILL mid-run (no cleanup: the
   checkpoint in flight is lost), then run again (in this process): it restores the newest
   complete checkpoint and prints ``resumed at step N``; the data continues at the exact batch
   after step N.

Run it (CPU, about a minute; ``--small``: a few seconds of training), against a local S3:

    python -m streamio.testing s3 --bucket examples --env-file s3.env &
    until [ -s s3.env ] || ! kill -0 $! 2>/dev/null; do sleep 0.2; done; source s3.env
    python examples/image_classification.py                 # --url s3://examples/image-classification

or against a real bucket (``--url s3://my-bucket/prefix``, credentials the usual way), or a local
directory (``--url /tmp/streamio-example``). Each run writes under ``URL/<run id>/``.
Needs Pillow (``pip install pillow``).
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import streamio

CLASSES = 3


# --------------------------------------------------------------------------- the training script
def to_tensors(sample: dict[str, Any]) -> dict[str, Any]:
    """A decoded sample (``png`` -> PIL image, ``cls`` -> int) -> an image tensor and its label."""
    image = torch.from_numpy(np.asarray(sample["png"].convert("RGB"), dtype=np.float32) / 255.0)
    return {"image": image.permute(2, 0, 1), "label": sample["cls"]}


def tiny_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, CLASSES),
    )


def train(data_url: str, ckpt_url: str, *, epochs: int, ckpt_every: int, step_time: float) -> int:
    """The part of this file a real job is made of: stream, train, checkpoint, resume.

    Returns the step it started from (0, or the checkpoint's)."""
    torch.manual_seed(0)
    ds = streamio.StreamingDataset(data_url, batch_size=16, decode="auto", transform=to_tensors, seed=0)
    loader = streamio.StreamingDataLoader(ds, num_workers=2)  # batch_size: the dataset's
    model = tiny_cnn()
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng = streamio.RNGState(seed=0)
    ckpt = streamio.CheckpointManager(ckpt_url, retention=streamio.KeepLast(2))
    state = {"model": model, "optim": optim, "data": loader, "rng": rng}
    try:
        step = ckpt.restore(state)  # model, optimizer, RNGs, and the loader at its exact batch
        print(f"resumed at step {step} (epoch {ds.epoch})", flush=True)
    except streamio.errors.CheckpointNotFoundError:
        step = 0
        print("no checkpoint yet: starting at step 0", flush=True)
    started = saved = step
    for epoch in range(ds.epoch, epochs):  # restore() put the dataset at its epoch
        ds.set_epoch(epoch)
        correct = seen = 0
        for batch in loader:
            logits = model(batch["image"])
            loss = nn.functional.cross_entropy(logits, batch["label"])
            optim.zero_grad()
            loss.backward()
            optim.step()
            correct += int((logits.argmax(1) == batch["label"]).sum())
            seen += len(batch["label"])
            step += 1
            time.sleep(step_time)  # stands in for the accelerator's time per step
            print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step % ckpt_every == 0:
                ckpt.save(step, state)  # returns after the host copy; uploads in the background
                saved = step
                print(f"checkpoint at step {step}", flush=True)
        print(f"epoch {epoch} done: accuracy {correct / max(seen, 1):.2f} on this run's part of it", flush=True)
    if saved != step:
        ckpt.save(step, state)  # the final state, unless it is saved already
    ckpt.close()  # waits for the last upload
    print(f"finished at step {step}", flush=True)
    return started


# --------------------------------------------------------------------------- the demo around it
def make_images(root: Path, count: int, size: int = 32) -> None:
    """``count`` PNGs of ``size`` px: class c is noise tinted towards red, green or blue."""
    from PIL import Image

    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for i in range(count):
        label = i % CLASSES
        pixels = rng.integers(0, 128, size=(size, size, 3))
        pixels[..., label] += 127
        Image.fromarray(pixels.astype(np.uint8)).save(root / f"{i:05d}.png")
        (root / f"{i:05d}.cls").write_text(str(label))


def run_shard(images: Path, data_url: str) -> None:
    """``streamio shard IMAGES DATA_URL`` (the CLI, run by this interpreter)."""
    cmd = [sys.executable, "-m", "streamio.cli.main", "shard", str(images), data_url, "--max-count", "64", "--shuffle"]
    print("$ streamio " + " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)


def trainer(args: argparse.Namespace, run_url: str) -> list[str]:
    return [sys.executable, __file__, "train", "--url", run_url, "--epochs", str(args.epochs),
            "--ckpt-every", str(args.ckpt_every), "--step-time", str(args.step_time)]


def kill_mid_run(cmd: list[str], kill_after: int) -> list[int]:
    """Run the trainer and SIGKILL it once it has started ``kill_after`` checkpoints; returns their steps."""
    saved: list[int] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"  [run 1] {line}", end="", flush=True)
            if m := re.fullmatch(r"checkpoint at step (\d+)\n", line):
                saved.append(int(m.group(1)))
                if len(saved) == kill_after:
                    proc.send_signal(signal.SIGKILL)
                    print(f"  [run 1] -- killed with SIGKILL after checkpoint {saved[-1]} started", flush=True)
                    break
        proc.wait()
    if proc.returncode == 0:
        sys.exit("the first run finished before it could be killed: raise --epochs")
    if proc.returncode != -signal.SIGKILL:
        sys.exit(f"the first run failed (exit status {proc.returncode}); its error is above")
    return saved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", nargs="?", default="demo", choices=["demo", "train"])
    p.add_argument("--url", default="s3://examples/image-classification", help="where data and checkpoints go")
    p.add_argument("--small", action="store_true", help="a few seconds of training (CI)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--ckpt-every", type=int, default=None, help="steps between checkpoints")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of simulated compute per step")
    args = p.parse_args()
    args.epochs = args.epochs or (1 if args.small else 4)
    args.ckpt_every = args.ckpt_every or (4 if args.small else 10)
    if args.command == "train":  # the trainer process that the demo starts, then kills
        train(f"{args.url}/data", f"{args.url}/ckpt", epochs=args.epochs, ckpt_every=args.ckpt_every,
              step_time=args.step_time)
        return
    run_url = f"{args.url.rstrip('/')}/{time.strftime('%Y%m%d-%H%M%S')}"
    with tempfile.TemporaryDirectory() as tmp:
        make_images(Path(tmp) / "images", 320 if args.small else 1536)
        run_shard(Path(tmp) / "images", f"{run_url}/data")
    saved = kill_mid_run(trainer(args, run_url), kill_after=2)
    print("-- run 2: the same training, started again", flush=True)
    resumed = train(f"{run_url}/data", f"{run_url}/ckpt", epochs=args.epochs, ckpt_every=args.ckpt_every,
                    step_time=args.step_time)
    if resumed not in saved:
        sys.exit(f"the second run started at step {resumed}, not from one of the checkpoints {saved}")
    print(f"the killed run resumed at step {resumed}", flush=True)


if __name__ == "__main__":
    main()
