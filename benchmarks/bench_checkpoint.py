"""Checkpoint save/restore: streamio vs torch.save + one object vs torch DCP vs the store's ceiling.

Same process, same state (an MLP of ``--size-mb``/3 of float32 parameters + Adam's two moments:
``--size-mb 1200`` is the ~100M-parameter, 1.2 GB case of issue 7), contenders interleaved, medians
of ``--reps`` after one untimed warm-up each, to local disk and to S3 (moto in a child process):

* ``streamio``        CheckpointManager, async: ``blocked`` (save returns) and ``durable`` (wait
                      returns, latest.json written), and ``restore`` (verified, in place).
* ``torch.save``      torch.save to a BytesIO + one PUT (disk: one file + fsync) / one GET +
                      torch.load(weights_only=True).
* ``dcp``             torch.distributed.checkpoint, FileSystemWriter (disk) or FsspecWriter (S3),
                      thread_count=8, sync_files=False on S3; ``dcp.async_save`` for blocked /
                      durable; load via get_state_dict / set_state_dict.
* ``ceiling``         the same bytes as streamio's parts written with 8 parallel PUTs (boto3) or
                      parallel file writes + fsync, read back with 8 parallel whole-object GETs.
* ``copy``            a plain copy of the state into reused host buffers (what blocking costs).

Run:  .venv/bin/python -m benchmarks.bench_checkpoint --size-mb 300 --reps 3
moto caveats (docs/design.md "Measured behaviour"): uploads ~0.13-0.20 GB/s whatever the concurrency; ranged GETs
read the whole object, so streamio reads whole parts (no ranges) on restore.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    MB,
    S3Servers,
    clean_aws_env,
    interleave,
    machine,
    machine_line,
    phase_seconds,
    ratio,
    summary,
)
from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions

PART = 64 << 20


def build_state(size_mb: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP with ~size_mb/3 MB of float32 parameters and Adam state (moments filled)."""
    width = 2048
    layers = max(1, round(size_mb * MB / 3 / 4 / (width * width + width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    opt.step()
    return model, opt


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    n = sum(p.numel() * 4 for p in model.parameters())
    return n * 3


class RssPeak:
    """Samples this process's RSS every 5 ms; ``peak - base`` is the extra memory of a section."""

    def __init__(self) -> None:
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.005)

    def __enter__(self) -> RssPeak:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Bench:
    def __init__(self, target: str, root: str, options: dict[str, Any], model: torch.nn.Module,
                 opt: torch.optim.Optimizer, s3: Any = None) -> None:
        self.target, self.root, self.options = target, root.rstrip("/"), options
        self.model, self.opt, self.s3 = model, opt, s3
        self.state = {"model": model, "optim": opt}
        self.mgr = CheckpointManager(f"{self.root}/streamio", storage_options=options, retention=KeepLast(1),
                                     options=SaveOptions(part_size=PART, concurrency=8))
        self.step = 0
        self.results: dict[str, list[float]] = {}
        self.extra_rss: list[int] = []
        self.copy_bufs: list[torch.Tensor] | None = None
        self.client = s3.boto3_client() if s3 is not None else None

    def record(self, name: str, value: float) -> None:
        self.results.setdefault(name, []).append(value)

    # ---------------------------------------------------------------- streamio
    def streamio_save(self) -> float:
        """streamio's phases as its own instruments report them (streamio_checkpoint_seconds), checked
        against this benchmark's clock around the call: a metric that disagrees fails the run."""
        self.step += 1
        before = phase_seconds()
        with RssPeak() as rss:
            t0 = time.perf_counter()
            self.mgr.save(self.step, self.state)
            outside = time.perf_counter() - t0
            stats = self.mgr.wait()
        assert stats is not None
        spent = phase_seconds(before)
        assert spent["blocked"] <= outside + 1e-3 and abs(spent["durable"] - stats.durable_s) < 1e-6, (spent, stats)
        self.record("streamio.blocked", spent["blocked"])
        self.record("streamio.durable", spent["durable"])
        self.extra_rss.append(rss.peak - rss.base)
        return spent["durable"]

    def streamio_restore(self) -> float:
        before = phase_seconds()
        t0 = time.perf_counter()
        self.mgr.restore(self.state)  # a resuming job's manager (its client already made, as boto3's is)
        outside = time.perf_counter() - t0
        inside = phase_seconds(before)["restore"]
        assert inside <= outside + 1e-3, (inside, outside)
        self.record("streamio.restore", inside)
        return inside

    # ---------------------------------------------------------------- copy reference
    def copy(self) -> float:
        tensors = list(self.model.state_dict().values()) + [
            v for s in self.opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        if self.copy_bufs is None:
            self.copy_bufs = [torch.empty_like(t) for t in tensors]
        t0 = time.perf_counter()
        for b, t in zip(self.copy_bufs, tensors, strict=True):
            b.copy_(t)
        dt = time.perf_counter() - t0
        self.record("copy", dt)
        return dt

    # ---------------------------------------------------------------- torch.save + one object
    def torch_save(self) -> float:
        t0 = time.perf_counter()
        buf = io.BytesIO()
        torch.save({"model": self.model.state_dict(), "optim": self.opt.state_dict()}, buf)
        data = buf.getbuffer()
        if self.client is not None:
            self.client.put_object(Bucket=self.s3.bucket, Key="torchsave/ckpt.pt", Body=bytes(data))
        else:
            os.makedirs(f"{self.root}/torchsave", exist_ok=True)
            with open(f"{self.root}/torchsave/ckpt.pt", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        dt = time.perf_counter() - t0
        self.record("torch.save", dt)
        return dt

    def torch_load(self) -> float:
        t0 = time.perf_counter()
        if self.client is not None:
            data = self.client.get_object(Bucket=self.s3.bucket, Key="torchsave/ckpt.pt")["Body"].read()
        else:
            data = Path(f"{self.root}/torchsave/ckpt.pt").read_bytes()
        sd = torch.load(io.BytesIO(data), weights_only=True)
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["optim"])
        dt = time.perf_counter() - t0
        self.record("torch.load", dt)
        return dt

    # ---------------------------------------------------------------- torch DCP
    def _dcp_io(self, write: bool) -> Any:
        from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

        path = f"{self.root}/dcp"
        if self.target == "disk":
            return FileSystemWriter(path, thread_count=8) if write else FileSystemReader(path)
        if write:
            return FsspecWriter(path, thread_count=8, sync_files=False, **self.options)
        return FsspecReader(path, **self.options)

    def dcp_save(self, use_async: bool) -> float:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.opt)
        t0 = time.perf_counter()
        if use_async:
            fut = dcp.async_save({"model": msd, "optim": osd}, storage_writer=self._dcp_io(True))
            blocked = time.perf_counter() - t0
            fut.result()
            self.record("dcp.async.blocked", blocked)
            name = "dcp.async.durable"
        else:
            dcp.save({"model": msd, "optim": osd}, storage_writer=self._dcp_io(True))
            name = "dcp.save"
        dt = time.perf_counter() - t0
        self.record(name, dt)
        return dt

    def dcp_load(self) -> float:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        t0 = time.perf_counter()
        msd, osd = get_state_dict(self.model, self.opt)
        sd = {"model": msd, "optim": osd}
        dcp.load(sd, storage_reader=self._dcp_io(False))
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        dt = time.perf_counter() - t0
        self.record("dcp.load", dt)
        return dt

    # ---------------------------------------------------------------- ceiling
    def _chunks(self) -> list[bytes]:
        if not hasattr(self, "_chunk_cache"):
            total = state_bytes(self.model, self.opt)
            blob = os.urandom(min(total, PART))
            self._chunk_cache = [blob[: min(PART, total - s)] for s in range(0, total, PART)]
        return self._chunk_cache

    def ceiling_put(self) -> float:
        chunks = self._chunks()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            if self.client is not None:
                bucket = self.s3.bucket
                list(pool.map(lambda ic: self.client.put_object(Bucket=bucket, Key=f"ceiling/{ic[0]}", Body=ic[1]),
                              enumerate(chunks)))
            else:
                os.makedirs(f"{self.root}/ceiling", exist_ok=True)
                list(pool.map(lambda ic: _write_fsync(f"{self.root}/ceiling/{ic[0]}", ic[1]), enumerate(chunks)))
        dt = time.perf_counter() - t0
        self.record("ceiling.put", dt)
        return dt

    def ceiling_get(self) -> float:
        n = len(self._chunks())
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            if self.client is not None:
                bucket = self.s3.bucket
                list(pool.map(lambda i: self.client.get_object(Bucket=bucket, Key=f"ceiling/{i}")["Body"].read(),
                              range(n)))
            else:
                list(pool.map(lambda i: Path(f"{self.root}/ceiling/{i}").read_bytes(), range(n)))
        dt = time.perf_counter() - t0
        self.record("ceiling.get", dt)
        return dt

    def contenders(self) -> dict[str, Callable[[], float]]:
        return {
            "copy": self.copy,
            "streamio.save": self.streamio_save,
            "streamio.restore": self.streamio_restore,
            "torch.save": self.torch_save,
            "torch.load": self.torch_load,
            "dcp.save": lambda: self.dcp_save(False),
            "dcp.async": lambda: self.dcp_save(True),
            "dcp.load": self.dcp_load,
            "ceiling.put": self.ceiling_put,
            "ceiling.get": self.ceiling_get,
        }


def _write_fsync(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def report(target: str, b: Bench, nbytes: int) -> dict[str, Any]:
    med = {k: summary(v)["median"] for k, v in b.results.items()}
    ratios = {
        "blocked / copy (target <= 1.5)": ratio(med["streamio.blocked"], med["copy"]),
        "durable / ceiling.put (target <= 1.25)": ratio(med["streamio.durable"], med["ceiling.put"]),
        "restore speed / ceiling.get (target >= 0.8)": ratio(med["ceiling.get"], med["streamio.restore"]),
        "restore speed / dcp.load (target >= 5)": ratio(med["dcp.load"], med["streamio.restore"]),
        "durable speedup vs torch.save+put": ratio(med["torch.save"], med["streamio.durable"]),
        "durable speedup vs dcp.save": ratio(med["dcp.save"], med["streamio.durable"]),
        "restore speedup vs get+torch.load": ratio(med["torch.load"], med["streamio.restore"]),
        "blocked: dcp.async / streamio": ratio(med["dcp.async.blocked"], med["streamio.blocked"]),
        "peak extra RSS during save / state": ratio(max(b.extra_rss), nbytes),
    }
    print(f"\n== {target}: state {nbytes / MB:.0f} MB, medians of {len(b.results['copy'])} (s; GB/s)")
    for k in sorted(med):
        v = summary(b.results[k])
        print(f"  {k:<22} {v['median']:8.3f} s  [{v['min']:.3f}-{v['max']:.3f}]  "
              f"{nbytes / v['median'] / 1e9:6.2f} GB/s")
    for k, v in ratios.items():
        print(f"  {k:<45} {v:6.2f}")
    return {"medians_s": med, "runs_s": b.results, "ratios": ratios, "extra_rss_bytes": b.extra_rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=300, help="state size (params + Adam); 1200 = issue 7's 100M params")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--targets", default="disk,s3")
    ap.add_argument("--json", type=Path, help="write all figures here")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING)
    clean_aws_env()
    model, opt = build_state(args.size_mb)
    nbytes = state_bytes(model, opt)
    print(machine_line(machine()))
    out: dict[str, Any] = {"size_bytes": nbytes, "reps": args.reps}
    for target in args.targets.split(","):
        tmp = tempfile.mkdtemp(prefix="bench-ckpt-")
        servers = None
        try:
            if target == "disk":
                b = Bench("disk", tmp, {}, model, opt)
            else:
                servers = S3Servers(proxies=1, latency=0.0).start()
                s3 = servers.s3
                from streamio.testing import S3Endpoint

                s3 = S3Endpoint(servers.moto, s3.bucket)
                b = Bench("s3", s3.url(f"run-{uuid.uuid4().hex[:6]}"), s3.storage_options(), model, opt, s3=s3)
            contenders = b.contenders()
            interleave(contenders, 1, log=lambda line: print("warm-up", line, flush=True))
            b.results.clear()
            b.extra_rss.clear()
            interleave(contenders, args.reps, log=lambda line: print(line, flush=True))
            out[target] = report(target, b, nbytes)
            b.mgr.close()
        finally:
            if servers is not None:
                servers.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    sys.exit(main())
