"""A pre-tokenized LLM token stream: documents packed into fixed-length blocks at read time, from a mixture.

What it shows:

* Writing pre-tokenized text as one sample per document (a ``uint16`` ``.npy`` member of its token
  ids) with ``streamio.write_dataset``, which records each document's token count in the index.
* Packing at read time: ``StreamingDataset(..., pack=streamio.Pack(seq_len=BLOCK, eos=EOT,
  targets=True))`` concatenates the documents with an end-of-text token and cuts them into blocks
  of ``BLOCK + 1`` tokens (inputs and next-token targets in one), so changing ``BLOCK`` never
  re-shards, and no padding is stored. Each block also says where its documents start
  (``doc_ids``), for intra-document attention masks.
* Training a tiny causal language model on the stream, checkpointing the model, optimizer and the
  loader's exact position (one int: the blocks consumed). Run again with more ``--steps`` and it
  resumes at the next token, also with another number of workers or ranks.
* A weighted mixture of sources (:data:`SOURCES`, :func:`open_stream`): each source is its own
  dataset (its own prefix, bucket or store), and ``streamio.Stream(url, weight=...)`` per source
  in a list makes ``StreamingDataset`` draw each epoch's *tokens* in those shares, interleaved.

Run it (CPU, ~20 s; ``--small``: a few seconds), against a local S3:

    python -m streamio.testing s3 --bucket examples --env-file s3.env &
    until [ -s s3.env ] || ! kill -0 $! 2>/dev/null; do sleep 0.2; done; source s3.env
    python examples/llm_tokens.py --steps 40
    python examples/llm_tokens.py --steps 80        # resumed at step 40

``--url`` takes any bucket prefix or a local directory. Real data: replace :func:`documents` with
your tokenizer's output (ids below 65536 fit ``uint16``; use ``uint32`` above).
"""

from __future__ import annotations

import argparse
import collections
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

import streamio

VOCAB = 256
EOT = 0  # end-of-text token between documents
BLOCK = 64  # tokens a model sees per sample; a packed block holds BLOCK + 1 (targets are shifted by one)


@dataclass(frozen=True)
class Source:
    """One tokenized corpus: a name, its dataset URL (under ``--url``) and its share of a mixture."""

    name: str
    weight: float
    seed: int


SOURCES = [Source("web", weight=0.75, seed=1), Source("code", weight=0.25, seed=2)]


# --------------------------------------------------------------------------- writing the token data
def documents(seed: int, count: int) -> Iterator[np.ndarray]:
    """Stand-in for a tokenizer's output: ``count`` documents from a random bigram model."""
    rng = np.random.default_rng(seed)
    nxt = rng.integers(1, VOCAB, size=(VOCAB, 4))  # each token is followed by one of 4 others
    for _ in range(count):
        doc = [int(rng.integers(1, VOCAB))]
        for _ in range(int(rng.integers(20, 400))):
            doc.append(int(nxt[doc[-1], rng.integers(0, 4)]))
        yield np.asarray(doc, dtype=np.uint16)


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def write_source(url: str, source: Source, docs: int) -> None:
    """Write one source's documents as a dataset at ``url`` (skipped when it is already there)."""
    if streamio.Store(url).exists("index.json"):
        return
    samples = ({"__key__": f"{i:09d}", "tokens.npy": npy(d)} for i, d in enumerate(documents(source.seed, docs)))
    index = streamio.write_dataset(samples, url, spec=streamio.ShardSpec(max_count=512))
    tokens = sum(sum(c) + len(c) for c in index.token_counts("tokens.npy"))  # each document and its EOT
    print(f"wrote {source.name}: {tokens // BLOCK} blocks of {BLOCK + 1} tokens ({index.samples} documents, "
          f"packed at read time) to {url}", flush=True)


# --------------------------------------------------------------------------- reading it
def to_example(sample: dict[str, Any]) -> dict[str, Any]:
    """A packed block (``BLOCK + 1`` tokens) as inputs and next-token targets; padding is not a target."""
    tokens = torch.from_numpy(sample["tokens"])
    target = tokens[1:].clone()
    target[torch.from_numpy(sample["doc_ids"][1:]) < 0] = -100  # cross_entropy's ignore_index
    return {"input": tokens[:-1], "target": target, "source": sample["__source__"]}  # index in SOURCES


def open_stream(base_url: str, sources: list[Source], batch_size: int) -> streamio.StreamingDataset:
    """The training stream: every epoch draws from each source in proportion to its weight
    (``streamio.Stream(url, samples=N)`` states a count instead; a source smaller than its share
    is repeated), interleaved and shuffled."""
    streams = [streamio.Stream(f"{base_url}/{s.name}", weight=s.weight) for s in sources]
    pack = streamio.Pack(seq_len=BLOCK, member="tokens.npy", eos=EOT, targets=True)
    return streamio.StreamingDataset(streams, batch_size=batch_size, pack=pack, transform=to_example, seed=0)


class TinyLM(nn.Module):
    """Embedding -> GRU -> logits: enough to learn the bigram structure of :func:`documents`."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.rnn = nn.GRU(64, 64, batch_first=True)
        self.head = nn.Linear(64, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="s3://examples/llm-tokens", help="token data and checkpoints go under it")
    p.add_argument("--steps", type=int, default=40, help="train until this global step")
    p.add_argument("--small", action="store_true", help="fewer documents (CI)")
    p.add_argument("--ckpt-every", type=int, default=10)
    args = p.parse_args()

    for source in SOURCES:
        write_source(f"{args.url}/{source.name}", source, docs=150 if args.small else 1500)
    ds = open_stream(args.url, SOURCES, batch_size=16)
    loader = streamio.StreamingDataLoader(ds, num_workers=1)  # packing is cheap: one worker keeps up
    torch.manual_seed(0)
    model = TinyLM()
    optim = torch.optim.Adam(model.parameters(), lr=3e-3)
    state = {"model": model, "optim": optim, "data": loader, "rng": streamio.RNGState(seed=0)}
    ckpt = streamio.CheckpointManager(f"{args.url}/ckpt", retention=streamio.KeepLast(2))
    try:
        step = ckpt.restore(state)
        print(f"resumed at step {step} (epoch {ds.epoch})", flush=True)
    except streamio.errors.CheckpointNotFoundError:
        step = 0
        print("no checkpoint yet: starting at step 0", flush=True)

    epoch, tokens, start = ds.epoch, 0, time.perf_counter()
    blocks_from: collections.Counter[int] = collections.Counter()  # blocks this run drew from each source
    while step < args.steps:
        ds.set_epoch(epoch)
        for batch in loader:
            logits = model(batch["input"])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["target"].reshape(-1))
            optim.zero_grad()
            loss.backward()
            optim.step()
            step += 1
            tokens += batch["input"].numel()
            blocks_from.update(batch["source"].tolist())
            if step % args.ckpt_every == 0 or step == args.steps:
                ckpt.save(step, state)
                print(f"step {step} epoch {epoch} loss {loss.item():.3f} (checkpoint)", flush=True)
            if step == args.steps:
                break
        else:
            epoch += 1
    ckpt.close()
    drawn = sum(blocks_from.values()) or 1
    shares = ", ".join(f"{s.name} {blocks_from[i] / drawn:.0%}" for i, s in enumerate(SOURCES))
    print(f"finished at step {step}: {tokens / (time.perf_counter() - start):,.0f} tokens/s; blocks drawn: {shares}",
          flush=True)


if __name__ == "__main__":
    main()
