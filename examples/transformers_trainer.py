"""The transformers ``Trainer`` reading a streamio dataset and checkpointing to S3, resumed without replay.

What it shows: ``StreamioTrainer`` in place of ``transformers.Trainer`` with a
``StreamingDataset`` and a ``checkpoint_root``; a run that stops at ``--steps``, and a second run
that continues from the newest checkpoint of the root at the exact next batch (the batches before
it are neither read nor replayed). The model is a tiny GPT-2 built from a config (nothing is
downloaded); the data are token sequences written with ``streamio.write_dataset`` on the first run.
docs/transformers.md is the guide.

Run it (CPU, a few seconds per run; ``pip install 'streamio-torch[transformers]'``), against a local S3:

    python -m streamio.testing s3 --bucket examples --env-file s3.env &
    until [ -s s3.env ] || ! kill -0 $! 2>/dev/null; do sleep 0.2; done; source s3.env
    python examples/transformers_trainer.py --steps 8      # from scratch
    python examples/transformers_trainer.py --steps 16     # resumed at step 8
    streamio ckpt ls s3://examples/transformers/ckpt

``--url`` takes any bucket prefix or a local directory.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import streamio
from streamio.errors import IndexNotFoundError
from streamio.transformers import StreamioTrainer

SEQ, VOCAB = 16, 128


def write_tokens(url: str, n: int = 256) -> None:
    """``n`` sequences of ``SEQ`` token ids as ``.npy`` members (what a tokenizer's output would be)."""
    def npy(i: int) -> bytes:
        buf = io.BytesIO()
        np.save(buf, np.random.default_rng([7, i]).integers(0, VOCAB, SEQ, dtype=np.int64))
        return buf.getvalue()
    streamio.write_dataset(({"__key__": f"seq{i:05d}", "npy": npy(i)} for i in range(n)), url,
                           spec=streamio.ShardSpec(max_count=64))


def as_inputs(sample: dict) -> dict:
    ids = torch.from_numpy(sample["npy"])
    return {"input_ids": ids, "labels": ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="s3://examples/transformers", help="where the data and checkpoints go")
    parser.add_argument("--steps", type=int, default=8, help="train up to this global step")
    args = parser.parse_args()
    data_url = f"{args.url}/data"
    try:
        streamio.load_index(data_url)
    except IndexNotFoundError:
        write_tokens(data_url)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    training = TrainingArguments(
        output_dir=os.path.join(tempfile.gettempdir(), "streamio-transformers-example"),  # logs only
        per_device_train_batch_size=8, max_steps=args.steps, save_steps=4, save_total_limit=2, logging_steps=4,
        learning_rate=3e-3, report_to="none", use_cpu=True, disable_tqdm=True,
    )
    trainer = StreamioTrainer(
        model=model, args=training, checkpoint_root=f"{args.url}/ckpt",  # storage_options=... if needed
        train_dataset=streamio.StreamingDataset(data_url, batch_size=8, decode="auto", transform=as_inputs),
    )
    trainer.train(resume_from_checkpoint=True)  # nothing there yet: starts from scratch
    step = trainer.resumed_step
    print("started from scratch" if step is None else f"resumed at step {step}, nothing replayed")
    print(f"checkpoints in {args.url}/ckpt: steps {trainer.checkpoints.steps()}")
    print(f"stopped at global step {trainer.state.global_step}")


if __name__ == "__main__":
    main()
