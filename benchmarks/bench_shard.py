"""Sharding throughput: ``streamio`` writer beside webdataset's ``ShardWriter`` and a plain copy.

Run: ``.venv/bin/python benchmarks/bench_shard.py`` (``--size-mb 1000 --sample-kb 100`` by default;
``--targets local,s3,read,index``; ``--rounds N``).

What is measured (contenders interleaved round by round; the median is reported):

1. ``local``: ~1 GB of ~100 KB incompressible samples (+ a small ``cls`` field) sharded to local
   disk in 256 MB shards by ``write_dataset`` (tar, and tar.zst as an extra row) and by
   ``webdataset.ShardWriter``; the limit is a plain ``shutil.copyfile`` of the same shard bytes.
   No contender fsyncs: this is the write path into the page cache, as users run it.
2. ``s3``: the same to moto S3 (run as a separate process so its CPU does not share our GIL):
   ``write_dataset`` (shard N+1 is built while shard N uploads) vs ``ShardWriter`` writing local
   files with a ``post=`` hook uploading each finished one with boto3 (the documented way), vs
   boto3 ``put_object`` of the same shard bytes (the limit through the same server). moto is slow
   on writes (~0.13-0.2 GB/s, docs/design.md): these are ratios to that ceiling, not S3 figures.
3. ``read``: reading the warm local shards back: ``iter_samples`` without and with per-sample
   CRC32C verification vs ``webdataset.WebDataset`` (no decoding).
4. ``index``: loading a 5,000-shard index (layouts in sidecars) and one shard's sidecar.

Samples are built once, before timing. MB are 10^6 bytes of shard output.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from streamio.checksum import checksum_bytes  # noqa: E402
from streamio.data.format.index import encode_layout, load_index  # noqa: E402
from streamio.data.format.layout import FORMAT, INDEX_NAME, SampleLayout, ShardInfo, sidecar_path  # noqa: E402
from streamio.data.format.samples import iter_samples  # noqa: E402
from streamio.data.write.writer import ShardSpec, write_dataset  # noqa: E402
from streamio.storage import Store  # noqa: E402

SHARD_BYTES = 256_000_000


def make_samples(total: int, size: int) -> list[dict[str, Any]]:
    pool = os.urandom(64 << 20)
    n = max(1, total // size)
    step = 7919 * 64
    return [
        {"__key__": f"{i:08d}", "jpg": pool[(o := (i * step) % (len(pool) - size)) : o + size],
         "cls": str(i % 1000).encode()}
        for i in range(n)
    ]


def tree_bytes(root: str) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


# ----------------------------------------------------------------------------- contenders
def streamio_local(samples: list[dict[str, Any]], out: str, compression: str | None = None) -> int:
    index = write_dataset(samples, out, spec=ShardSpec(max_bytes=SHARD_BYTES, compression=compression))
    return sum(s.bytes for s in index.shards)


def wds_local(samples: list[dict[str, Any]], out: str, post: Callable[[str], None] | None = None) -> int:
    import webdataset as wds

    os.makedirs(out, exist_ok=True)
    with wds.ShardWriter(os.path.join(out, "data-%06d.tar"), maxsize=SHARD_BYTES, verbose=0, post=post) as sink:
        for s in samples:
            sink.write(s)
    return tree_bytes(out)


def copy_local(src: str, out: str) -> int:
    os.makedirs(out, exist_ok=True)
    for name in sorted(os.listdir(src)):
        shutil.copyfile(os.path.join(src, name), os.path.join(out, name))
    return tree_bytes(out)


def write_fsync_local(blobs: list[tuple[str, bytes]], out: str) -> int:
    """The same shard bytes, already in memory, written and fsynced (what a durable writer must do)."""
    os.makedirs(out, exist_ok=True)
    for name, data in blobs:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return sum(len(d) for _, d in blobs)


def reference(samples: list[dict[str, Any]], scratch: str) -> str:
    """streamio's shards of ``samples``, written once: the bytes the copy contenders move."""
    ref = os.path.join(scratch, "reference")
    if not os.path.exists(os.path.join(ref, INDEX_NAME)):
        streamio_local(samples, ref)
    return ref


Rates = dict[str, list[tuple[float, float]]]  # contender -> [(MB/s wall, MB per CPU-second of this process)]


