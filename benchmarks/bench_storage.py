"""Throughput of the Store (issue 2) against boto3 and plain s3fs through the same moto + proxy.

Run: ``.venv/bin/python benchmarks/bench_storage.py`` (``--quick``: fewer/smaller objects;
``--json`` for machine-readable output).

Setup: moto and one FaultProxy (no latency) in a child process (:class:`benchmarks.common.S3Servers`),
so server threads do not share the measured process's GIL. Contenders run interleaved, round by
round with the order rotating, reported as median MB/s and as ratios to boto3 in the same run:

many objects (N x SIZE):
* ``boto3_get`` / ``boto3_put``        — boto3 on ``concurrency`` threads: the ceiling.
* ``store_read_many`` / ``store_put_many`` — ``Store.read_many`` / ``put_many`` (same concurrency).
* ``s3fs_cat``                         — ``s3fs.cat`` of the same keys (s3fs's own batching).

one large object (BIG):
* ``store_iter_bytes``  — one streaming GET.  ``s3fs_cat_file`` — s3fs's concurrent ranged GETs.
* ``store_put_multipart`` — parallel parts (16 MiB, 8 at a time). ``s3fs_pipe_file`` — s3fs's.

Caveats (docs/design.md "Measured behaviour"): moto is the bottleneck (PUT ~0.13-0.2 GB/s whatever the
concurrency; a ranged GET makes moto read the whole object, which penalises s3fs's concurrent
ranged reads of one object here and not on real S3). Compare ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MB, MiB, S3Servers, interleave, machine, machine_line, ratio, summary  # noqa: E402


def _rate(nbytes: int, fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return nbytes / (time.perf_counter() - t0) / MB


def run(quick: bool) -> dict[str, Any]:
    import fsspec

    from streamio.storage import Store

    n, size, big, reps, conc = (8, 4 * MiB, 32 * MiB, 3, 8) if quick else (16, 8 * MiB, 128 * MiB, 5, 8)
    out: dict[str, Any] = {"machine": machine(), "objects": n, "size": size, "big": big, "concurrency": conc}
    with S3Servers(proxies=1, latency=0.0) as servers:
        s3 = servers.s3
        endpoint = servers.proxies[0]
        store = Store(s3.url("bench"), s3.storage_options(endpoint))
        client = s3.boto3_client(endpoint)
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.storage_options(endpoint))
        blobs = [os.urandom(size) for _ in range(n)]
        keys = [f"obj-{i:03d}" for i in range(n)]
        store.put_many(list(zip(keys, blobs, strict=True)), concurrency=conc)
        full = [f"{s3.bucket}/bench/{k}" for k in keys]
        total = n * size

        def boto3_get() -> None:
            with ThreadPoolExecutor(conc) as pool:
                list(pool.map(lambda k: client.get_object(Bucket=s3.bucket, Key=f"bench/{k}")["Body"].read(), keys))

        def boto3_put() -> None:
            with ThreadPoolExecutor(conc) as pool:
                list(pool.map(lambda kb: client.put_object(Bucket=s3.bucket, Key=f"scratch/{kb[0]}", Body=kb[1]),
                              zip(keys, blobs, strict=True)))

        def store_put_many() -> None:
            store.child("scratch2").put_many(list(zip(keys, blobs, strict=True)), concurrency=conc)

        many = interleave(
            {
                "boto3_get": lambda: _rate(total, boto3_get),
                "store_read_many": lambda: _rate(total, lambda: store.read_many(keys, concurrency=conc)),
                "s3fs_cat": lambda: _rate(total, lambda: fs.cat(full)),
                "boto3_put": lambda: _rate(total, boto3_put),
                "store_put_many": lambda: _rate(total, store_put_many),
            },
            reps,
        )
        out["many"] = {k: summary(v) for k, v in many.items()}

        data = os.urandom(big)
        store.put("big", data)

        def stream() -> None:
            got = 0
            for chunk in store.iter_bytes("big"):
                got += len(chunk)
            assert got == big

        large = interleave(
            {
                "store_iter_bytes": lambda: _rate(big, stream),
                "s3fs_cat_file": lambda: _rate(big, lambda: fs.cat_file(f"{s3.bucket}/bench/big")),
                "store_put_multipart": lambda: _rate(big, lambda: store.put("big2", data, concurrency=8)),
                "s3fs_pipe_file": lambda: _rate(big, lambda: fs.pipe_file(f"{s3.bucket}/bench/big3", data)),
            },
            max(2, reps - 2),
        )
        out["large"] = {k: summary(v) for k, v in large.items()}
    m = {k: v["median"] for k, v in out["many"].items()}
    lg = {k: v["median"] for k, v in out["large"].items()}
    out["ratios"] = {
        "read_many/boto3_get": ratio(m["store_read_many"], m["boto3_get"]),
        "put_many/boto3_put": ratio(m["store_put_many"], m["boto3_put"]),
        "read_many/s3fs_cat": ratio(m["store_read_many"], m["s3fs_cat"]),
        "iter_bytes/s3fs_cat_file": ratio(lg["store_iter_bytes"], lg["s3fs_cat_file"]),
        "put_multipart/s3fs_pipe_file": ratio(lg["store_put_multipart"], lg["s3fs_pipe_file"]),
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = run(args.quick)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return
    print(machine_line(out["machine"]))
    print(f"{out['objects']} x {out['size'] // MiB} MiB objects, one {out['big'] // MiB} MiB object, "
          f"concurrency {out['concurrency']}")
    for section in ("many", "large"):
        for name, s in out[section].items():
            print(f"  {name:22s} {s['median']:8.1f} MB/s  (min {s['min']:.1f}, max {s['max']:.1f}, n={s['n']})")
    for name, r in out["ratios"].items():
        print(f"  ratio {name:30s} {r:.2f}")


if __name__ == "__main__":
    main()
