"""Read throughput of streamio's prefetching, caching shard reader against its ceilings.

Run: ``.venv/bin/python benchmarks/bench_read.py`` (``--quick`` for 8 shards x 3 rounds;
``--json`` for machine-readable output).

Setup: 32 shards x 16 MB of random bytes in a moto S3 server, reached through the FaultProxy with
30 ms first-byte latency on every response. Server and proxy run in a *separate process*
(``--serve``), so they do not share the reader's GIL. Contenders, interleaved round by round (the
order rotates each round) and reported as medians:

* ``boto3_parallel``   — raw whole-object GETs with boto3 on 16 threads: the network ceiling.
* ``s3fs_sequential``  — plain ``s3fs`` ``cat_file`` of each shard, one after another.
* ``streamio_nocache`` — ``Prefetcher`` without a cache (streaming GETs, 16 runs ahead, as boto3).
* ``streamio_cold``    — ``Prefetcher`` + an empty ``ShardCache`` (tee to local disk, CRC32C
  verified, atomic commit), 16 runs ahead.
* ``local_write``      — writing the same number of bytes to new local files in 1 MB pieces: the
  disk-side ceiling of any reader that caches (the tee cannot outrun it).
* ``streamio_warm``    — the same, every shard already cached (no network).
* ``local_sequential`` — plain ``open().read()`` in 4 MB pieces of the same cached files: the
  local ceiling for the warm case.

Caveats (docs/design.md "Measured behaviour"): moto makes every ranged GET read the whole object, and serves
~1.1-1.25 GB/s at best with 8 parallel downloads, so absolute network numbers are moto's; compare
ratios against ``boto3_parallel`` measured in the same run. The machine has 2 shared cores.
(webdataset / litdata / mosaicml-streaming comparisons belong to the shared benchmark suite.)
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamio.checksum import checksum_bytes  # noqa: E402
from streamio.data.cache import CacheConfig, ShardCache  # noqa: E402
from streamio.data.format.index import ShardInfo  # noqa: E402
from streamio.data.read.prefetch import ByteRun, PrefetchConfig, Prefetcher  # noqa: E402
from streamio.storage import Store  # noqa: E402
from streamio.testing import S3Endpoint  # noqa: E402

MB = 1 << 20


def serve(latency: float) -> None:
    """Child mode: moto + FaultProxy in this process; print their URLs; live until stdin closes."""
    from streamio.testing import FaultProxy, MotoServer

    server = MotoServer()
    endpoint = server.start()
    proxy = FaultProxy(endpoint).start()
    proxy.set_latency(latency)
    print(json.dumps({"moto": endpoint, "proxy": proxy.endpoint_url}), flush=True)
    sys.stdin.read()
    proxy.stop()
    server.stop()


def _drain(chunks: Any) -> int:
    return sum(len(c) for c in chunks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--shard-mb", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--latency", type=float, default=0.03)
    ap.add_argument("--workers", type=int, default=16, help="prefetch depth (runs in flight); 16 = boto3's threads")
    ap.add_argument("--quick", action="store_true", help="8 shards, 3 rounds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.serve:
        serve(args.latency)
        return
    if args.quick:
        args.shards, args.rounds = 8, 3
    for name in list(os.environ):
        if name.startswith("AWS_"):
            del os.environ[name]  # the host's AWS_* must not leak into boto3 / s3fs here

    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--latency", str(args.latency)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        urls = json.loads(child.stdout.readline())  # type: ignore[union-attr]
        results = run(args, urls["moto"], urls["proxy"])
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait(timeout=30)
    report(args, results)


def run(args: argparse.Namespace, moto: str, proxy_url: str) -> dict[str, list[float]]:
    s3 = S3Endpoint(moto, "unused").new_bucket()
    shards = _upload(s3, args.shards, args.shard_mb * MB)
    c = _Contenders(s3, shards, args.shard_mb * MB, proxy_url, args.workers)
    c.fill_warm()  # fill the warm cache once (and warm every code path)
    results = _rounds(c, args.rounds)
    shutil.rmtree(c.tmp, ignore_errors=True)
    return results


def _upload(s3: S3Endpoint, count: int, size: int) -> list[ShardInfo]:
    """``count`` shards of ``size`` random bytes, PUT directly (no proxy); their index entries."""
    direct = s3.boto3_client()
    shards: list[ShardInfo] = []
    t0 = time.perf_counter()
    for i in range(count):
        data = os.urandom(size)
        path = f"bench/shard-{i:06d}.tar"
        direct.put_object(Bucket=s3.bucket, Key=path, Body=data)
        shards.append(ShardInfo(path.split("/", 1)[1], size, 1, checksum_bytes(data)))
    print(f"uploaded {count} x {size // MB} MB in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    return shards


class _Contenders:
    """The contenders of the module docstring, each a method returning the bytes it read (or wrote)."""

    NAMES = ("boto3_parallel", "s3fs_sequential", "streamio_nocache", "streamio_cold", "local_write", "streamio_warm",
             "local_sequential")

    def __init__(self, s3: S3Endpoint, shards: list[ShardInfo], size: int, proxy_url: str, workers: int) -> None:
        import s3fs

        self.s3, self.shards, self.size = s3, shards, size
        self.total = len(shards) * self.size
        self.store = Store(s3.url("bench"), s3.storage_options(proxy_url))
        self.client = s3.boto3_client(proxy_url)
        self.fs = s3fs.S3FileSystem(**s3.storage_options(proxy_url))
        self.tmp = Path(tempfile.mkdtemp(prefix="streamio-bench-"))
        self.warm_dir = self.tmp / "warm"
        self.runs = [ByteRun(s) for s in shards]
        self.pcfg = PrefetchConfig(workers=workers, max_bytes=256 * MB)
        self.payload = os.urandom(self.size)

    def functions(self) -> dict[str, Callable[[], int]]:
        return {name: getattr(self, name) for name in self.NAMES}

    def cache_at(self, d: Path) -> ShardCache:
        return ShardCache(CacheConfig(d, max_bytes=self.total + 64 * MB, min_free_bytes=0))

    def fill_warm(self) -> None:
        cache = self.cache_at(self.warm_dir)
        sum(_drain(c) for _, c in Prefetcher(self.store, self.runs, cache=cache, config=self.pcfg))

    def boto3_parallel(self) -> int:
        def get(s: ShardInfo) -> int:
            return len(self.client.get_object(Bucket=self.s3.bucket, Key=f"bench/{s.path}")["Body"].read())

        with ThreadPoolExecutor(16) as pool:
            return sum(pool.map(get, self.shards))

    def s3fs_sequential(self) -> int:
        return sum(len(self.fs.cat_file(f"{self.s3.bucket}/bench/{s.path}")) for s in self.shards)

    def streamio_nocache(self) -> int:
        return sum(_drain(c) for _, c in Prefetcher(self.store, self.runs, config=self.pcfg))

    def wipe_cold(self) -> None:  # untimed: deleting 512 MB (TRIM on this mount) is not reading
        shutil.rmtree(self.tmp / "cold", ignore_errors=True)
        shutil.rmtree(self.tmp / "written", ignore_errors=True)

    def streamio_cold(self) -> int:
        cache = self.cache_at(self.tmp / "cold")
        return sum(_drain(c) for _, c in Prefetcher(self.store, self.runs, cache=cache, config=self.pcfg))

    def local_write(self) -> int:
        d = self.tmp / "written"
        d.mkdir()
        for i in range(len(self.shards)):
            with open(d / f"{i}", "wb", buffering=0) as f:
                for off in range(0, self.size, MB):
                    f.write(self.payload[off : off + MB])
        return self.total

    def streamio_warm(self) -> int:
        pf = Prefetcher(self.store, self.runs, cache=self.cache_at(self.warm_dir), config=self.pcfg)
        n = sum(_drain(c) for _, c in pf)
        assert pf.stats.bytes_from_network == 0, pf.stats.as_dict()
        return n

    def local_sequential(self) -> int:
        n = 0
        for name in sorted(os.listdir(self.warm_dir)):
            if name.endswith(".data"):
                with open(self.warm_dir / name, "rb", buffering=0) as f:
                    while chunk := f.read(4 * MB):
                        n += len(chunk)
        return n


def _rounds(c: _Contenders, rounds: int) -> dict[str, list[float]]:
    """``rounds`` rounds of every contender, the order rotating each round; MB/s per run."""
    contenders = c.functions()
    total = c.total
    results: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            c.wipe_cold()
            t = time.perf_counter()
            n = contenders[name]()
            dt = time.perf_counter() - t
            if n != total:
                raise RuntimeError(f"{name} read {n} bytes, expected {total}")
            results[name].append(total / dt / 1e6)
            print(f"round {r} {name:18s} {total / dt / 1e6:8.1f} MB/s", file=sys.stderr)
    return results


def report(args: argparse.Namespace, results: dict[str, list[float]]) -> None:
    med = {k: statistics.median(v) for k, v in results.items()}
    ratios = {
        "cold / boto3_parallel": med["streamio_cold"] / med["boto3_parallel"],
        "cold / s3fs_sequential": med["streamio_cold"] / med["s3fs_sequential"],
        "cold / min(boto3, local_write)": med["streamio_cold"] / min(med["boto3_parallel"], med["local_write"]),
        "nocache / boto3_parallel": med["streamio_nocache"] / med["boto3_parallel"],
        "warm / local_sequential": med["streamio_warm"] / med["local_sequential"],
    }
    if args.json:
        print(json.dumps({"args": vars(args), "median_MBps": med, "ratios": ratios, "runs": results}, indent=2))
        return
    print(f"{args.shards} shards x {args.shard_mb} MB, {args.latency * 1000:.0f} ms first-byte latency, "
          f"{args.rounds} rounds interleaved, prefetch depth {args.workers}; medians (min-max) in MB/s")
    for k, v in results.items():
        print(f"  {k:18s} {med[k]:8.1f}  ({min(v):.1f}-{max(v):.1f})")
    for k, v in ratios.items():
        print(f"  {k:32s} {v:5.2f}x")


if __name__ == "__main__":
    main()
