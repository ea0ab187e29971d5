"""Writers through a store that throttles (issue 26): paced vs unpaced, same run, same limit.

moto behind a FaultProxy whose rate limit answers writes over R per second with 503 SlowDown
(S3's XML body), as S3 does per prefix. ``--threads`` writers in this process put ``--objects``
small objects through one ``Store``, once with the default ``RetryPolicy`` (writes paced:
:mod:`streamio.storage.pacing`) and once with ``RetryPolicy(pace_writes=False)`` (each write
retried on its own backoff, what streamio did before), alternating, ``--reps`` times. Reported:
wall time against the time the limit allows (``(objects - burst) / R``) and the share of write
requests the store refused. The checkpoint-level figure (8 gloo ranks saving one step through the
limit) is tests/checkpoint/test_checkpoint_throttled.py's.

Run:  .venv/bin/python -m benchmarks.bench_throttle [--rate 60] [--threads 16] [--objects 300]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.common import clean_aws_env, emit_json, machine, machine_line, summary


def _one(store: Any, proxy: Any, rate: float, threads: int, objects: int, tag: str) -> dict[str, float]:
    limit = proxy.limit_rate(rate)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: store.put(f"{tag}/obj-{i:05d}", b"x" * 1024), range(objects)))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "refused": limit.refused / max(1, limit.admitted + limit.refused)}


def run(rate: float, threads: int, objects: int, reps: int) -> dict[str, Any]:
    from streamio.storage import RetryPolicy, Store
    from streamio.testing import FaultProxy, MotoServer, S3Endpoint

    clean_aws_env()
    server = MotoServer()
    endpoint = server.start()
    results: dict[str, list[dict[str, float]]] = {"paced": [], "unpaced": []}
    try:
        with FaultProxy(endpoint) as proxy:
            s3 = S3Endpoint(endpoint, "unused").new_bucket()
            for rep in range(reps):
                for mode in ("paced", "unpaced"):
                    retry = RetryPolicy(max_attempts=30, max_total=600, pace_writes=mode == "paced")
                    # a bucket of its own per case: each case meets the store cold, as a new job does
                    store = Store(s3.new_bucket().url("t"), s3.storage_options(proxy.endpoint_url), retry=retry)
                    results[mode].append(_one(store, proxy, rate, threads, objects, f"{mode}-{rep}"))
    finally:
        server.stop()
    ideal = max(objects - rate, 0) / rate
    out: dict[str, Any] = {"machine": machine(), "rate": rate, "threads": threads, "objects": objects,
                           "ideal_s": ideal}
    for mode, runs in results.items():
        out[mode] = {"seconds": summary([r["seconds"] for r in runs]), "refused": summary([r["refused"] for r in runs])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--objects", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = run(args.rate, args.threads, args.objects, args.reps)
    print(machine_line(result["machine"]))
    for mode in ("paced", "unpaced"):
        r = result[mode]
        print(f"{mode:>8}: {r['seconds']['median']:.1f} s ({r['seconds']['median'] / result['ideal_s']:.2f}x the "
              f"{result['ideal_s']:.1f} s the limit allows), {r['refused']['median']:.0%} of writes refused")
    if args.json:
        emit_json(result, args.json)


if __name__ == "__main__":
    main()
