"""Where the data path's CPU goes: CPU seconds per delivered GB, stage by stage (issue 39).

Run: ``.venv/bin/python -m benchmarks.profile_pipeline [--samples N] [--reps N] [--cprofile] [--json OUT]``
(default 4,096 samples of 64 KiB in 16 shards, 268 MB; ``--cprofile`` adds the top functions of
one in-process pass of the reader).

Each stage is measured on its own, in this process, over all the data (``getrusage`` user + system
CPU of the process, and of its reaped children for the DataLoader trials, plus minor page faults),
best of ``--reps``; CPU s per GB = CPU / payload bytes delivered (10^9 bytes). The stages nest the
way the pipeline does, so the differences are the costs of the steps in between:

* ``read`` -- ``Store.iter_bytes`` of every shard (local: copies out of the page cache; S3: the
  s3fs/aiobotocore stream the reader uses; ``Store.read``: botocore's whole-object GET);
* ``crc32c`` -- every shard's bytes checksummed once (the reader checks each sample's range);
* ``parse`` -- :func:`streamio.data.format.samples.iter_samples` with the layout over shards
  already in memory: the CRC, the tar headers and one copy per member;
* ``reader`` -- ``StreamingDataset`` iterated in this process (plan, prefetch thread, schedule,
  read, parse, decode): minus ``read`` + ``parse``, what the read path costs in Python around them;
* ``loader w0`` -- ``StreamingDataLoader(num_workers=0)``: minus ``reader``, collation;
* ``loader wN`` -- with N workers (batches through the shared-memory transport): minus
  ``loader w0``, worker processes and batch transport;
* ``loader tN`` -- ``StreamingDataLoader(threads=N)``: the same batches made on N threads of this
  process (issue 39); minus ``loader w0``, what the feeder and pool threads cost instead;
* ``DataLoader floor`` -- a plain ``DataLoader`` with N workers over as many tiny samples in the
  same batches, charged to the same bytes: the part of ``loader wN`` that is torch's own
  machinery (worker start, index and result queues, pickling, worker loop), whatever the reader
  does (not split into fixed and per-GB parts).

``loader`` rows are per GB with the fixed cost (dataset, index, worker start) removed: each is also
run on a data set 1/8 the size, and the line through the two gives the slope (CPU s/GB) and the
intercept (``fixed CPU s``).

Warm: the files in the page cache, read from ``file://``. Cold: the same shards in moto over HTTP
(a process of its own, :class:`streamio.testing.MotoProcess`: its CPU is not ours), no node cache
(streaming GETs) and with an empty one (the tee to local disk). The machine's load average is
printed: 2 cores shared with other work make wall time noisy, CPU time less so.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import multiprocessing
import os
import pstats
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_pipeline import Config, write_raw  # noqa: E402

GB = 1e9


def _usage() -> tuple[float, float, int, int]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime, me.ru_minflt, kids.ru_minflt


def measure(fn: Callable[[], Any], payload: int, reps: int) -> dict[str, float]:
    """Best-of-``reps`` CPU s/GB of ``fn()`` (self + reaped children), with wall and page faults."""
    best: dict[str, float] | None = None
    for _ in range(reps):
        gc.collect()
        c0, k0, f0, g0 = _usage()
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        for child in multiprocessing.active_children():
            child.join(30)
        c1, k1, f1, g1 = _usage()
        row = {"cpu_s_per_GB": (c1 - c0 + k1 - k0) / (payload / GB), "main_s_per_GB": (c1 - c0) / (payload / GB),
               "children_s_per_GB": (k1 - k0) / (payload / GB), "minflt_main_per_MB": (f1 - f0) / (payload / 1e6),
               "minflt_children_per_MB": (g1 - g0) / (payload / 1e6),
               "MBps": payload / 1e6 / wall}
        if best is None or row["cpu_s_per_GB"] < best["cpu_s_per_GB"]:
            best = row
    assert best is not None
    return best


def byte_stages(url: str, storage_options: dict[str, Any] | None, payload: int, samples: int,
                reps: int) -> dict[str, dict[str, float]]:
    """``read``, ``crc32c`` and ``parse`` of the module docstring over the data set at ``url``."""
    from streamio.checksum import crc32c
    from streamio.data.format.index import load_index
    from streamio.data.format.samples import SampleSpan, iter_samples
    from streamio.storage import Store

    store = Store(url, storage_options=storage_options)
    index = load_index(store)
    shards = [s.path for s in index.shards]
    layouts = [index.layout(i, store) for i in range(len(shards))]
    out: dict[str, dict[str, float]] = {}

    def read() -> None:
        for path in shards:
            for _ in store.iter_bytes(path):
                pass

    out["read (iter_bytes)"] = measure(read, payload, reps)
    if not store.is_local:
        out["read (Store.read)"] = measure(lambda: [store.read(p) for p in shards], payload, reps)
    held = [store.read(p) for p in shards]
    out["crc32c"] = measure(lambda: [crc32c(data) for data in held], payload, reps)

    def parse() -> None:
        n = 0
        for i, data in enumerate(held):
            for _ in iter_samples([data], url=shards[i], span=SampleSpan(), layout=layouts[i]):
                n += 1
        assert n == samples, n

    out["parse (crc + tar + member copy)"] = measure(parse, payload, reps)
    return out


def loader_stages(url: str, storage_options: dict[str, Any] | None, payload: int, samples: int, reps: int, *,
                  workers: int, batch: int, cache: str | None = None) -> dict[str, dict[str, float]]:
    """``reader``, ``loader w0``, ``loader wN`` and ``loader tN`` of the module docstring (a fresh dataset and
    loader each)."""
    import streamio

    options = streamio.DatasetOptions(cache=streamio.CacheConfig(cache, max_bytes=4 * payload, min_free_bytes=0)) \
        if cache else None

    def run(workers: int | None, threads: int = 0) -> Callable[[], None]:
        def once() -> None:
            if cache:
                shutil.rmtree(cache, ignore_errors=True)
            ds = streamio.StreamingDataset(url, batch_size=batch, storage_options=storage_options, options=options)
            if workers is None:
                n = sum(1 for _ in ds)
            else:
                loader = streamio.StreamingDataLoader(ds, num_workers=workers, threads=threads)
                n = sum(len(b["__key__"]) for b in loader)
            assert n == samples, n
        return once

    return {"reader (in process)": measure(run(None), payload, reps), "loader w0": measure(run(0), payload, reps),
            f"loader w{workers}": measure(run(workers), payload, reps),
            f"loader t{workers}": measure(run(0, threads=workers), payload, reps)}


def loader_floor(samples: int, payload: int, reps: int, *, workers: int, batch: int) -> dict[str, float]:
    """A plain ``DataLoader`` over ``samples`` tiny sample dicts, charged to ``payload`` bytes: what the
    DataLoader's own machinery (workers, index and result queues, pickling) costs at this batch size."""
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Tiny(IterableDataset):
        def __iter__(self) -> Any:
            info = get_worker_info()
            k, n = (info.id, info.num_workers) if info is not None else (0, 1)
            for i in range(k, samples, n):
                yield {"__key__": f"{i:08d}", "cls": b"3"}

    def run() -> None:
        assert sum(len(b["__key__"]) for b in DataLoader(Tiny(), batch_size=batch, num_workers=workers)) == samples

    return measure(run, payload, reps)


