"""One rank of test_dataset_open_once.py (run by torchrun): open datasets, read through 2 workers.

    torchrun --nproc-per-node W tests/support/open_once_worker.py OUT_DIR

The environment gives ``OPEN_ONCE_OPTIONS`` (JSON: the store's options, the proxy's endpoint),
``OPEN_ONCE_PLAIN`` (a dataset URL) and ``OPEN_ONCE_MIX`` (JSON ``[[url, weight], ...]``). Each
rank reads the whole epoch of the plain dataset and ``MIX_BATCHES`` batches of the mixture, each
through a StreamingDataLoader with ``WORKERS`` workers, and writes ``OUT_DIR/rank-N.json`` with the
keys it got, batch by batch. Then the error paths: every rank opens a prefix without an index
(rank 0's error, raised on every rank), and ranks 0-2 open a dataset rank 3 never opens (with
``collective_timeout_s=2``: they give up, naming the timeout).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.data.mixing import Stream
from streamio.data.options import DatasetOptions
from streamio.distributed import leave
from streamio.errors import StreamioError

BATCH = 4
WORKERS = 2
MIX_BATCHES = 3


def keys(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


def read(ds: StreamingDataset, stop: int | None = None) -> list[list[str]]:
    """The batches a StreamingDataLoader with WORKERS workers yields (the first ``stop`` of them)."""
    out: list[list[str]] = []
    for batch in StreamingDataLoader(ds, num_workers=WORKERS, collate_fn=keys):
        out.append(batch)
        if stop is not None and len(out) == stop:
            break
    return out


def plain(url: str, options: dict[str, Any]) -> StreamingDataset:
    return StreamingDataset(url, batch_size=BATCH, storage_options=options, options=DatasetOptions(policy="drop"))


def mixture(sources: list[list[Any]], options: dict[str, Any]) -> StreamingDataset:
    streams = [Stream(url, weight=weight, storage_options=options) for url, weight in sources]
    return StreamingDataset(streams, batch_size=BATCH, options=DatasetOptions(policy="drop", epoch_samples=80))


def error_of(fn: Any) -> dict[str, str] | None:
    """The streamio error ``fn()`` raised, as ``{"type", "message"}``; None if it returned."""
    try:
        fn()
    except StreamioError as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def main(out_dir: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    options = json.loads(os.environ["OPEN_ONCE_OPTIONS"])
    plain_url = os.environ["OPEN_ONCE_PLAIN"]
    result: dict[str, Any] = {
        "plain": read(plain(plain_url, options)),
        "mix": read(mixture(json.loads(os.environ["OPEN_ONCE_MIX"]), options), MIX_BATCHES),
        "missing": error_of(lambda: plain(os.environ["OPEN_ONCE_MISSING"], options)),
    }
    if rank != 3:  # last: the ranks that gave up have made a group rank 3 never made
        short = DatasetOptions(policy="drop", collective_timeout_s=2)
        result["alone"] = error_of(lambda: StreamingDataset(plain_url, storage_options=options, options=short))
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    leave(0)


if __name__ == "__main__":
    main(sys.argv[1])
