"""The transformers Trainer resuming at step N: ``StreamioTrainer`` vs the stock Trainer's replay (issue 36).

One process, a GPT-2 built from a config (``--embd`` wide, 2 layers, sequences of 16 tokens,
batches of 2), one token dataset in moto S3 (``StreamingDataset``, big enough that every N lies in
the first epoch). Three trainers train to the largest N once, saving at every N:

* ``streamio``: ``StreamioTrainer`` with ``checkpoint_root`` on the same bucket;
* ``stock iterable``: ``transformers.Trainer`` over the same ``StreamingDataset`` (an
  ``IterableDataset``), saving ``checkpoint-N`` folders to a local ``output_dir``;
* ``stock map-style``: ``transformers.Trainer`` over the same samples held in memory as a list.

Then, after one untimed resume of each trainer, interleaved, ``--reps`` times for each N: a fresh
trainer (a new model) runs
``train(resume_from_checkpoint=...)`` to step N + 1, timed from the call to the end of that first
step. The stock Trainer replays the epoch's first N batches (``skip_first_batches``): over an
``IterableDataset`` it reads and collates them; over a map-style dataset it only iterates the
sampler's indices (cheap, but it needs every sample addressable in memory or on local disk).
``StreamioTrainer`` restores the loader's position and reads nothing before the next batch.

Blocked per save: the training loop's time inside ``_save_checkpoint`` (``StreamioTrainer``: the
host snapshot, its upload in the background; stock: model, optimizer, RNG and trainer state written
to local disk, synchronously).

Run:  .venv/bin/python -m benchmarks.bench_transformers --steps 50,200,800 --reps 3 [--json out.json]
moto caveats (docs/design.md "Measured behaviour"): every GET costs a round trip on loopback.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from benchmarks.common import S3Servers, clean_aws_env, interleave, machine, print_runs, ratio, summary

SEQ, VOCAB, BATCH = 16, 128, 2
KINDS = ("streamio", "stock iterable", "stock map-style")


def _npy(i: int) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.random.default_rng([5, i]).integers(0, VOCAB, SEQ, dtype=np.int64))
    return buf.getvalue()


def _inputs(sample: dict[str, Any]) -> dict[str, Any]:
    ids = torch.from_numpy(sample["npy"])
    return {"input_ids": ids, "labels": ids}


def _model(embd: int) -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=embd, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


class _Clock:
    """Trainer callbacks: the time the first step of a train() call ends, and save-at-these-steps."""

    def __init__(self, save_at: Sequence[int] = ()) -> None:
        from transformers import TrainerCallback

        clock = self

        class Callback(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if clock.first is None:
                    clock.first = time.perf_counter()
                if state.global_step in save_at:
                    control.should_save = True

        self.first: float | None = None
        self.callback = Callback()


class Bench:
    """The three trainers over one dataset and bucket (see the module docstring)."""

    def __init__(self, data_url: str, root: str, scratch: str, embd: int, samples: int) -> None:
        import streamio

        self.data_url, self.root, self.scratch, self.embd = data_url, root, scratch, embd
        self.samples = [_inputs({"npy": np.load(io.BytesIO(_npy(i)))}) for i in range(samples)]
        self.streaming = lambda: streamio.StreamingDataset(data_url, batch_size=BATCH, seed=1, decode="auto",
                                                           transform=_inputs)
        self.blocked: dict[str, list[float]] = {k: [] for k in KINDS}

    def trainer(self, kind: str, max_steps: int, clock: _Clock, *, saving: bool) -> Any:
        from transformers import Trainer, TrainingArguments

        from streamio.transformers import StreamioTrainer

        model = _model(self.embd)
        args = TrainingArguments(output_dir=os.path.join(self.scratch, kind.replace(" ", "-")), max_steps=max_steps,
                                 per_device_train_batch_size=BATCH, save_strategy="steps" if saving else "no",
                                 save_steps=10**9, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
                                 logging_strategy="no", remove_unused_columns=False)
        blocked = self.blocked[kind]
        base: Any = StreamioTrainer if kind == "streamio" else Trainer

        class Timed(base):  # type: ignore[misc, valid-type]
            def _save_checkpoint(self, *a: Any) -> None:
                t0 = time.perf_counter()
                super()._save_checkpoint(*a)
                blocked.append(time.perf_counter() - t0)

        kw: dict[str, Any] = {"checkpoint_root": self.root} if kind == "streamio" else {}
        data = self.samples if kind == "stock map-style" else self.streaming()
        return Timed(model=model, args=args, train_dataset=data, callbacks=[clock.callback], **kw)

    def prepare(self, steps: Sequence[int], log: Callable[[str], None]) -> None:
        for kind in KINDS:
            t0 = time.perf_counter()
            trainer = self.trainer(kind, max(steps), _Clock(save_at=steps), saving=True)
            trainer.train()
            if kind == "streamio":
                trainer.checkpoints.wait()
            log(f"trained {kind} to step {max(steps)} in {time.perf_counter() - t0:.1f} s")

    def resume(self, kind: str, step: int) -> Callable[[], float]:
        def run() -> float:
            clock = _Clock()
            trainer = self.trainer(kind, step + 1, clock, saving=False)
            point: Any = step if kind == "streamio" else os.path.join(trainer.args.output_dir, f"checkpoint-{step}")
            t0 = time.perf_counter()
            trainer.train(resume_from_checkpoint=point)
            if trainer.state.global_step != step + 1 or clock.first is None:
                raise RuntimeError(f"{kind} resumed at step {step} ended at {trainer.state.global_step}")
            return clock.first - t0
        return run


def run(steps: Sequence[int], reps: int, embd: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Resume times for each N and trainer, blocked time per save, and the ratios to streamio's."""
    from streamio.data.write.writer import ShardSpec, write_dataset
    from streamio.testing import S3Endpoint

    samples = BATCH * (max(steps) + 8)
    clean_aws_env()
    servers = S3Servers(proxies=1, latency=0.0).start()
    try:
        s3 = S3Endpoint(servers.moto, servers.s3.bucket)
        os.environ.update(s3.env())
        write_dataset(({"__key__": f"seq{i:06d}", "npy": _npy(i)} for i in range(samples)), s3.url("data"),
                      spec=ShardSpec(max_count=256))
        with tempfile.TemporaryDirectory() as scratch:
            bench = Bench(s3.url("data"), s3.url("ckpt"), scratch, embd, samples)
            bench.prepare(steps, log)
            timed = {f"{kind} at {n}": bench.resume(kind, n) for n in steps for kind in KINDS}
            warm = {k: f for k, f in timed.items() if k.endswith(f" at {min(steps)}")}
            interleave(warm, 1, log=lambda line: log(f"warm-up {line}"))  # first-use costs (imports, S3 clients)
            runs = interleave(timed, reps, log=log)
    finally:
        servers.stop()
        clean_aws_env()
    med = {k: summary(v)["median"] for k, v in runs.items()}
    ratios = {f"resume at {n}: {kind} / streamio": ratio(med[f"{kind} at {n}"], med[f"streamio at {n}"])
              for n in steps for kind in KINDS[1:]}
    ratios[f"streamio resume at {max(steps)} / at {min(steps)}"] = ratio(med[f"streamio at {max(steps)}"],
                                                                         med[f"streamio at {min(steps)}"])
    ratios[f"stock iterable resume at {max(steps)} / at {min(steps)}"] = ratio(
        med[f"stock iterable at {max(steps)}"], med[f"stock iterable at {min(steps)}"])
    blocked = {f"{kind} blocked per save": bench.blocked[kind] for kind in KINDS}
    ratios["blocked per save: streamio (S3) / stock iterable (local disk)"] = ratio(
        summary(blocked["streamio blocked per save"])["median"],
        summary(blocked["stock iterable blocked per save"])["median"])
    params = sum(p.numel() for p in _model(embd).parameters())
    return {"machine": machine(), "steps": list(steps), "reps": reps, "embd": embd, "params": params,
            "samples": samples, "runs_s": {**runs, **blocked}, "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--steps", default="50,200,800", help="the steps N to resume at")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--embd", type=int, default=64, help="GPT-2 width (2 layers)")
    ap.add_argument("--json", default=None, help="write the results here (else print them)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    for name in ("transformers", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run([int(s) for s in args.steps.split(",")], args.reps, args.embd)
    print_runs(result, args.json)


if __name__ == "__main__":
    main()