def run_rounds(contenders: dict[str, Callable[[str], int]], rounds: int, scratch: str) -> Rates:
    """Run every contender ``rounds`` times, interleaved (order alternates each round).

    Besides wall-clock MB/s, MB per CPU-second of this process is recorded: on a shared machine
    wall time moves with other people's load, the CPU a contender spends does much less.
    """
    rates: Rates = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders) if r % 2 == 0 else list(reversed(contenders))
        for name in order:
            out = os.path.join(scratch, f"{name}-{uuid.uuid4().hex[:6]}".replace(" ", "_"))
            t0, c0 = time.perf_counter(), time.process_time()
            nbytes = contenders[name](out)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            rates[name].append((nbytes / dt / 1e6, nbytes / max(cpu, 1e-9) / 1e6))
            print(f"  round {r} {name:<24} {nbytes / 1e6:6.0f} MB {dt:7.2f} s {nbytes / dt / 1e6:6.0f} MB/s "
                  f"cpu {cpu:6.2f} s {nbytes / max(cpu, 1e-9) / 1e6:6.0f} MB/cpu-s", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    return rates


def summarise(title: str, rates: Rates, ours: str, peer: str, limit: str) -> dict[str, Any]:
    med = {k: statistics.median(w for w, _ in v) for k, v in rates.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in rates.items()}
    print(f"\n{title}: median MB/s " + ", ".join(f"{k} {v:.0f}" for k, v in med.items()))
    print(f"{title}: median MB per CPU-second " + ", ".join(f"{k} {v:.0f}" for k, v in cpu.items()))
    print(f"  wall: {ours} / {peer} = {med[ours] / med[peer]:.2f}x   {ours} / {limit} = {med[ours] / med[limit]:.2f}x")
    print(f"  cpu:  {ours} / {peer} = {cpu[ours] / cpu[peer]:.2f}x\n")
    return {"median_MBps": med, "MB_per_cpu_s": cpu, "vs_peer": med[ours] / med[peer],
            "vs_limit": med[ours] / med[limit], "cpu_vs_peer": cpu[ours] / cpu[peer]}


# ----------------------------------------------------------------------------- sections
def bench_local(samples: list[dict[str, Any]], rounds: int, scratch: str) -> dict[str, Any]:
    ref = reference(samples, scratch)
    blobs = [(name, Path(ref, name).read_bytes()) for name in sorted(os.listdir(ref)) if name.endswith(".tar")]
    contenders: dict[str, Callable[[str], int]] = {
        "streamio tar": lambda out: streamio_local(samples, out),
        "webdataset ShardWriter": lambda out: wds_local(samples, out),
        "plain copy": lambda out: copy_local(ref, out),
        "write+fsync from memory": lambda out: write_fsync_local(blobs, out),
        "streamio tar.zst": lambda out: streamio_local(samples, out, "zstd"),
    }
    rates = run_rounds(contenders, rounds, scratch)
    result = summarise("local disk", rates, "streamio tar", "webdataset ShardWriter", "plain copy")
    result["vs_write_fsync"] = result["median_MBps"]["streamio tar"] / result["median_MBps"]["write+fsync from memory"]
    print(f"  streamio tar / write+fsync from memory = {result['vs_write_fsync']:.2f}x "
          f"(streamio's local put is temp file + fsync + rename)\n")
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_s3(samples: list[dict[str, Any]], rounds: int, scratch: str) -> dict[str, Any]:
    import boto3
    from botocore.config import Config

    port = _free_port()
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    creds = {"key": "bench", "secret": "bench"}
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                              region_name="us-east-1", config=Config(max_pool_connections=16))
        for _ in range(100):
            try:
                client.create_bucket(Bucket="bench")
                break
            except Exception:  # noqa: BLE001 - server still starting
                time.sleep(0.1)
        options = {**creds, "endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}
        ref = reference(samples, scratch)
        ref_files = sorted(n for n in os.listdir(ref) if n.endswith(".tar"))

        def ours(out: str) -> int:
            prefix = uuid.uuid4().hex[:8]
            index = write_dataset(
                samples, Store(f"s3://bench/{prefix}", options), spec=ShardSpec(max_bytes=SHARD_BYTES),
            )
            return sum(s.bytes for s in index.shards)

        def theirs(out: str) -> int:
            prefix = uuid.uuid4().hex[:8]

            def upload(fname: str) -> None:
                client.upload_file(fname, "bench", f"{prefix}/{os.path.basename(fname)}")
                os.unlink(fname)

            wds_local(samples, out, post=upload)
            return sum(o["Size"] for o in client.list_objects_v2(Bucket="bench", Prefix=prefix + "/")["Contents"])

        def copy(out: str) -> int:
            prefix = uuid.uuid4().hex[:8]
            total = 0
            for name in ref_files:
                data = Path(ref, name).read_bytes()
                client.put_object(Bucket="bench", Key=f"{prefix}/{name}", Body=data)
                total += len(data)
            return total

        rates = run_rounds({"streamio -> s3": ours, "webdataset + boto3": theirs, "boto3 put_object": copy}, rounds,
                           scratch)
        return summarise("moto S3", rates, "streamio -> s3", "webdataset + boto3", "boto3 put_object")
    finally:
        server.terminate()
        server.wait(timeout=30)


def bench_read(samples: list[dict[str, Any]], rounds: int, scratch: str) -> dict[str, Any]:
    import webdataset as wds

    root = os.path.join(scratch, "read")
    write_dataset(samples, root, spec=ShardSpec(max_bytes=SHARD_BYTES))
    store = Store(root)
    index = load_index(store)
    total = sum(s.bytes for s in index.shards)

    def chunks(path: str) -> Any:
        with open(os.path.join(root, path), "rb") as f:
            while chunk := f.read(8 << 20):
                yield chunk

    def ours(verify: bool) -> int:
        n = 0
        for i, s in enumerate(index.shards):
            layout = index.layout(i, store) if verify else None
            n += sum(1 for _ in iter_samples(chunks(s.path), url=s.path, layout=layout))
        return n

    def theirs() -> int:
        pattern = os.path.join(root, f"data-{{000000..{len(index.shards) - 1:06d}}}.tar")
        return sum(1 for _ in wds.WebDataset(pattern, shardshuffle=False))

    fns = {"streamio iter_samples": lambda: ours(False), "streamio verified": lambda: ours(True), "webdataset": theirs}
    rates: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(max(rounds, 3)):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            n = fn()
            dt = time.perf_counter() - t0
            assert n == len(samples)
            rates[name].append(total / dt / 1e6)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("warm local read: median MB/s " + ", ".join(f"{k} {v:.0f}" for k, v in med.items()))
    print(f"  verified / webdataset = {med['streamio verified'] / med['webdataset']:.2f}x, "
          f"unverified / webdataset = {med['streamio iter_samples'] / med['webdataset']:.2f}x\n")
    shutil.rmtree(root, ignore_errors=True)
    return {"median_MBps": med}


def bench_index() -> dict[str, Any]:
    store = Store(f"memory://bench-{uuid.uuid4().hex}")
    n, per = 5000, 2500
    layout = SampleLayout(tuple(range(0, (per + 1) * 100_000, 100_000)), tuple(range(per)))
    blob = encode_layout(layout)
    shards = [ShardInfo(f"data-{i:06d}.tar", per * 100_000 + 1024, per, "crc32c:0123abcd") for i in range(n)]
    doc = {"format": FORMAT, "samples": n * per, "keys": ["cls", "jpg"], "compression": None, "shards": [
        {"path": s.path, "bytes": s.bytes, "samples": s.samples, "checksum": s.checksum,
         "layout": sidecar_path(s.path), "layout_checksum": checksum_bytes(blob)} for s in shards]}
    store.put(INDEX_NAME, json.dumps(doc).encode())
    store.put(sidecar_path(shards[17].path), blob)
    times, side = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        index = load_index(store)
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        index.layout(17, store)
        side.append(time.perf_counter() - t0)
    size = len(store.read(INDEX_NAME))
    print(f"5,000-shard index ({size / 1e6:.2f} MB): load {statistics.median(times) * 1e3:.1f} ms, "
          f"one sidecar ({len(blob) / 1e3:.0f} KB) {statistics.median(side) * 1e3:.2f} ms\n")
    return {"index_bytes": size, "load_ms": statistics.median(times) * 1e3, "sidecar_ms": statistics.median(side) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=int, default=1000)
    parser.add_argument("--sample-kb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--targets", default="local,s3,read,index")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    warnings.simplefilter("ignore", ResourceWarning)  # webdataset leaves shard files open
    import webdataset  # noqa: F401 - imports torch (seconds): never inside a timed run
    targets = args.targets.split(",")
    samples = make_samples(args.size_mb * 1_000_000, args.sample_kb * 1000)
    print(f"{len(samples)} samples of {args.sample_kb} KB (+ cls), {args.size_mb} MB, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs\n", flush=True)
    results: dict[str, Any] = {"samples": len(samples), "size_mb": args.size_mb}
    with tempfile.TemporaryDirectory(prefix="bench-shard-", dir=os.environ.get("BENCH_DIR")) as scratch:
        if "local" in targets:
            results["local"] = bench_local(samples, args.rounds, scratch)
        if "s3" in targets:
            results["s3"] = bench_s3(samples, args.rounds, scratch)
        if "read" in targets:
            results["read"] = bench_read(samples, args.rounds, scratch)
    if "index" in targets:
        results["index"] = bench_index()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
