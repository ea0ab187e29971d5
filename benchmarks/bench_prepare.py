"""Preparing datasets at scale (issue 27): ``streamio shard`` / ``index`` on 1 vs 2 workers and on Ray.

Run: ``.venv/bin/python -m benchmarks.bench_prepare --json OUT.json`` (``--size-mb 1000 --sample-kb 100``
by default; ``--rounds N``).

What is measured, on local disk (page cache; no contender fsyncs), contenders interleaved round by
round, the median reported:

1. ``shard``: a source tree of ``size_mb`` of ``sample_kb`` incompressible files (+ a 1-3 byte
   ``.cls`` file each) into 64 MB shards: the ``streamio shard`` CLI (a subprocess, as users run it)
   with ``--workers 1`` and ``2``, tar and ``--compress zstd``; ``streamio.ray.DatasetSink`` on a
   local Ray with 2 CPUs (the files read in the Ray tasks); webdataset's ``ShardWriter`` (one
   process, the files read by it); Ray's ``write_webdataset`` (then ``streamio index``, which a
   streamio reader needs, timed apart).
2. ``index``: the shards ``streamio shard`` wrote, indexed by ``streamio index --workers 1`` and
   ``2`` (``--concurrency 8``) and by ``streamio.ray.index`` (2 CPUs).

The Ray cluster starts once before timing (its start is reported apart); a Ray contender's time is
its ``write_datasink`` / ``index`` call. MB are 10^6 bytes of source (shard) or of shards (index).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import summary  # noqa: E402
from streamio.data.format.layout import INDEX_NAME  # noqa: E402
from streamio.data.write.writer import ShardSpec  # noqa: E402

SHARD_BYTES = 64_000_000
CLI = [sys.executable, "-m", "streamio.cli.main"]


def make_source(root: str, total: int, size: int) -> int:
    """``total // size`` samples as files ``{i % 10}/{i:07d}.bin`` + ``.cls`` below ``root``; returns the bytes."""
    pool = os.urandom(64 << 20)
    n = max(1, total // size)
    for i in range(n):
        d = os.path.join(root, f"{i % 10}")
        os.makedirs(d, exist_ok=True)
        o = (i * 7919 * 64) % (len(pool) - size)
        Path(d, f"{i:07d}.bin").write_bytes(pool[o : o + size])
        Path(d, f"{i:07d}.cls").write_text(str(i % 1000))
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def tree_bytes(root: str) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def cli(*args: str) -> None:
    subprocess.run([*CLI, *args], check=True, stdout=subprocess.DEVNULL, timeout=1800)


def files(src: str) -> list[tuple[str, str]]:
    """(key, path without extension) of every sample, in key order."""
    stems = sorted({str(p.with_suffix("")) for p in Path(src).rglob("*.bin")})
    return [(os.path.relpath(s, src), s) for s in stems]


def read_sample(key: str, stem: str) -> dict[str, Any]:
    return {"__key__": key, "bin": Path(stem + ".bin").read_bytes(), "cls": Path(stem + ".cls").read_bytes()}


# ----------------------------------------------------------------------------- contenders
def wds_shardwriter(src: str, out: str) -> None:
    import webdataset as wds

    os.makedirs(out)
    with wds.ShardWriter(os.path.join(out, "data-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for key, stem in files(src):
            sink.write(read_sample(key, stem))


def _ray_rows(src: str) -> Any:
    import ray.data

    items = [{"key": k, "stem": s} for k, s in files(src)]
    return ray.data.from_items(items, override_num_blocks=8).map(lambda r: read_sample(r["key"], r["stem"]))


def ray_sink(src: str, out: str) -> None:
    import streamio.ray

    rows = len(files(src))
    _ray_rows(src).write_datasink(streamio.ray.DatasetSink(out, spec=ShardSpec(max_bytes=SHARD_BYTES),
                                                           rows_per_task=max(1, rows // 4)))


def ray_write_webdataset(src: str, out: str) -> None:
    rows = len(files(src))
    _ray_rows(src).write_webdataset(out, min_rows_per_file=max(1, rows // 8), encoder=False)


def run_rounds(contenders: dict[str, Callable[[str], None]], rounds: int, scratch: str, nbytes: Callable[[str], int],
               keep: str | None = None) -> tuple[dict[str, list[float]], str | None]:
    """Seconds of each contender per round (order alternating); ``keep``'s first output is kept."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    kept = None
    for r in range(rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            out = os.path.join(scratch, f"{name}-{uuid.uuid4().hex[:6]}".replace(" ", "_").replace("/", "_"))
            t0 = time.perf_counter()
            contenders[name](out)
            dt = time.perf_counter() - t0
            times[name].append(dt)
            print(f"  round {r} {name:<40} {dt:7.2f} s {nbytes(out) / dt / 1e6:7.0f} MB/s", flush=True)
            if name == keep and kept is None:
                kept = out
            elif os.path.isdir(out) and not out.endswith("-index"):
                shutil.rmtree(out, ignore_errors=True)
    return times, kept


def summarise(times: dict[str, list[float]], mb: float, ref: str) -> dict[str, Any]:
    rate = {k: summary([mb / t for t in v]) for k, v in times.items()}
    return {"seconds": {k: summary(v) for k, v in times.items()}, "MBps": rate,
            "vs_one_worker": {k: v["median"] / rate[ref]["median"] for k, v in rate.items()}}


def shard_section(src: str, src_bytes: int, rounds: int, scratch: str) -> tuple[dict[str, Any], str]:
    def streamio_shard(workers: int, *extra: str) -> Callable[[str], None]:
        return lambda out: cli("shard", src, out, "--max-size", str(SHARD_BYTES), "--workers", str(workers), *extra)

    contenders = {
        "streamio shard, 1 worker": streamio_shard(1),
        "streamio shard, 2 workers": streamio_shard(2),
        "streamio shard --compress zstd, 1 worker": streamio_shard(1, "--compress", "zstd"),
        "streamio shard --compress zstd, 2 workers": streamio_shard(2, "--compress", "zstd"),
        "streamio.ray.DatasetSink, Ray 2 CPUs": lambda out: ray_sink(src, out),
        "webdataset ShardWriter, 1 process": lambda out: wds_shardwriter(src, out),
        "Ray write_webdataset, 2 CPUs": lambda out: ray_write_webdataset(src, out),
    }
    times, kept = run_rounds(contenders, rounds, scratch, lambda _out: src_bytes, keep="streamio shard, 1 worker")
    assert kept is not None
    res = summarise(times, src_bytes / 1e6, "streamio shard, 1 worker")
    # what a streamio reader also needs after write_webdataset: an index of its shards
    wds_out = os.path.join(scratch, "wds-index")
    ray_write_webdataset(src, wds_out)
    t0 = time.perf_counter()
    cli("index", wds_out, "--workers", "2")
    res["write_webdataset_then_index_s"] = time.perf_counter() - t0
    shutil.rmtree(wds_out, ignore_errors=True)
    return res, kept


def index_section(shards: str, rounds: int, scratch: str) -> dict[str, Any]:
    import streamio.ray

    nbytes = tree_bytes(shards) - os.path.getsize(os.path.join(shards, INDEX_NAME))

    def indexed(run: Callable[[str], None]) -> Callable[[str], None]:
        def go(out: str) -> None:
            run(os.path.join(out + "-index", "index.json"))
        return go

    contenders = {
        "streamio index, 1 worker": indexed(lambda at: cli("index", shards, "--workers", "1", "--index-url", at)),
        "streamio index, 2 workers": indexed(lambda at: cli("index", shards, "--workers", "2", "--index-url", at)),
        "streamio.ray.index, Ray 2 CPUs": indexed(lambda at: streamio.ray.index(shards, index_url=at)),
    }
    times, _ = run_rounds(contenders, rounds, scratch, lambda _out: nbytes)
    res = summarise(times, nbytes / 1e6, "streamio index, 1 worker")
    res["shards"] = len([n for n in os.listdir(shards) if n.endswith(".tar")])
    res["MB"] = nbytes / 1e6
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1000)
    ap.add_argument("--sample-kb", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import ray
    import ray.data

    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as scratch:
        src = os.path.join(scratch, "src")
        src_bytes = make_source(src, args.size_mb * 1_000_000, args.sample_kb * 1000)
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        ray_start = time.perf_counter() - t0
        print(f"source: {src_bytes / 1e6:.0f} MB, {len(files(src))} samples; Ray started in {ray_start:.1f} s")
        shard, kept = shard_section(src, src_bytes, args.rounds, scratch)
        index = index_section(kept, args.rounds, scratch)
        ray.shutdown()
    res = {"size_mb": args.size_mb, "sample_kb": args.sample_kb, "rounds": args.rounds, "source_MB": src_bytes / 1e6,
           "ray_start_s": ray_start, "shard_MB": SHARD_BYTES / 1e6, "shard": shard, "index": index}
    for part in ("shard", "index"):
        for name, r in res[part]["MBps"].items():
            print(f"{part}: {name:<44} {statistics.median([r['median']]):7.0f} MB/s "
                  f"({res[part]['vs_one_worker'][name]:.2f}x one worker)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
