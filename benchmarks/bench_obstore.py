"""obstore (Rust ``object_store``, GIL released) vs streamio's S3 read paths, side by side (issue 39).

Run: ``.venv/bin/python -m benchmarks.bench_obstore [--objects N] [--object-mb N] [--rounds N] [--json OUT]``
(default 16 objects x 8 MiB, 3 rounds; needs the ``bench`` extra's ``obstore``).

One moto S3 server in a process of its own (:class:`streamio.testing.MotoProcess`: its CPU is not
counted), plain HTTP on 127.0.0.1, the same objects for every contender. Each trial reads every
object once, on 1 or 8 threads, and reports MB/s (wall) and CPU s per GB (``getrusage`` of this
process: every thread, obstore's tokio runtime included). Contenders, interleaved round by round
(the order rotating), medians [min-max]:

* ``streamio read``: ``Store.read(path)`` (one botocore GET in the calling thread, whole body);
* ``streamio iter_bytes``: ``Store.iter_bytes(path)`` (the s3fs/aiobotocore stream the data reader uses);
* ``streamio read 1MiB``: ``Store.read(path, start, start + 1 MiB)`` for every MiB of every object;
* ``obstore get``: ``obstore.get(store, path).bytes()``;
* ``obstore stream``: ``obstore.get(store, path).stream(1 MiB)`` iterated (as ``iter_bytes``);
* ``obstore get_range 1MiB``: ``obstore.get_range(store, path, start=, end=)`` for every MiB.

Every trial checks the bytes it got (length and CRC32C of each object, or of each range against the
object's). Caveats: moto reads the whole object for every ranged GET (KNOWN-BEHAVIOUR.md), so the
1 MiB trials' MB/s are moto's; their CPU s per GB are the client's. moto closes the connection after
every response, so neither client reuses connections here (on real S3 both would). 2 shared cores:
the load average is printed at the start and the end.

Not a backend yet, and why not as is (measured with obstore 0.12.1): once a process has made one
request through obstore (its tokio runtime started), every obstore request in a child forked from
it hangs, even through a store made in the child: a DataLoader worker forked after the main process
read the index through obstore would hang. ``S3Store`` pickles with the secret key in it; its
``repr`` does not show it. A missing object raises a ``FileNotFoundError`` subclass; ``bytes()``
and ``stream()`` pieces are read-only buffers (``obstore.Bytes``) that the CRC and the tar parser
take without a copy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1 << 20
GB = 1e9


def obstore_store(endpoint: Any) -> Any:
    """An ``obstore`` S3Store for the bucket at ``endpoint`` (an :class:`~streamio.testing.S3Endpoint`),
    with the credentials of its storage options; plain HTTP allowed (moto on loopback)."""
    from obstore.store import S3Store

    opts = endpoint.storage_options()
    return S3Store(endpoint.bucket, endpoint=opts["endpoint_url"], access_key_id=opts["key"],
                   secret_access_key=opts["secret"], region=opts["client_kwargs"]["region_name"],
                   client_options={"allow_http": True})


def contenders(store: Any, obs: Any, paths: list[str], size: int) -> dict[str, Callable[[str], list[Any]]]:
    """name -> read(path) returning the pieces it got (checked by the caller)."""
    import obstore

    def ranges(read: Callable[[str, int, int], Any]) -> Callable[[str], list[Any]]:
        return lambda p: [read(p, s, min(s + MiB, size)) for s in range(0, size, MiB)]

    return {
        "streamio read": lambda p: [store.read(p)],
        "streamio iter_bytes": lambda p: list(store.iter_bytes(p)),
        "streamio read 1MiB": ranges(lambda p, s, e: store.read(p, s, e)),
        "obstore get": lambda p: [obstore.get(obs, p).bytes()],
        "obstore stream": lambda p: list(obstore.get(obs, p).stream(min_chunk_size=MiB)),
        "obstore get_range 1MiB": ranges(lambda p, s, e: obstore.get_range(obs, p, start=s, end=e)),
    }


def trial(read: Callable[[str], list[Any]], paths: list[str], threads: int, crcs: dict[str, int]) -> dict[str, float]:
    from streamio.checksum import crc32c

    def one(path: str) -> int:
        value, n = 0, 0
        for piece in read(path):
            value = crc32c(memoryview(piece), value)
            n += len(memoryview(piece))
        if value != crcs[path]:
            raise RuntimeError(f"{path}: wrong bytes ({n} bytes read)")
        return n

    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = me.ru_utime + me.ru_stime
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(one, paths))
    wall = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF)
    cpu = me.ru_utime + me.ru_stime - cpu0
    return {"MBps": total / 1e6 / wall, "cpu_s_per_GB": cpu / (total / GB)}


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f} [{min(values):,.2f}-{max(values):,.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=16)
    ap.add_argument("--object-mb", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,8")
    ap.add_argument("--json")
    args = ap.parse_args()
    for k in [k for k in os.environ if k.startswith("AWS_")]:  # the host's AWS_* must not reach either client
        del os.environ[k]
    from streamio.checksum import crc32c
    from streamio.storage import Store
    from streamio.testing import MotoProcess, S3Endpoint

    size = args.object_mb * MiB
    load0 = os.getloadavg()
    moto = MotoProcess()
    try:
        ep = S3Endpoint(moto.start(), "unused").new_bucket("streamio-obstore")
        client = ep.boto3_client()
        paths, crcs = [], {}
        for i in range(args.objects):
            body = os.urandom(size)
            paths.append(f"objects/{i:04d}.bin")
            crcs[paths[-1]] = crc32c(body)
            client.put_object(Bucket=ep.bucket, Key=paths[-1], Body=body)
        store = Store(ep.url(), storage_options=ep.storage_options())
        reads = contenders(store, obstore_store(ep), paths, size)
        threads = [int(t) for t in args.threads.split(",")]
        runs = [(name, t) for t in threads for name in reads]
        for name, t in runs:  # warm up: clients, connection pools, botocore's model, tokio's runtime
            trial(reads[name], paths[:2], t, crcs)
        results: dict[tuple[str, int], list[dict[str, float]]] = {r: [] for r in runs}
        for rnd in range(args.rounds):
            order = runs[rnd % len(runs):] + runs[:rnd % len(runs)]
            for name, t in order:
                results[(name, t)].append(trial(reads[name], paths, t, crcs))
    finally:
        moto.stop()
    load1 = os.getloadavg()
    print(f"{args.objects} objects x {args.object_mb} MiB in moto (own process, HTTP on 127.0.0.1), "
          f"{args.rounds} rounds interleaved; median [min-max]. Load average {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f} at the start, {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at the end.\n")
    print("| contender | threads | MB/s | CPU s / GB |\n|---|---|---|---|")
    for (name, t), rows in results.items():
        print(f"| {name} | {t} | {summary([r['MBps'] for r in rows])} | {summary([r['cpu_s_per_GB'] for r in rows])} |")
    med = {k: {f: statistics.median(r[f] for r in rows) for f in ("MBps", "cpu_s_per_GB")}
           for k, rows in results.items()}
    pairs = [("obstore get", "streamio read"), ("obstore stream", "streamio iter_bytes"),
             ("obstore get_range 1MiB", "streamio read 1MiB")]
    print("\n| ratio | threads | MB/s | CPU s / GB |\n|---|---|---|---|")
    for a, b in pairs:
        for t in threads:
            print(f"| {a} / {b} | {t} | {med[(a, t)]['MBps'] / med[(b, t)]['MBps']:.2f} "
                  f"| {med[(a, t)]['cpu_s_per_GB'] / med[(b, t)]['cpu_s_per_GB']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"loadavg": [load0, load1], "objects": args.objects,
                                               "object_mb": args.object_mb,
                                               "results": {f"{n} x{t}": rows for (n, t), rows in results.items()}},
                                              indent=1))


if __name__ == "__main__":
    main()
