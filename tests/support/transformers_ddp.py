"""A ``StreamioTrainer`` run (2 gloo ranks under torchrun, or one process) on a tiny GPT-2 from a config.

``python -m torch.distributed.run --nproc_per_node 2 transformers_ddp.py DATASET ROOT OUT MAX_STEPS KILL_AT RESUME``:
trains over the token dataset DATASET (:func:`write_tokens`) with batches of 2, saving to ROOT every
4 steps, logging every step. ``KILL_AT`` > 0: after that step rank 0 waits for the save in flight,
then sends SIGKILL to the whole process group. ``RESUME`` = 1: ``train(resume_from_checkpoint=True)``.
Every rank writes ``OUT.rank<r>`` as JSON: the keys of each batch its loader handed out, how many
samples its dataset produced, the step it resumed from; rank 0 also the per-step losses of the log
history and the final weights (floats as ``float.hex``: equality is bit equality). The model keeps
GPT-2's dropout, so the RNG streams of every rank must be restored for the losses to match. With
``SIGTERM_AT`` in the environment the trainer gets ``preemption=streamio.Preemption()``, and rank 1
alone sends itself SIGTERM after step ``SIGTERM_AT`` (> 0).
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

from streamio import Preemption, StreamingDataset
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.transformers import StreamioTrainer

SEQ = 8
VOCAB = 64


def tokens(i: int) -> np.ndarray:
    return np.array([(i * 7 + j * 3) % VOCAB for j in range(SEQ)], dtype=np.int64)


def write_tokens(url: str, storage_options: dict[str, Any] | None, n: int, per_shard: int = 5) -> list[str]:
    """``n`` token sequences of ``SEQ`` tokens as ``.npy`` members, ``per_shard`` to a shard; their keys."""
    def npy(a: np.ndarray) -> bytes:
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()
    keys = [f"seq{i:05d}" for i in range(n)]
    write_dataset(({"__key__": k, "npy": npy(tokens(i))} for i, k in enumerate(keys)), url, storage_options,
                  spec=ShardSpec(max_count=per_shard))
    return keys


class Counter:
    """The dataset's transform: counts the samples this process's dataset produced."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        ids = torch.from_numpy(sample["npy"])
        return {"__key__": sample["__key__"], "input_ids": ids, "labels": ids}


class Collate:
    """Stacks a batch and records its keys (the batches this rank's loader handed out)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        self.batches.append([s["__key__"] for s in samples])
        return {k: torch.stack([s[k] for s in samples]) for k in ("input_ids", "labels")}


class KillAt(TrainerCallback):
    def __init__(self, step: int, trainer_ref: list[Any]) -> None:
        self.step, self.trainer_ref = step, trainer_ref

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.step:
            self.trainer_ref[0].checkpoints.wait()  # the save before the kill is committed
            if state.is_world_process_zero:
                os.killpg(os.getpgid(0), signal.SIGKILL)


class SigtermAt(TrainerCallback):
    """Rank 1 alone gets SIGTERM after ``step``: one rank's process only, as ``kill <pid>`` does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.step and args.process_index == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    dataset, root, out, max_steps, kill_at, resume = sys.argv[1:7]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config)
    counter, collate = Counter(), Collate()
    args = TrainingArguments(
        output_dir=f"{out}.output_dir", per_device_train_batch_size=2, max_steps=int(max_steps), save_steps=4,
        save_total_limit=2, logging_steps=1, learning_rate=1e-2, report_to="none", use_cpu=True,
        remove_unused_columns=False, disable_tqdm=True, seed=0,
        ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
    )
    ref: list[Any] = []
    callbacks: list[TrainerCallback] = [KillAt(int(kill_at), ref)] if int(kill_at) else []
    sigterm_at = int(os.environ.get("SIGTERM_AT", "0"))
    callbacks += [SigtermAt(sigterm_at)] if sigterm_at else []
    trainer = StreamioTrainer(
        model=model, args=args, data_collator=collate, checkpoint_root=root,
        train_dataset=StreamingDataset(dataset, batch_size=2, seed=3, decode="auto", transform=counter),
        callbacks=callbacks or None, preemption=Preemption() if "SIGTERM_AT" in os.environ else None,
    )
    ref.append(trainer)
    trainer.train(resume_from_checkpoint=resume == "1")
    rank = trainer.args.process_index
    result: dict[str, Any] = {"batches": collate.batches, "fetched": counter.n,
                              "restored": trainer.resumed_step}
    if rank == 0:
        result["losses"] = {str(e["step"]): float(e["loss"]).hex() for e in trainer.state.log_history if "loss" in e}
        result["weights"] = {k: [float(v).hex() for v in t.flatten().tolist()] for k, t in model.state_dict().items()}
        result["global_step"] = trainer.state.global_step
    with open(f"{out}.rank{rank}", "w") as f:
        json.dump(result, f)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
