"""Sharded checkpoints (issue 16): FSDP2 + Adam on real gloo ranks, streamio vs torch DCP vs ceilings.

Run: ``.venv/bin/python -m benchmarks.bench_sharded [--quick] [--json OUT]`` (or as the ``sharded``
section of ``python -m benchmarks.run``).

State: an MLP of ``width x width`` linear layers + Adam (moments filled by one real step), sharded
with FSDP2 (``fully_shard`` per layer and on the root) over 2 CPU ranks: ``--size-mb`` (300) of
parameters and moments *per rank*, twice that in all. Every rank is its own process in one gloo
group (``init_process_group`` from ``MASTER_ADDR`` / ``RANK``), started by this driver; moto runs
in a child process (:class:`benchmarks.common.S3Servers`, no added latency). Per target (local
disk, S3 on moto), the contenders run interleaved, one untimed warm-up then ``--reps``
repetitions, each bracketed by barriers, so a time is the job's: from all ranks starting to the
last one finishing.

* ``streamio.save``   ``CheckpointManager.save(step, {"app": ShardedModelState(model, opt)})``,
                      async, ``KeepLast(1)``: ``streamio.blocked`` (until ``save`` returns on the
                      slowest rank), ``streamio.durable`` (``SaveStats.durable_s``, the slowest
                      rank's: from the ``save`` call until ``latest.json`` names the step; 64 MiB
                      parts at most, 8 threads per rank) and ``streamio.wait`` (until ``wait``
                      returns on every rank: also rank 0's deletion of the previous step).
                      The other contenders write each save to a new place and the one before
                      the last is deleted untimed, so no contender pays for deleting or
                      overwriting an old checkpoint in its time.
* ``streamio.restore`` ``restore`` of the latest step into the live state (verified, in place).
* ``dcp.save/load``   ``torch.distributed.checkpoint.save/load`` of ``get_state_dict`` (and
                      ``set_state_dict`` after loading): ``FileSystemWriter/Reader`` on disk
                      (``thread_count=8``, ``sync_files=True``: durable), the fsspec
                      ``FsspecWriter/Reader`` on S3 (``thread_count=8``, ``sync_files=False``).
* ``streamio-dcp.save/load`` the same ``dcp.save/load`` calls with streamio's ``StreamioWriter`` /
                      ``StreamioReader`` (streamio's commit, checksums and parallel transfers).
* ``ceiling.put/get`` each rank writes the sizes of its own streamio parts with 8 parallel PUTs
                      (boto3) or parallel file writes + fsync, and reads them back with 8 parallel
                      whole-object GETs (disk: reads, page cache warm), both ranks at once.
* ``copy``            each rank copies its local shards into reused buffers (what blocking costs).

Then groups of 1 rank (a plain module) and 3 ranks (FSDP2) restore the 2-rank checkpoints
(``streamio.restore`` of the manager's latest step, ``dcp.load`` of DCP's and
``streamio-dcp.load`` of the ``StreamioWriter`` save): resharded restores, timed the same way.
moto caveat: every ranged GET makes moto read the whole object, so resharded reads (ranged)
cost more there than on a real store.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import MB, REPO, S3Servers, free_port, interleave, phase_seconds, ratio, summary  # noqa: E402

PART = 64 << 20
SAVED_WORLD = 2
RESHARD_WORLDS = (1, 3)


def shape(size_mb_per_rank: float) -> tuple[int, int]:
    """``(width, layers)`` of the MLP whose parameters + Adam moments are ~``size_mb_per_rank`` per rank."""
    width = 2048 if size_mb_per_rank >= 64 else 512
    total = size_mb_per_rank * MB * SAVED_WORLD
    return width, max(1, round(total / 3 / 4 / (width * width + width)))


# ============================================================================ one rank (worker)
class Rank:
    """One rank's contenders on one target (``root``), timed between barriers."""

    def __init__(self, spec: dict[str, Any], target: dict[str, Any], model: Any, opt: Any) -> None:
        import torch.distributed as dist

        from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions, ShardedModelState

        self.dist, self.target, self.model, self.opt = dist, target, model, opt
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.root, self.storage = target["root"].rstrip("/"), target.get("storage") or {}
        self.s3 = target["name"] == "s3"
        self.state = {"app": ShardedModelState(model, opt)}
        self.mgr = CheckpointManager(f"{self.root}/streamio", storage_options=self.storage,
                                     retention=KeepLast(1) if spec["mode"] == "save" else None,
                                     options=SaveOptions(part_size=PART, concurrency=8))
        self.step = 0
        self.fresh: dict[str, int] = dict(target.get("fresh") or {"dcp": 0, "streamio-dcp": 0, "ceiling": 0})
        self.results: dict[str, list[float]] = {}
        self._bufs: list[Any] | None = None
        self._parts: list[int] | None = None
        self._blob = b""
        self._sdcp_writer: Any = None
        self._sdcp_reader: Any = None

    def _next(self, kind: str) -> int:
        """The number of the next save of ``kind`` (``dcp``, ``streamio-dcp``, ``ceiling``), each in a place
        of its own, as a job saves each step apart; the one before the last is removed first, untimed
        (the contenders pay for writing, not for deleting an old checkpoint, or streamio's retention)."""
        n = self.fresh[kind] = self.fresh[kind] + 1
        if self.rank == 0 and n > 2:
            if kind == "streamio-dcp":
                from streamio.checkpoint.admin import plan_removal, remove
                from streamio.storage import Store

                store = Store(f"{self.root}/streamio-dcp", self.storage)
                remove(store, plan_removal(store, n - 2))
            elif self.s3:
                client, prefix = self._client(), self._key(f"{kind}/{n - 2}/")
                for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.target["bucket"],
                                                                             Prefix=prefix):
                    for o in page.get("Contents", []):
                        client.delete_object(Bucket=self.target["bucket"], Key=o["Key"])
            else:
                shutil.rmtree(f"{self.root}/{kind}/{n - 2}", ignore_errors=True)
        return n

    def _timed(self, name: str, fn: Callable[[], Any]) -> float:
        self.dist.barrier()
        t0 = time.perf_counter()
        fn()
        self.dist.barrier()
        dt = time.perf_counter() - t0
        self.results.setdefault(name, []).append(dt)
        return dt

    # ---------------------------------------------------------------- streamio
    def streamio_save(self) -> float:
        self.step += 1
        self.dist.barrier()
        before = phase_seconds()
        t0 = time.perf_counter()
        self.mgr.save(self.step, self.state)
        returned = time.perf_counter() - t0
        stats = self.mgr.wait()
        self.dist.barrier()
        spent = phase_seconds(before)  # this rank's blocked, from streamio's own instruments
        assert stats is not None and spent["blocked"] <= returned + 1e-3 and spent["durable"] == stats.durable_s, spent
        self.results.setdefault("streamio.blocked", []).append(spent["blocked"])
        # durable: latest.json names the step (SaveStats.durable_s, from the save call); wait: also the
        # retention of the previous step done (rank 0 deletes it after the pointer swap)
        self.results.setdefault("streamio.durable", []).append(stats.durable_s)
        self.results.setdefault("streamio.wait", []).append(time.perf_counter() - t0)
        return stats.durable_s

    def streamio_restore(self) -> float:
        return self._timed("streamio.restore", lambda: self.mgr.restore(self.state))

    # ---------------------------------------------------------------- torch DCP
    def _dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def _dcp_io(self, write: bool) -> Any:
        from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

        path = f"{self.root}/dcp/{self._next('dcp') if write else self.fresh['dcp']}"
        if not self.s3:
            return FileSystemWriter(path, thread_count=8) if write else FileSystemReader(path)
        return FsspecWriter(path, thread_count=8, sync_files=False, **self.storage) if write else \
            FsspecReader(path, **self.storage)

    def _streamio_dcp_io(self, write: bool) -> Any:
        """streamio's DCP writer / reader, made once (each makes its commit's gloo groups), as a job would;
        ``KeepAll``: old steps are removed by :meth:`_next`, untimed, like DCP's directories."""
        from streamio.checkpoint import KeepAll, StreamioReader, StreamioWriter

        root = f"{self.root}/streamio-dcp"
        if write:
            if self._sdcp_writer is None:
                self._sdcp_writer = StreamioWriter(root, retention=KeepAll(), storage_options=self.storage)
            self._sdcp_writer.reset(self._next("streamio-dcp"))
            return self._sdcp_writer
        if self._sdcp_reader is None:
            self._sdcp_reader = StreamioReader(root, storage_options=self.storage)
        return self._sdcp_reader

    def dcp_save(self, name: str, io: Callable[[bool], Any]) -> float:
        import torch.distributed.checkpoint as dcp

        return self._timed(name, lambda: dcp.save(self._dcp_state(), storage_writer=io(True)))

    def dcp_load(self, name: str, io: Callable[[bool], Any]) -> float:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        def load() -> None:
            sd = self._dcp_state()
            dcp.load(sd, storage_reader=io(False))
            set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])

        return self._timed(name, load)

    # ---------------------------------------------------------------- references
    def _local_tensors(self) -> list[Any]:
        import torch

        tensors = [*self.model.parameters(), *(v for s in self.opt.state.values() for v in s.values())]
        return [t.to_local() if hasattr(t, "to_local") else t for t in tensors
                if isinstance(t, torch.Tensor) and t.dim() > 0]

    def copy(self) -> float:
        import torch

        tensors = self._local_tensors()
        if self._bufs is None:
            self._bufs = [torch.empty_like(t) for t in tensors]
        return self._timed("copy", lambda: [b.copy_(t) for b, t in zip(self._bufs, tensors, strict=True)])

    def _part_sizes(self) -> list[int]:
        """The sizes of this rank's parts in streamio's latest save (the ceiling moves the same bytes)."""
        if self._parts is None:
            from streamio.checkpoint.root import read_manifest
            from streamio.storage import Store

            m = read_manifest(Store(f"{self.root}/streamio", self.storage), self.step)
            self._parts = [f.size for f in m.files if f.rank == self.rank and "/part-" in f.path]
            self._blob = os.urandom(max(self._parts))
        return self._parts

    def _put(self, n: int, i: int, size: int) -> None:
        data = memoryview(self._blob)[:size]
        if self.s3:
            key = self._key(f"ceiling/{n}/{self.rank}-{i}")
            self._client().put_object(Bucket=self.target["bucket"], Key=key, Body=bytes(data))
            return
        with open(f"{self.root}/ceiling/{n}/{self.rank}-{i}", "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())

    def _get(self, n: int, i: int) -> int:
        if self.s3:
            key = self._key(f"ceiling/{n}/{self.rank}-{i}")
            return len(self._client().get_object(Bucket=self.target["bucket"], Key=key)["Body"].read())
        return len(Path(f"{self.root}/ceiling/{n}/{self.rank}-{i}").read_bytes())

    def _key(self, path: str) -> str:
        """The S3 key of ``path`` below the root."""
        return f"{self.root.split('/', 3)[3]}/{path}"

    def _client(self) -> Any:
        if not hasattr(self, "_boto3"):
            from streamio.testing import S3Endpoint

            self._boto3 = S3Endpoint(self.storage["endpoint_url"], self.target["bucket"]).boto3_client()
        return self._boto3

    def ceiling_put(self) -> float:
        sizes, n = self._part_sizes(), self._next("ceiling")
        if not self.s3:
            os.makedirs(f"{self.root}/ceiling/{n}", exist_ok=True)
        with ThreadPoolExecutor(8) as pool:
            return self._timed("ceiling.put", lambda: list(pool.map(self._put, [n] * len(sizes), range(len(sizes)),
                                                                     sizes)))

    def ceiling_get(self) -> float:
        count, n = len(self._part_sizes()), self.fresh["ceiling"]
        with ThreadPoolExecutor(8) as pool:
            return self._timed("ceiling.get", lambda: list(pool.map(self._get, [n] * count, range(count))))

    def contenders(self, mode: str, streamio_dcp: bool) -> dict[str, Callable[[], float]]:
        if mode == "reshard":
            out = {"streamio.restore": self.streamio_restore,
                   "dcp.load": lambda: self.dcp_load("dcp.load", self._dcp_io)}
            if streamio_dcp:
                out["streamio-dcp.load"] = lambda: self.dcp_load("streamio-dcp.load", self._streamio_dcp_io)
            return out
        out = {  # the first rep runs in this order: each save before its restore, streamio's before the ceiling
            "streamio.save": self.streamio_save,
            "streamio.restore": self.streamio_restore,
            "dcp.save": lambda: self.dcp_save("dcp.save", self._dcp_io),
            "dcp.load": lambda: self.dcp_load("dcp.load", self._dcp_io),
            "ceiling.put": self.ceiling_put,
            "ceiling.get": self.ceiling_get,
            "copy": self.copy,
        }
        if streamio_dcp:
            out["streamio-dcp.save"] = lambda: self.dcp_save("streamio-dcp.save", self._streamio_dcp_io)
            out["streamio-dcp.load"] = lambda: self.dcp_load("streamio-dcp.load", self._streamio_dcp_io)
        return out


def build_state(width: int, layers: int, *, fill: bool) -> tuple[Any, Any]:
    """The MLP + Adam of every group (the same global shapes), FSDP2-sharded over more than one rank.

    ``fill``: one real step, so Adam's moments exist (the saving job's state); a restoring job
    starts from an empty optimizer, as a resumed job does.
    """
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    if dist.get_world_size() > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    if fill:
        model(torch.randn(4, width)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, opt


def _progress(prefix: str) -> Callable[[str], None]:
    return lambda line: print(f"{prefix} {line}", file=sys.stderr, flush=True)


def worker(spec_path: str) -> None:
    """One rank (``RANK`` / ``WORLD_SIZE`` / ``MASTER_*`` in the environment): run the spec, write its times."""
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    spec = json.loads(Path(spec_path).read_text())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    model, opt = build_state(spec["width"], spec["layers"], fill=spec["mode"] == "save")
    out: dict[str, Any] = {"rank": rank, "world": world, "targets": {}}
    for target in spec["targets"]:
        r = Rank(spec, target, model, opt)
        contenders = r.contenders(spec["mode"], spec["streamio_dcp"])
        say = _progress(f"[{world} ranks, {target['name']}]") if rank == 0 else None
        interleave(contenders, 1, log=say)  # warm-up, untimed
        r.results.clear()
        interleave(contenders, spec["reps"], log=say)
        out["targets"][target["name"]] = {"runs_s": r.results, "fresh": r.fresh, "local_bytes": sum(
            t.numel() * t.element_size() for t in r._local_tensors())}
        r.mgr.close()
    Path(spec["out"], f"rank-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a gloo rank may abort at interpreter exit otherwise (docs/design.md "Measured behaviour")


# ============================================================================ driver
def launch(world: int, spec: dict[str, Any], env: dict[str, str], scratch: str, timeout: float) -> list[dict[str, Any]]:
    """Run ``spec`` on ``world`` rank processes; their results, by rank."""
    out = tempfile.mkdtemp(prefix=f"sharded-{world}-", dir=scratch)
    spec_path = Path(out, "spec.json")
    spec_path.write_text(json.dumps({**spec, "out": out}))
    base = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.bench_sharded", "--worker", str(spec_path)],
                              env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=REPO)
             for r in range(world)]
    deadline = time.monotonic() + timeout
    try:
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise RuntimeError(f"the {world}-rank group exited with {codes}")
    return [json.loads(Path(out, f"rank-{r}.json").read_text()) for r in range(world)]


def _merge(ranks: list[dict[str, Any]], target: str) -> dict[str, list[float]]:
    """Per contender and repetition, the slowest rank's time (barriers make them nearly equal)."""
    runs = [r["targets"][target]["runs_s"] for r in ranks]
    return {name: [max(rr[name][i] for rr in runs) for i in range(len(runs[0][name]))] for name in runs[0]}


def ratios(target: str, med: dict[str, float], reshard: dict[int, dict[str, float]]) -> dict[str, float]:
    """The issue's goals, as ratios of medians (speed ratios: the other's seconds / streamio's)."""
    s3 = target == "s3"
    peer = "dcp fsspec" if s3 else "dcp FileSystemWriter"
    out = {
        "blocked / copy (target <= 1.5)": ratio(med["streamio.blocked"], med["copy"]),
        "durable / ceiling.put (target <= 1.25)": ratio(med["streamio.durable"], med["ceiling.put"]),
        f"durable speedup vs {peer} (target >= {1.5 if s3 else 1.2})": ratio(med["dcp.save"], med["streamio.durable"]),
        "restore speed / ceiling.get (target >= 0.8)": ratio(med["ceiling.get"], med["streamio.restore"]),
        f"restore speedup vs {peer.replace('Writer', 'Reader')}" + (" (target >= 4)" if s3 else ""):
            ratio(med["dcp.load"], med["streamio.restore"]),
    }
    if "streamio-dcp.save" in med:
        out["StreamioWriter durable speedup vs " + peer] = ratio(med["dcp.save"], med["streamio-dcp.save"])
        out["StreamioReader load speedup vs " + peer.replace("Writer", "Reader")] = \
            ratio(med["dcp.load"], med["streamio-dcp.load"])
    for world, m in sorted(reshard.items()):
        out[f"resharded restore 2->{world} / same-topology 2->2 (target <= 1.3)"] = \
            ratio(m["streamio.restore"], med["streamio.restore"])
        out[f"resharded restore 2->{world}: speedup vs {peer.replace('Writer', 'Reader')}"] = \
            ratio(m["dcp.load"], m["streamio.restore"])
    return out


def run(quick: bool, *, log: Callable[[str], None] = print, scratch_dir: str | None = None,
        size_mb: float | None = None, reps: int | None = None, targets: tuple[str, ...] | None = None,
        streamio_dcp: bool = True) -> dict[str, Any]:
    """The section: the 2-rank group on each target, then the resharding groups; medians and ratios."""
    size_mb = size_mb if size_mb is not None else 8 if quick else 300
    reps = reps if reps is not None else 1 if quick else 3
    targets = targets or (("disk",) if quick else ("disk", "s3"))
    width, layers = shape(size_mb)
    scratch = tempfile.mkdtemp(prefix="bench-sharded-", dir=scratch_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    servers = None
    try:
        tspecs: list[dict[str, Any]] = []
        for name in targets:
            if name == "disk":
                tspecs.append({"name": "disk", "root": os.path.join(scratch, "disk")})
                continue
            servers = S3Servers(proxies=1, latency=0.0).start()
            from streamio.testing import S3Endpoint

            s3 = S3Endpoint(servers.moto, servers.s3.bucket)
            env.update(s3.env())
            tspecs.append({"name": "s3", "root": s3.url(f"run-{uuid.uuid4().hex[:6]}"),
                           "storage": s3.storage_options(), "bucket": s3.bucket})
        spec = {"width": width, "layers": layers, "reps": reps, "targets": tspecs, "streamio_dcp": streamio_dcp}
        t0 = time.perf_counter()
        log(f"  sharded: {SAVED_WORLD} ranks x ~{size_mb:.0f} MB, {layers} layers of {width}, targets {targets}")
        saved = launch(SAVED_WORLD, {**spec, "mode": "save"}, env, scratch, 3600)
        log(f"  sharded: 2-rank group done in {time.perf_counter() - t0:.0f} s")
        regroups = {}
        # the resharding groups read the last save of each kind the 2-rank group made
        retargets = [{**t, "fresh": saved[0]["targets"][t["name"]]["fresh"]} for t in tspecs]
        for world in RESHARD_WORLDS:
            regroups[world] = launch(world, {**spec, "targets": retargets, "mode": "reshard"}, env, scratch, 1800)
            log(f"  sharded: 2 -> {world} restore group done in {time.perf_counter() - t0:.0f} s")
    finally:
        if servers is not None:
            servers.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    local = [r["targets"][targets[0]]["local_bytes"] for r in saved]
    out: dict[str, Any] = {"config": {"ranks": SAVED_WORLD, "width": width, "layers": layers, "reps": reps,
                                      "size_mb_per_rank": size_mb, "local_bytes": local, "part_size": PART,
                                      "reshard_worlds": list(RESHARD_WORLDS)},
                           "size_bytes": sum(local)}
    for name in targets:
        runs = _merge(saved, name)
        med = {k: summary(v)["median"] for k, v in runs.items()}
        reruns = {w: _merge(g, name) for w, g in regroups.items()}
        remed = {w: {k: summary(v)["median"] for k, v in rr.items()} for w, rr in reruns.items()}
        out[name] = {"runs_s": runs, "reshard_runs_s": {str(w): rr for w, rr in reruns.items()},
                     "ratios": ratios(name, med, remed)}
    return out


def _print(res: dict[str, Any]) -> None:
    nbytes = res["size_bytes"]
    for target in ("disk", "s3"):
        if target not in res:
            continue
        t = res[target]
        print(f"\n== {target}: sharded state {nbytes / MB:.0f} MB on {res['config']['ranks']} ranks (s; GB/s)")
        rows = [*t["runs_s"].items(), *((f"2->{w} {k}", v) for w, rr in t["reshard_runs_s"].items()
                                        for k, v in rr.items())]
        for k, v in rows:
            s = summary(v)
            print(f"  {k:<28} {s['median']:8.3f} s  [{s['min']:.3f}-{s['max']:.3f}]  {nbytes / s['median'] / 1e9:6.2f}")
        for k, v in t["ratios"].items():
            print(f"  {k:<70} {v:6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="8 MB per rank, 1 rep, local disk only")
    ap.add_argument("--size-mb", type=float, help="parameters + Adam moments per rank (default 300)")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--targets", help="comma-separated: disk,s3")
    ap.add_argument("--no-streamio-dcp", action="store_true", help="skip dcp.save/load with StreamioWriter/Reader")
    ap.add_argument("--json", type=Path, help="write all figures here")
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    res = run(args.quick, size_mb=args.size_mb, reps=args.reps,
              targets=tuple(args.targets.split(",")) if args.targets else None,
              streamio_dcp=not args.no_streamio_dcp, log=lambda m: print(m, file=sys.stderr, flush=True))
    _print(res)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
