"""The timed training loop every data contender runs, the rank-process protocol around it, and the
command line and tar reading the peer scripts share (stdlib only, but for the boto3 a peer's rank
server warms up: peers import it from their own environments, see ``benchmarks/peer_mosaicml.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def timed_epoch(loader: Iterable[dict[str, Any]], compute_s: float, epoch: int = 0) -> dict[str, Any]:
    """Iterate ``loader`` once, sleeping ``compute_s`` per batch (simulated compute).

    Returns samples, wall time from ``iter(loader)`` to the last batch (worker start-up included),
    the time spent waiting in ``next()`` and the wait for the first batch.
    """
    samples, waited, first = 0, 0.0, None
    t0 = time.perf_counter()
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        dt = time.perf_counter() - t
        waited += dt
        first = dt if first is None else first
        samples += len(batch["__key__"])
        if compute_s:
            time.sleep(compute_s)
    wall = time.perf_counter() - t0
    return {"epoch": epoch, "samples": samples, "wall_s": wall, "wait_s": waited, "first_batch_s": first or 0.0}


def serve(run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """A rank process of ``bench_dataset.RankPool``: one JSON config per stdin line, answered by
    one ``RESULT {json}`` line (``{"error": traceback}`` when ``run`` raised)."""
    import json
    import sys
    import traceback

    for line in sys.stdin:
        try:
            res = run(json.loads(line))
        except Exception:  # noqa: BLE001 - reported to the driver, which raises
            res = {"error": traceback.format_exc()}
        print("RESULT " + json.dumps(res), flush=True)


# ----------------------------------------------------------------------------- the peers' own scripts
def tar_shards(src: str) -> list[str]:
    """The tar shards of a ``write_dataset`` directory, in index order (their names sort)."""
    from pathlib import Path

    return [str(p) for p in sorted(Path(src).glob("*.tar"))]


def tar_blobs(shard: str) -> Iterator[tuple[str, bytes]]:
    """``(key, blob)`` of every member ``KEY.bin`` of one tar shard, in order; any other member is an error."""
    import tarfile

    with tarfile.open(shard) as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.partition(".")
            f = tar.extractfile(member)
            if f is None or ext != "bin":
                raise ValueError(f"unexpected member {member.name!r} in {shard}")
            yield key, f.read()


def peer_main(description: str, convert: Callable[[str, str, int], dict[str, Any]],
              rank_main: Callable[[dict[str, Any]], dict[str, Any]], imports: Callable[[], None]) -> None:
    """The command line of a peer script (``benchmarks/peer_*.py``, run by its own interpreter).

    ``convert SRC OUT [--chunk-bytes N]`` rewrites the tar shards in ``SRC`` in the peer's format
    (one JSON line back); ``--rank-server`` first runs ``imports`` and makes a throwaway boto3 client
    (untimed: the imports and botocore's lazily loaded modules, which a long-lived process such as
    streamio's rank pool has paid too), then serves trials with ``rank_main`` (:func:`serve`).
    """
    import argparse
    import json

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rank-server", action="store_true")
    ap.add_argument("mode", nargs="?")
    ap.add_argument("src", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--chunk-bytes", type=int, default=16_000_000)
    args = ap.parse_args()
    if args.rank_server:
        import boto3

        imports()
        boto3.session.Session().client("s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:1")
        serve(rank_main)
    elif args.mode == "convert" and args.src and args.out:
        print(json.dumps(convert(args.src, args.out, args.chunk_bytes)))
    else:
        ap.error("convert SRC OUT, or --rank-server")
