"""Mixture throughput: the same bytes as 3 weighted sources vs as 1 source, same loop, same run.

Run: ``.venv/bin/python -m benchmarks.bench_mixture [--quick] [--json OUT]`` (or as the ``mixture``
section of ``python -m benchmarks.run``).

Data: one data set of ``sum(SPLIT)`` shards (``single``) and the same number of samples of the
same size written again as 3 data sets of ``SPLIT`` shards (6 / 4 / 2 in full mode), all in one
moto bucket behind the 30 ms latency proxy the ``dataset`` section uses
(:class:`benchmarks.common.S3Servers`). The mixture is
``StreamingDataset([Stream(a, weight=6), Stream(b, weight=4), Stream(c, weight=2)])``: weights in
proportion to the sources' sizes, so each source contributes exactly its size and both contenders
read the same samples, the same bytes, the same number of shards of the same size; only the
plan differs (3 indexes loaded, each worker's block mixing the sources sample by sample).

Loop: :class:`benchmarks.bench_dataset.RankPool` rank processes (``ranks`` x ``workers``
DataLoader workers) run ``StreamingDataset`` + ``StreamingDataLoader`` with the default
``Shuffle()``, an empty node cache per trial (``cold``), no simulated compute (the loader's own
pace, where a mixing cost would show), :func:`benchmarks.loop.timed_epoch`. Contenders interleaved,
``reps`` repetitions; samples/s (all ranks' samples / the slowest rank's wall time, worker start-up
included), steady samples/s (after each rank's first batch) and first-batch time (slowest rank),
median [min-max], and their ratios mixture / single (issue 15's target: samples/s within 5 %, the
same first-batch time).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_dataset import (  # noqa: E402
    TRIAL_STATS,
    Dataset,
    LoopConfig,
    RankPool,
    _rank_env,
    _trial_stats,
    make_dataset,
    upload_dataset,
)
from benchmarks.common import MB, S3Servers, emit_json, interleave, ratio, summary  # noqa: E402
from benchmarks.loop import serve, timed_epoch  # noqa: E402

SPLIT = (6, 4, 2)
"""Shards of each mixed source (full mode); the single source has their sum."""
QUICK_SPLIT = (2, 1, 1)


def config(quick: bool) -> tuple[LoopConfig, tuple[int, ...]]:
    """The loop sizes (``shards`` = the single source's) and the mixture's split."""
    split = QUICK_SPLIT if quick else SPLIT
    base = LoopConfig(shard_mb=8, compute_ms=0.0, workers=2, reps=4)
    if quick:
        base = replace(base, shard_mb=4, workers=1, reps=1)
    return replace(base, shards=sum(split)), split


# ----------------------------------------------------------------------------- rank process
def rank_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of a trial: ``cfg["streams"]`` is ``[[url, weight], ...]`` (one entry: a plain URL)."""
    import warnings

    warnings.simplefilter("ignore")
    from streamio import Stream
    from streamio.data.cache import CacheConfig
    from streamio.data.dataset import StreamingDataset
    from streamio.data.loader import StreamingDataLoader
    from streamio.data.options import DatasetOptions
    from streamio.data.read.prefetch import PrefetchConfig

    streams = cfg["streams"]
    source: Any = streams[0][0] if len(streams) == 1 else [Stream(u, weight=w) for u, w in streams]
    cache = CacheConfig(cfg["cache"], max_bytes=cfg["cache_bytes"], min_free_bytes=0)
    ds = StreamingDataset(source, batch_size=cfg["batch_size"], storage_options=cfg["options"],
                          options=DatasetOptions(policy="drop", cache=cache,
                                                 prefetch=PrefetchConfig(workers=cfg["prefetch"])))
    loader = StreamingDataLoader(ds, num_workers=cfg["workers"])
    return {"rank": int(os.environ["RANK"]), "epochs": [timed_epoch(loader, cfg["compute_s"])]}


# ----------------------------------------------------------------------------- driver
STATS = (*TRIAL_STATS, "steady_samples_per_s")


def _steady(results: list[dict[str, Any]], batch_size: int) -> dict[str, float]:
    """Samples/s after the first batch: every rank's samples but its first batch / the longest rest of a rank.

    On an epoch of a few seconds, worker start-up (in the first batch) weighs as much as the reading;
    this is the reading alone.
    """
    eps = [r["epochs"][0] for r in results]
    rest = max(e["wall_s"] - e["first_batch_s"] for e in eps)
    after = sum(max(0, e["samples"] - batch_size) for e in eps)
    return {"steady_samples_per_s": after / rest if rest > 0 else float("nan")}


def _datasets(root: str, cfg: LoopConfig, split: tuple[int, ...]) -> tuple[Dataset, list[Dataset]]:
    single = make_dataset(os.path.join(root, "single"), cfg.shards, cfg.shard_mb, cfg.sample_kb)
    parts = [make_dataset(os.path.join(root, f"part{i}"), n, cfg.shard_mb, cfg.sample_kb) for i, n in enumerate(split)]
    if sum(p.samples for p in parts) != single.samples or sum(p.bytes for p in parts) != single.bytes:
        raise RuntimeError(f"the mixture's sources hold {sum(p.samples for p in parts)} samples / "
                           f"{sum(p.bytes for p in parts)} bytes, the single source {single.samples} / {single.bytes}")
    return single, parts


def run(quick: bool = False, *, log: Callable[[str], None] = print, scratch_dir: str | None = None) -> dict[str, Any]:
    """Write the data, start moto + proxy, run the interleaved trials; returns summaries and ratios."""
    cfg, split = config(quick)
    scratch = tempfile.mkdtemp(prefix="bench-mixture-", dir=scratch_dir)
    try:
        t0 = time.perf_counter()
        single, parts = _datasets(os.path.join(scratch, "data"), cfg, split)
        with S3Servers(proxies=1, latency=cfg.latency_ms / 1000) as servers:
            s3 = servers.s3
            client = s3.boto3_client()
            upload_dataset(single, client, s3.bucket, "single")
            for i, p in enumerate(parts):
                upload_dataset(p, client, s3.bucket, f"part{i}")
            log(f"mixture: {single.samples} samples, {single.bytes / MB:.0f} MB as 1 source and as "
                f"{len(parts)} ({'/'.join(map(str, split))} shards), ready in {time.perf_counter() - t0:.1f} s")
            base = {"batch_size": cfg.batch_size, "workers": cfg.workers, "prefetch": cfg.prefetch,
                    "compute_s": cfg.compute_ms / 1000, "cache_bytes": single.bytes * 2 + 256 * MB,
                    "options": s3.storage_options(servers.proxies[0])}
            sources = {"1 source": [[s3.url(single.prefix), None]],
                       f"{len(parts)} sources mixed": [[s3.url(p.prefix), float(n)] for p, n in zip(parts, split,
                                                                                                 strict=True)]}
            cmd = [sys.executable, "-m", "benchmarks.bench_mixture", "--rank-server"]
            with RankPool([_rank_env(r, cfg.ranks, r) for r in range(cfg.ranks)], cmd=cmd) as pool:

                def trial(streams: list[list[Any]]) -> dict[str, float]:
                    cache = os.path.join(scratch, "cache")
                    shutil.rmtree(cache, ignore_errors=True)
                    os.makedirs(cache, mode=0o700)
                    results = pool.run([{**base, "streams": streams, "cache": cache}] * cfg.ranks)
                    return {**_trial_stats(results, single.bytes / single.samples), **_steady(results, cfg.batch_size)}

                runs = interleave({name: (lambda s=s: trial(s)) for name, s in sources.items()}, cfg.reps, log=log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = {name: {k: summary([t[k] for t in trials]) for k in STATS} for name, trials in runs.items()}
    for name, trials in runs.items():
        out[name]["samples"] = trials[0]["samples"]
    one, mixed = out["1 source"], out[f"{len(parts)} sources mixed"]
    return {
        "config": {**asdict(cfg), "split": list(split), "weights": list(split)},
        "dataset_bytes": single.bytes, "dataset_samples": single.samples, "contenders": out,
        "ratios": {
            "mixture / 1 source (samples/s)": ratio(mixed["samples_per_s"]["median"], one["samples_per_s"]["median"]),
            "mixture / 1 source (steady samples/s)": ratio(mixed["steady_samples_per_s"]["median"],
                                                           one["steady_samples_per_s"]["median"]),
            "mixture / 1 source (first batch s)": ratio(mixed["first_batch_s"]["median"],
                                                        one["first_batch_s"]["median"]),
        },
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rank-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="4 shards (2/1/1), 1 worker per rank, 1 repetition")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.rank_server:
        serve(rank_main)
        sys.stdout.flush()
        os._exit(0)  # no interpreter teardown races with DataLoader workers (docs/design.md)
    res = run(args.quick, log=lambda s: print(s, file=sys.stderr, flush=True))
    emit_json(res, args.json, indent=2)


if __name__ == "__main__":
    main()
