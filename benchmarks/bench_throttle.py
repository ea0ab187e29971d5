"""Writers through a store that throttles (issue 26): paced vs unpaced, same run, same limit.

Two parts. One process: moto behind a FaultProxy whose rate limit answers writes over R per second with 503 SlowDown
(S3's XML body), as S3 does per prefix. ``--threads`` writers in this process put ``--objects``
small objects through one ``Store``, once with the default ``RetryPolicy`` (writes paced:
:mod:`streamio.storage.pacing`) and once with ``RetryPolicy(pace_writes=False)`` (each write
retried on its own backoff, what streamio did before), alternating, ``--reps`` times. Reported:
wall time against the time the limit allows (``(objects - burst) / R``) and the share of write
requests the store refused.

One job (``--ranks W``): W gloo ranks (torchrun, :mod:`benchmarks.fanout_rank`) saving
``--saves`` steps of a ``--size-mb`` model in 128 KiB parts through a limit of ``--rank-rate``
writes per second, per case: no limit (what this machine takes anyway: the ranks, moto and the proxy
share its cores), unpaced (before issue 26), paced with the job's rate shared among the ranks
(:mod:`streamio.checkpoint.save.rates`), and capped at the limit (``SaveOptions(write_rate=R)``,
what the default ``"store"`` does on AWS S3 and GCS). Each save's ideal time is the larger of
``writes / R`` and the no-limit case's time. Two more cases model a store that has partitioned the
root's key prefixes (S3 after sustained load): the limit applies per prefix (``ckpt/p-03``; every
flat key shares ``ckpt/step``), once with every rank's objects in the save directory
(``key_prefixes=1``, the layout before format 4) and once spread over the ranks' prefixes (the
default); there the ideal is the no-limit time.

Run:  .venv/bin/python -m benchmarks.bench_throttle [--rate 60] [--threads 16] [--objects 300] [--ranks 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
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


RANK_CASES = {  # name: (rank mode, job's write cap, store limit on, limit per key prefix, SaveOptions.key_prefixes)
    "no limit (this machine's floor)": ("save-paced", "none", False, False, 16),
    "unpaced (before)": ("save-unpaced", "none", True, False, 16),
    "paced, rate shared": ("save-paced", "none", True, False, 16),
    "paced, capped at the limit": ("save-paced", "rate", True, False, 16),
    "partitioned store, flat keys": ("save-paced", "none", True, True, 1),
    "partitioned store, spread keys": ("save-paced", "none", True, True, 16),
}
_PREFIX_CHARS = len("ckpt/p-00")  # a store that has partitioned the root's key prefixes (flat: "ckpt/step")


def run_ranks(world: int, rate: float, size_mb: int, saves: int, log: Any = print) -> dict[str, Any]:
    """One job of ``world`` gloo ranks saving ``saves`` steps through a limit of ``rate`` writes/s
    per case of :data:`RANK_CASES`; each save's time, writes admitted and refused."""
    from benchmarks.bench_fanout import torchrun_ranks
    from streamio.testing import FaultProxy, MotoServer, S3Endpoint
    from streamio.testing.ratelimit import writes_per_segment

    clean_aws_env()
    server = MotoServer()
    endpoint = server.start()
    cases: dict[str, Any] = {}
    try:
        with FaultProxy(endpoint) as proxy, tempfile.TemporaryDirectory() as scratch:
            s3 = S3Endpoint(endpoint, "unused").new_bucket()
            options = s3.storage_options(proxy.endpoint_url)
            for name, (mode, cap, limited, per_prefix, prefixes) in RANK_CASES.items():
                proxy.clear()
                proxy.limit_rate(rate if limited else 1e9, prefix_chars=_PREFIX_CHARS if per_prefix else None)
                env = {"BENCH_SAVES": str(saves), "BENCH_WRITE_RATE": str(rate) if cap == "rate" else "none",
                       "BENCH_KEY_PREFIXES": str(prefixes)}
                results = torchrun_ranks(world, mode, s3.new_bucket().url("ckpt"), size_mb, options,
                                         Path(scratch, f"{len(cases)}"), env=env)
                each = [max(r["each"][i] for r in results) for i in range(saves)]
                split = writes_per_segment(proxy.log(), "between-", saves)
                cases[name] = [{"seconds": s, "admitted": a, "refused": b / (a + b)}
                               for s, (a, b) in zip(each, split, strict=True)]
                log(f"{world} ranks, {name:>32}: " + "; ".join(
                    f"save {i + 1}: {c['seconds']:.1f} s, {c['admitted']} writes, {c['refused']:.0%} refused"
                    for i, c in enumerate(cases[name])))
    finally:
        server.stop()
    floor = cases["no limit (this machine's floor)"]
    for name, runs in cases.items():
        _, _, _, per_prefix, prefixes = RANK_CASES[name]
        served = rate * (min(prefixes, world) if per_prefix else 1)  # the ranks' prefixes, each at the limit
        for i, c in enumerate(runs):  # the floor's own ideal is itself: no limit to wait for
            c["ideal_s"] = floor[i]["seconds"] if runs is floor else max(c["admitted"] / served, floor[i]["seconds"])
            c["over_ideal"] = c["seconds"] / c["ideal_s"]
    return {"world": world, "rate": rate, "size_mb": size_mb, "cases": cases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--objects", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=8, help="ranks of the one-job part (0: skip it)")
    ap.add_argument("--rank-rate", type=float, default=40.0)
    ap.add_argument("--size-mb", type=int, default=40)
    ap.add_argument("--saves", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = run(args.rate, args.threads, args.objects, args.reps)
    if args.ranks:
        result["job"] = run_ranks(args.ranks, args.rank_rate, args.size_mb, args.saves)
    print(machine_line(result["machine"]))
    for mode in ("paced", "unpaced"):
        r = result[mode]
        print(f"{mode:>8}: {r['seconds']['median']:.1f} s ({r['seconds']['median'] / result['ideal_s']:.2f}x the "
              f"{result['ideal_s']:.1f} s the limit allows), {r['refused']['median']:.0%} of writes refused")
    if args.json:
        emit_json(result, args.json)


if __name__ == "__main__":
    main()
