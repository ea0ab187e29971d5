"""HF Accelerate checkpoints to S3: ``streamio.accelerate.save_state`` vs ``save_state`` + upload (issue 36).

One process, one ``Accelerator`` (CPU), an MLP of ``--size-mb``/3 MB float32 parameters with Adam
after one step (parameters + both moments = ``--size-mb``), a scheduler; one S3 bucket on moto (in
a child process, no proxy latency). What a user does without streamio is Accelerate's local save,
then an upload of that directory with s3fs ``put``; to resume, the download with ``get`` then
``accelerator.load_state``.

Contenders, interleaved, one untimed warm-up each, medians of ``--reps``:

* ``streamio save blocked``: ``save_state(accelerator, ckpt, step)`` until it returns (the host
  copy; the upload runs in the background with the manager's default ``async_save``);
  ``streamio save durable``: until ``ckpt.wait()`` returns (committed, pointer written).
* ``accelerate save + put``: ``accelerator.save_state(dir)`` then ``s3fs.put(dir, s3://...)``: the
  loop is blocked for all of it (``accelerate save_state (local)`` is its first part alone).
* ``streamio load``: ``load_state(accelerator, ckpt)`` (every part's CRC32C verified);
  ``get + accelerate load``: ``s3fs.get`` of the newest directory, then ``accelerator.load_state``.

Run:  .venv/bin/python -m benchmarks.bench_accelerate --size-mb 96 --reps 3 [--json out.json]
moto caveats (docs/design.md "Measured behaviour"): uploads ~0.13-0.20 GB/s whatever the concurrency.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import MB, S3Servers, clean_aws_env, interleave, machine, print_runs, ratio, summary

WIDTH = 1024
ROWS = ("streamio save blocked", "streamio save durable", "accelerate save + put", "accelerate save_state (local)",
        "streamio load", "get + accelerate load")


def training_state(size_mb: float) -> tuple[Any, Any, Any, Any]:
    """An Accelerator with an MLP, Adam (after one step: both moments exist) and a scheduler, prepared."""
    from accelerate import Accelerator

    layers = max(1, round(size_mb * MB / 3 / 4 / (WIDTH * WIDTH + WIDTH)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    accelerator = Accelerator(cpu=True)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    model(torch.randn(4, WIDTH)).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
    return accelerator, model, optimizer, scheduler


def contenders(accelerator: Any, ckpt: Any, fs: Any, remote: str, scratch: Path,
               durable: list[float]) -> dict[str, Callable[[], float]]:
    """name -> one timed run; the streamio save records its durable time in ``durable``."""
    from streamio.accelerate import load_state, save_state

    steps = itertools.count(1)
    uploaded: list[str] = []
    weight = next(iter(accelerator._models[0].parameters()))
    expected = weight.detach().clone()

    def check(what: str) -> None:
        if not torch.equal(weight.detach(), expected):
            raise RuntimeError(f"{what} loaded other weights")

    def streamio_save() -> float:
        t0 = time.perf_counter()
        save_state(accelerator, ckpt, next(steps))
        blocked = time.perf_counter() - t0
        ckpt.wait()
        durable.append(time.perf_counter() - t0)
        return blocked

    def local_save(step: int) -> Path:
        out = scratch / f"local-{step}"
        accelerator.save_state(str(out))
        return out

    def save_and_put() -> float:
        step = next(steps)
        t0 = time.perf_counter()
        local = local_save(step)
        fs.put(str(local), f"{remote}/step-{step}", recursive=True)
        seconds = time.perf_counter() - t0
        uploaded.append(f"{remote}/step-{step}")
        shutil.rmtree(local)
        return seconds

    def local_only() -> float:
        step = next(steps)
        t0 = time.perf_counter()
        local = local_save(step)
        seconds = time.perf_counter() - t0
        shutil.rmtree(local)
        return seconds

    def streamio_load() -> float:
        with torch.no_grad():
            weight.zero_()
        t0 = time.perf_counter()
        load_state(accelerator, ckpt)
        seconds = time.perf_counter() - t0
        check("streamio load")
        return seconds

    def get_and_load() -> float:
        with torch.no_grad():
            weight.zero_()
        local = scratch / "download"
        t0 = time.perf_counter()
        fs.get(uploaded[-1], str(local), recursive=True)
        accelerator.load_state(str(local))
        seconds = time.perf_counter() - t0
        shutil.rmtree(local)
        check("get + accelerate load")
        return seconds

    return {"streamio save blocked": streamio_save, "accelerate save + put": save_and_put,
            "accelerate save_state (local)": local_only, "streamio load": streamio_load,
            "get + accelerate load": get_and_load}


def run(size_mb: float, reps: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Both ways against one moto server; seconds per contender, and the ratios streamio / Accelerate."""
    import s3fs

    from streamio import CheckpointManager, KeepLast
    from streamio.testing import S3Endpoint

    accelerator, *_ = training_state(size_mb)
    size = sum(t.numel() * t.element_size() for t in accelerator._models[0].state_dict().values()) * 3
    clean_aws_env()
    servers = S3Servers(proxies=1, latency=0.0).start()
    scratch = Path(tempfile.mkdtemp(prefix="bench-accelerate-"))
    try:
        s3 = S3Endpoint(servers.moto, servers.s3.bucket)
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.storage_options())
        durable: list[float] = []
        with CheckpointManager(s3.url("streamio"), storage_options=s3.storage_options(),
                               retention=KeepLast(2)) as ckpt:
            timed = contenders(accelerator, ckpt, fs, f"{s3.bucket}/accelerate", scratch, durable)
            interleave(timed, 1, log=lambda line: log(f"warm-up {line}"))
            durable.clear()
            runs = interleave(timed, reps, log=log)
        runs["streamio save durable"] = durable
    finally:
        servers.stop()
        clean_aws_env()
        shutil.rmtree(scratch, ignore_errors=True)
    stats = {name: summary(values) for name, values in runs.items()}

    def over(a: str, b: str) -> float:
        return ratio(stats[a]["median"], stats[b]["median"])

    ratios = {
        "save blocked: streamio / accelerate save + put": over("streamio save blocked", "accelerate save + put"),
        "save durable: streamio / accelerate save + put": over("streamio save durable", "accelerate save + put"),
        "load: streamio / get + accelerate load": over("streamio load", "get + accelerate load"),
    }
    return {"machine": machine(), "size_bytes": size, "reps": reps, "layers": len(accelerator._models[0]),
            "width": WIDTH, "runs_s": runs, "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--size-mb", type=float, default=96, help="checkpoint size: parameters + Adam's two moments")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the results here (else print them)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    result = run(args.size_mb, args.reps)
    print_runs(result, args.json, ROWS)


if __name__ == "__main__":
    main()
