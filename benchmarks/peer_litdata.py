"""litdata as a peer in the loop benchmark; runs in ITS OWN virtual environment.

litdata 0.2.76 cannot share streamio's environment (it needs a newer botocore than s3fs/aiobotocore
allow, and imports torchvision, whose PyPI build does not load beside the CPU torch 2.13.0:
docs/design.md), so :mod:`benchmarks.peer_env` builds ``.venv-peers/litdata`` from
``benchmarks/peers/litdata.txt`` and this file runs there. It imports neither streamio nor the rest
of ``benchmarks`` (not installed there), only the stdlib-only ``benchmarks.loop`` (the rank pool
puts the repository on ``PYTHONPATH``), numpy and ``litdata``.

Modes:

* ``convert SRC OUT --chunk-bytes BYTES``: the same samples as streamio's shards in ``SRC`` (tar
  members ``KEY.bin``), in the same order, written by ``litdata.optimize`` as litdata chunks of
  about ``BYTES`` each in ``OUT`` (columns ``__key__: str``, ``bin``: a uint8 numpy array; not
  ``bytes``, which litdata's default collate does not batch as one buffer per sample; no
  compression, like the tar shards), for the driver to upload to the same moto bucket.
* ``--rank-server``: one rank of a trial, the protocol of ``bench_dataset.RankPool`` (a JSON
  config per stdin line, a ``RESULT {json}`` line back): ``StreamingDataset("s3://bucket/prefix",
  cache_dir=...)`` + its ``StreamingDataLoader`` (default collate: each batch's blobs stacked into
  one uint8 tensor), the same loop, compute and timing as the other contenders; the driver starts
  fresh rank processes for each trial. litdata reads the rank from ``GLOBAL_RANK`` (not ``RANK``),
  which the driver sets. S3: ``storage_options`` go to its boto3 client (``endpoint_url`` = the
  same 30 ms latency proxy); chunk downloads go through obstore (Rust), whose store litdata
  builds from that client's endpoint with fixed client options (``_OBSTORE_CLIENT_OPTIONS``,
  which also override ``AWS_ALLOW_HTTP`` from the environment) and no way to pass
  ``allow_http``: without it every GET of the ``http://`` loopback endpoint fails ("builder
  error: BadScheme"). :func:`allow_http` adds it to that dict (the only change to litdata; a real
  S3 endpoint is ``https://`` and needs none).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def _samples(shard: str) -> Any:
    """One tar shard's samples for ``optimize``: blobs as uint8 arrays (litdata collates bytes per byte)."""
    import numpy as np

    from benchmarks.loop import tar_blobs

    for key, blob in tar_blobs(shard):
        yield {"__key__": key, "bin": np.frombuffer(blob, dtype=np.uint8)}


def convert(src: str, out: str, chunk_bytes: int) -> dict[str, Any]:
    """Write ``src``'s tar shards as litdata chunks in ``out``; the sample count and file names."""
    from litdata import optimize

    from benchmarks.loop import tar_shards

    # one worker, inputs in order: the samples keep streamio's order (no shuffling in the benchmark)
    optimize(fn=_samples, inputs=tar_shards(src), output_dir=out, chunk_bytes=chunk_bytes, num_workers=1,
             reorder_files=False, mode="overwrite", verbose=False)
    index = json.loads(Path(out, "index.json").read_text())
    n = sum(c["chunk_size"] for c in index["chunks"])
    return {"samples": n, "files": sorted(p.name for p in Path(out).iterdir())}


def allow_http() -> None:
    """Let litdata's obstore client reach a plain ``http://`` endpoint (see the module docstring)."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]


def rank_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank's trial: build the dataset and loader (timed as ``init_s``), then the timed epoch."""
    from litdata import StreamingDataLoader, StreamingDataset

    from benchmarks.loop import timed_epoch  # stdlib only; the rank pool puts the repository on PYTHONPATH

    if cfg["options"]["endpoint_url"].startswith("http://"):
        allow_http()  # before the dataset: the DataLoader workers it forks build their stores from it
    t0 = time.perf_counter()
    ds = StreamingDataset(cfg["remote"], cache_dir=cfg["cache"], storage_options=cfg["options"],
                          max_cache_size=cfg["cache_bytes"])
    loader = StreamingDataLoader(ds, batch_size=cfg["batch_size"], num_workers=cfg["workers"])
    init = time.perf_counter() - t0
    epoch = timed_epoch(loader, cfg["compute_s"])
    return {"rank": int(os.environ["RANK"]), "epochs": [{**epoch, "init_s": init}]}


def _imports() -> None:
    import obstore  # noqa: F401 - litdata's chunk reader, imported lazily by it
    from litdata import StreamingDataLoader, StreamingDataset  # noqa: F401


if __name__ == "__main__":
    from benchmarks.loop import peer_main

    peer_main(__doc__.splitlines()[0] if __doc__ else "", convert, rank_main, _imports)
