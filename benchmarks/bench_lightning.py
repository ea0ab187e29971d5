"""Lightning checkpoints to S3: ``streamio.lightning.CheckpointIO`` vs Lightning's ``TorchCheckpointIO`` (issue 35).

One process, one checkpoint dict, both plugins on the same S3 bucket (moto in a child process, no
proxy latency). The dict is what Lightning itself builds: a real ``Trainer`` fits an MLP of
``--size-mb``/3 MB float32 parameters with Adam for one step, then its checkpoint connector dumps
the checkpoint (``state_dict``, ``optimizer_states`` with both moments, ``loops``, ``callbacks``,
hyperparameters), exactly what ``Strategy.save_checkpoint`` hands a plugin on rank 0.

Contenders, interleaved, one untimed warm-up each, medians of ``--reps``:

* ``streamio save`` / ``torch save``: ``save_checkpoint(ckpt, ".../last.ckpt")``, the same path
  each time (what ``save_last`` does), timed until the call returns: the training loop is blocked
  for all of it. ``TorchCheckpointIO`` goes through fsspec (s3fs) as Lightning does, its endpoint
  from the environment; streamio's from ``CheckpointIO(storage_options=...)``.
* ``... async blocked`` / ``... async durable``: the same plugin wrapped in Lightning's
  ``AsyncCheckpointIO``: blocked = the call (Lightning clones every tensor on the caller's thread),
  durable = until its writer thread has finished (``teardown``).
* ``streamio load`` / ``torch load``: ``load_checkpoint(path)`` of that checkpoint, what
  ``fit(ckpt_path=...)`` calls on every rank (streamio verifies every part's CRC32C).

Run:  .venv/bin/python -m benchmarks.bench_lightning --size-mb 96 --reps 3 [--json out.json]
moto caveats (docs/design.md "Measured behaviour"): uploads ~0.13-0.20 GB/s whatever the concurrency.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import MB, S3Servers, clean_aws_env, interleave, machine, print_runs, ratio, summary

WIDTH = 1024
SAVES = ("streamio save", "torch save", "streamio async blocked", "torch async blocked",
         "streamio async durable", "torch async durable")


def lightning_checkpoint(size_mb: float) -> dict[str, Any]:
    """The checkpoint dict a real Lightning ``Trainer`` hands its plugin after one Adam step."""
    import lightning as L

    layers = max(1, round(size_mb * MB / 3 / 4 / (WIDTH * WIDTH + WIDTH)))

    class Mlp(L.LightningModule):
        def __init__(self, layers: int, lr: float = 1e-4) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)

    torch.manual_seed(0)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(Mlp(layers), torch.utils.data.DataLoader(torch.randn(4, WIDTH), batch_size=4))
    return dict(trainer._checkpoint_connector.dump_checkpoint())


def tensor_bytes(state: Any) -> int:
    """Bytes of every tensor in a nested checkpoint dict."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


def _timed(call: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def contenders(plugins: dict[str, Any], paths: dict[str, str], ckpt: dict[str, Any],
               durable: dict[str, list[float]]) -> dict[str, Callable[[], float]]:
    """name -> one timed run; async saves record their durable time in ``durable`` as a side effect."""
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    steps = itertools.count(ckpt["global_step"])

    def next_step() -> dict[str, Any]:  # each save a later step to the same path, as save_last does in training
        return {**ckpt, "global_step": next(steps)}

    def save(name: str) -> Callable[[], float]:
        def run() -> float:
            state = next_step()
            return _timed(lambda: plugins[name].save_checkpoint(state, paths[name]))
        return run

    def save_async(name: str) -> Callable[[], float]:
        def run() -> float:
            wrapped, state = AsyncCheckpointIO(plugins[name]), next_step()
            t0 = time.perf_counter()
            wrapped.save_checkpoint(state, paths[name])
            blocked = time.perf_counter() - t0
            wrapped.teardown()  # waits for the writer thread; raises what the save raised
            durable[f"{name} async durable"].append(time.perf_counter() - t0)
            return blocked
        return run

    def load(name: str) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            loaded = plugins[name].load_checkpoint(paths[name])
            seconds = time.perf_counter() - t0
            if not isinstance(loaded["global_step"], int) or not torch.equal(
                    loaded["state_dict"]["net.0.weight"], ckpt["state_dict"]["net.0.weight"]):
                raise RuntimeError(f"{name} loaded another checkpoint from {paths[name]}")
            return seconds
        return run

    out: dict[str, Callable[[], float]] = {}
    for name in ("streamio", "torch"):
        out[f"{name} save"] = save(name)
        out[f"{name} async blocked"] = save_async(name)
        out[f"{name} load"] = load(name)
    return out


def run(size_mb: float, reps: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Both plugins against one moto server; seconds per contender, and the ratios streamio / torch."""
    from lightning.fabric.plugins import TorchCheckpointIO

    from streamio.lightning import CheckpointIO
    from streamio.testing import S3Endpoint

    ckpt = lightning_checkpoint(size_mb)
    clean_aws_env()
    servers = S3Servers(proxies=1, latency=0.0).start()
    try:
        s3 = S3Endpoint(servers.moto, servers.s3.bucket)
        os.environ.update(s3.env())  # what Lightning's fsspec calls read (TorchCheckpointIO takes no options)
        plugins = {"streamio": CheckpointIO(storage_options=s3.storage_options()), "torch": TorchCheckpointIO()}
        paths = {name: s3.url(f"run-{name}/ckpt/last.ckpt") for name in plugins}
        durable: dict[str, list[float]] = {f"{n} async durable": [] for n in plugins}
        timed = contenders(plugins, paths, ckpt, durable)
        interleave(timed, 1, log=lambda line: log(f"warm-up {line}"))
        for values in durable.values():
            values.clear()
        runs = interleave(timed, reps, log=log)
        runs.update(durable)
    finally:
        servers.stop()
        clean_aws_env()
    stats = {name: summary(values) for name, values in runs.items()}

    def over(a: str, b: str) -> float:
        return ratio(stats[a]["median"], stats[b]["median"])

    ratios = {
        "save blocked: streamio / TorchCheckpointIO": over("streamio save", "torch save"),
        "load: streamio / TorchCheckpointIO": over("streamio load", "torch load"),
        "async blocked: streamio / TorchCheckpointIO": over("streamio async blocked", "torch async blocked"),
        "async durable: streamio / TorchCheckpointIO": over("streamio async durable", "torch async durable"),
        "streamio: async blocked / sync save": over("streamio async blocked", "streamio save"),
    }
    return {"machine": machine(), "size_bytes": tensor_bytes(ckpt), "reps": reps,
            "layers": len(ckpt["state_dict"]) // 2, "width": WIDTH, "runs_s": runs, "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--size-mb", type=float, default=96, help="checkpoint size: parameters + Adam's two moments")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None, help="write the results here (else print them)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("lightning").setLevel(logging.WARNING)
    result = run(args.size_mb, args.reps)
    print_runs(result, args.json)


if __name__ == "__main__":
    main()
