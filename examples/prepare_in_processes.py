"""One streamio dataset written by many processes: ``streamio.PartitionedWrite`` from a process pool.

What it shows: the engine-neutral protocol that Ray, Spark and Dask jobs drive (docs/design.md
"Writing a dataset from many tasks"), here with nothing but ``concurrent.futures``:

1. ``PartitionedWrite.begin(url, spec=...)`` once, in the driver: the write's marker, its names;
2. ``write.write_part(part_id, samples)`` in each worker process, one partition each (a
   partition's shards are named by its id and the attempt: what a failed attempt stored is
   removed by the commit);
3. ``write.commit()`` once, in the driver: one ``index.json``, shards in partition-id order.

A worker that fails is simply run again (here: partition 2 fails on its first attempt, after
storing shards, and is retried), and the dataset holds every sample exactly once. The same code
shape runs on Spark (``df.rdd.foreachPartition`` / ``mapInPandas``, with the partition id as the
part) and on Dask (``dask.delayed(write.write_part)``); see docs/design.md for the Spark recipe.

Run it (CPU, seconds), against a local S3 or a local directory:

    python -m streamio.testing s3 --bucket examples --env-file s3.env &
    until [ -s s3.env ] || ! kill -0 $! 2>/dev/null; do sleep 0.2; done; source s3.env
    python examples/prepare_in_processes.py --url s3://examples/prepared
    streamio verify s3://examples/prepared
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import streamio

PARTS = 6
PER_PART = 250


def samples(part: int, flag_dir: str) -> Iterator[dict[str, object]]:
    """Partition ``part``'s samples: a deterministic function of the id (what a retry needs)."""
    for i in range(PER_PART):
        if part == 2 and i == PER_PART // 2 and not Path(flag_dir, "failed-once").exists():
            Path(flag_dir, "failed-once").touch()
            raise RuntimeError(f"partition {part}: worker lost (first attempt)")
        n = part * PER_PART + i
        yield {"__key__": f"{n:07d}", "txt": f"sample {n}", "cls": n % 10}


def write_part(write: streamio.PartitionedWrite, part: int, flag_dir: str) -> streamio.PartSummary:
    return write.write_part(part, samples(part, flag_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.path.join(tempfile.gettempdir(), "streamio-prepared"))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    write = streamio.PartitionedWrite.begin(args.url, spec=streamio.ShardSpec(max_count=100), overwrite=True)
    with tempfile.TemporaryDirectory() as flags, ProcessPoolExecutor(args.workers) as pool:
        todo = {part: pool.submit(write_part, write, part, flags) for part in range(PARTS)}
        done: list[streamio.PartSummary] = []
        for part, future in todo.items():
            try:
                done.append(future.result())
            except RuntimeError as exc:
                print(f"{exc}: running partition {part} again")
                done.append(pool.submit(write_part, write, part, flags).result())
    for summary in done:
        print(f"partition {summary.part}: {summary.shards} shards, {summary.samples} samples")
    index = write.commit([s.part for s in done])
    print(f"committed {args.url}: {len(index.shards)} shards, {index.samples} samples")


if __name__ == "__main__":
    main()
