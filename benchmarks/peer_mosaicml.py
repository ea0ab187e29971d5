"""mosaicml-streaming as a peer in the loop benchmark; runs in ITS OWN virtual environment.

mosaicml-streaming cannot share streamio's environment (it pins google-cloud-storage < 3.3 and
numpy < 2.2 against s3fs/gcsfs, and imports torchvision, whose PyPI build does not load beside the
CPU torch 2.13.0: docs/design.md), so :mod:`benchmarks.peer_env` builds ``.venv-peers/mosaicml``
from ``benchmarks/peers/mosaicml.txt`` and this file runs there. It imports neither streamio nor
the rest of ``benchmarks`` (not installed there), only the stdlib-only ``benchmarks.loop`` (the
rank pool puts the repository on ``PYTHONPATH``), torch and ``streaming``.

Modes:

* ``convert SRC OUT --chunk-bytes BYTES``: the same samples as streamio's shards in ``SRC`` (tar
  members ``KEY.bin``) written as an MDS dataset in ``OUT`` (columns ``key: str``, ``bin: bytes``,
  no compression, like the tar shards), for the driver to upload to the same moto bucket.
* ``--rank-server``: one rank of a trial, the protocol of ``bench_dataset.RankPool`` (a JSON
  config per stdin line, a ``RESULT {json}`` line back): ``StreamingDataset(remote=s3://...,
  local=cache dir)`` + a torch ``DataLoader``, the same loop, compute and timing as the other
  contenders; the driver starts fresh rank processes for each trial. S3 goes through boto3 to
  ``S3_ENDPOINT_URL`` (the same 30 ms latency proxy).

Stalls (measured, mosaicml-streaming 0.13.0). The local leader downloads ``index.json`` in its
main process while building the dataset, with the boto3 client of the stream's downloader; the
DataLoader's forked workers inherit that client, and with it the same pooled keep-alive
connection (one socket, seen in ``/proc``: the downloader drops its client when pickled, for
spawn, not when forked). Two workers downloading at once then share one TCP connection: one reads
the other's response (botocore's checksum catches it: ``FlexibleChecksumError``, retried) or
waits for bytes the other consumed, until botocore's read timeout, which mosaicml sets to its
``download_timeout`` (60 s) — the ~60 s stalls. A real S3 endpoint keeps connections alive as our
proxy does; moto alone closes every connection, so directly against moto no connection is pooled.
It is mosaicml's bug, not the harness's: the driver leaves out trials with a batch that waited
over :data:`STALL_S` and says why (``max_wait_s`` per rank).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

STALL_S = 30.0  # a single batch waiting this long is the stall above (half its 60 s timeout; trials take < 30 s)


def convert(src: str, out: str, chunk_bytes: int) -> dict[str, Any]:
    """Write ``src``'s tar shards as MDS shards of at most ``chunk_bytes`` in ``out``; the sample count and files."""
    from streaming import MDSWriter

    from benchmarks.loop import tar_blobs, tar_shards

    n = 0
    with MDSWriter(out=out, columns={"key": "str", "bin": "bytes"}, size_limit=chunk_bytes) as writer:
        for shard in tar_shards(src):
            for key, blob in tar_blobs(shard):
                writer.write({"key": key, "bin": blob})
                n += 1
    return {"samples": n, "files": sorted(p.name for p in Path(out).iterdir())}


def collate(batch: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Lists, as streamio's and webdataset's loaders give bytes (default_collate would split them)."""
    return {"__key__": [s["key"] for s in batch], "bin": [s["bin"] for s in batch]}


class MaxWait:
    """Iterates ``loader`` and remembers the longest single wait for a batch (``max_wait_s``), so that the
    driver can tell a stalled trial (see the module docstring) from a slow one."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.max_wait_s = 0.0

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.max_wait_s = max(self.max_wait_s, time.perf_counter() - t)
            yield batch


def rank_main(cfg: dict[str, Any]) -> dict[str, Any]:
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    from benchmarks.loop import timed_epoch  # stdlib only; the rank pool puts the repository on PYTHONPATH

    bs, nw = cfg["batch_size"], cfg["workers"]
    t0 = time.perf_counter()
    ds = StreamingDataset(remote=cfg["remote"], local=cfg["local"], batch_size=bs, shuffle=False)
    loader = MaxWait(DataLoader(ds, batch_size=bs, num_workers=nw, collate_fn=collate))
    init = time.perf_counter() - t0  # building the dataset (index download, shared memory) and its loader
    epoch = timed_epoch(loader, cfg["compute_s"])
    return {"rank": int(os.environ["RANK"]), "epochs": [{**epoch, "init_s": init, "max_wait_s": loader.max_wait_s}]}


def _imports() -> None:
    from streaming import StreamingDataset  # noqa: F401
    from torch.utils.data import DataLoader  # noqa: F401


if __name__ == "__main__":
    from benchmarks.loop import peer_main

    peer_main(__doc__.splitlines()[0] if __doc__ else "", convert, rank_main, _imports)
