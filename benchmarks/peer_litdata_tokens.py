"""litdata's ``TokensLoader`` as the peer of ``benchmarks/bench_tokens.py``; runs in ITS OWN environment.

``.venv-peers/litdata`` (see :mod:`benchmarks.peer_env` and ``benchmarks/peer_litdata.py`` for why
litdata cannot share streamio's). Imports neither streamio nor the rest of ``benchmarks``: numpy,
torch and litdata only.

* ``convert SRC OUT``: the documents of ``SRC/tokens.npy`` + ``SRC/lengths.npy``, each followed by
  the EOS token 0 (what streamio's ``Pack(eos=0)`` inserts at read time), written by
  ``litdata.optimize(..., item_loader=TokensLoader())`` in chunks of ``2049 * 1024`` tokens, in order.
* ``read OUT [--stop N]``: ``StreamingDataset(OUT, item_loader=TokensLoader(block_size=2049),
  shuffle=False)`` + ``StreamingDataLoader(batch_size=8, num_workers=2)``, one epoch (or ``N``
  tokens); prints ``{"tokens", "wall_s", "state_bytes"}`` (the loader's ``state_dict()`` as JSON).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

BLOCK, BATCH, WORKERS, EOS = 2049, 8, 2, 0


def _documents(src: str) -> Any:
    import numpy as np
    import torch

    tokens, lengths = np.load(f"{src}/tokens.npy"), np.load(f"{src}/lengths.npy")
    start = 0
    for n in lengths.tolist():
        doc = np.append(tokens[start : start + n].astype(np.int32), EOS)  # int32: a dtype litdata serializes
        start += n
        yield torch.from_numpy(doc)


def _one(src: str) -> Any:
    yield from _documents(src)


def convert(src: str, out: str) -> dict[str, Any]:
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    optimize(fn=_one, inputs=[src], output_dir=out, chunk_size=BLOCK * 1024, item_loader=TokensLoader(),
             num_workers=1, mode="overwrite", verbose=False)
    return {}


def read(out: str, stop: int | None) -> dict[str, Any]:
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    ds = StreamingDataset(out, item_loader=TokensLoader(block_size=BLOCK), shuffle=False)
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    tokens, t0 = 0, time.perf_counter()
    for batch in loader:
        tokens += batch.numel()
        if stop is not None and tokens >= stop:
            break
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "state_bytes": len(json.dumps(loader.state_dict(), default=str))}


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "convert":
        print(json.dumps(convert(path, sys.argv[3])))
    else:
        print(json.dumps(read(path, int(sys.argv[4]) if "--stop" in sys.argv else None)))