def marginal(big: dict[str, dict[str, float]], small: dict[str, dict[str, float]], big_gb: float,
             small_gb: float) -> dict[str, dict[str, float]]:
    """Per-GB cost with the fixed cost (dataset, index, workers' start) removed: two sizes, one line."""
    out = {}
    for name, b in big.items():
        s = small[name]
        row = {k: (b[k] * big_gb - s[k] * small_gb) / (big_gb - small_gb) for k in b if k != "MBps"}
        row["MBps"] = b["MBps"]
        row["fixed_cpu_s"] = (b["cpu_s_per_GB"] - row["cpu_s_per_GB"]) * big_gb
        out[name] = row
    return out


def profile_reader(url: str, storage_options: dict[str, Any] | None, batch: int, top: int = 25) -> str:
    """cProfile's top functions (own time) of one in-process pass of the reader."""
    import io

    import streamio

    ds = streamio.StreamingDataset(url, batch_size=batch, storage_options=storage_options)
    prof = cProfile.Profile()
    prof.enable()
    for _ in ds:
        pass
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def table(rows: dict[str, dict[str, float]]) -> str:
    lines = ["| stage | CPU s/GB | main | children | page faults/MB main | children | fixed CPU s | MB/s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        fixed = f"{r['fixed_cpu_s']:.2f}" if "fixed_cpu_s" in r else ""
        lines.append(f"| {name} | {r['cpu_s_per_GB']:.3f} | {r['main_s_per_GB']:.3f} | {r['children_s_per_GB']:.3f} "
                     f"| {r['minflt_main_per_MB']:.1f} | {r['minflt_children_per_MB']:.1f} | {fixed} "
                     f"| {r['MBps']:,.0f} |")
    return "\n".join(lines)


def profile_data(url: str, opts: dict[str, Any] | None, big: Any, small: Any, args: Any,
                 cache: str | None = None) -> dict[str, dict[str, float]]:
    """Byte stages on ``big``, loader stages on both sizes with their fixed cost removed."""
    kw = {"workers": args.workers, "batch": args.batch, "cache": cache}
    reps = 1 if cache else args.reps
    rows = {} if cache else byte_stages(url, opts, big.payload, big.samples, reps)
    small_url = url.rstrip("/") + "-small" if "://" in url else small.dir
    loaders = loader_stages(url, opts, big.payload, big.samples, reps, **kw)
    few = loader_stages(small_url, opts, small.payload, small.samples, reps, **kw)
    rows.update(marginal(loaders, few, big.payload / GB, small.payload / GB))
    return rows


def upload(root: str, endpoint: Any, prefix: str) -> None:
    client = endpoint.boto3_client()
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            client.put_object(Bucket=endpoint.bucket, Key=f"{prefix}/{p.relative_to(root)}", Body=p.read_bytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=16_384)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    for k in [k for k in os.environ if k.startswith("AWS_")]:  # the host's AWS_* must not reach the clients
        del os.environ[k]
    from benchmarks.bench_pipeline import warm_page_cache
    from streamio.testing import MotoProcess, S3Endpoint

    cfg = Config(samples=args.samples)
    tmp = tempfile.mkdtemp(prefix="streamio-prof-")
    result: dict[str, Any] = {"loadavg_start": os.getloadavg(), "samples": args.samples,
                              "batch": args.batch, "workers": args.workers}
    setting = f"b{args.batch}/w{args.workers}, {args.samples:,} x 64 KiB"
    try:
        big = write_raw(os.path.join(tmp, "data"), cfg)
        small = write_raw(os.path.join(tmp, "data-small"), Config(samples=args.samples // 8, shards=cfg.shards // 8))
        warm_page_cache(big.dir, small.dir)
        kw = {"workers": args.workers, "batch": args.batch}
        loader_stages(small.dir, None, small.payload, small.samples, 1, **kw)  # untimed: first imports, first fork
        result["warm"] = profile_data(big.dir, None, big, small, args)
        result["warm"][f"DataLoader floor w{args.workers} (tiny samples, same batches)"] = loader_floor(
            big.samples, big.payload, args.reps, workers=args.workers, batch=args.batch)
        print(f"## warm (file://, {setting})\n\n{table(result['warm'])}\n", flush=True)
        if args.cprofile:
            print(profile_reader(big.dir, None, args.batch), flush=True)
        if not args.no_cold:
            moto = MotoProcess()
            try:
                ep = S3Endpoint(moto.start(), "unused").new_bucket("streamio-prof")
                upload(big.dir, ep, "data")
                upload(small.dir, ep, "data-small")
                opts = ep.storage_options()
                result["cold"] = profile_data(ep.url("data"), opts, big, small, args)
                print(f"## cold (moto over HTTP, no node cache, {setting})\n\n{table(result['cold'])}\n", flush=True)
                result["cold_cache_fill"] = profile_data(ep.url("data"), opts, big, small, args,
                                                         cache=os.path.join(tmp, "cache"))
                print(f"## cold, empty node cache (tee to local disk)\n\n{table(result['cold_cache_fill'])}\n")
            finally:
                moto.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["loadavg_end"] = os.getloadavg()
    print(f"load average: start {result['loadavg_start']}, end {result['loadavg_end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
