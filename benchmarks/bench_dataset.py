"""Training-loop benchmark: samples/s, stall fraction, start-up, streamio vs its peers; scale model.

Run: ``.venv/bin/python -m benchmarks.bench_dataset [--quick] [--peers mosaicml,litdata]
[--setups 2x8x2,...] [--reps N] [--shards N] [--json OUT]`` (or as the ``dataset`` and ``scale``
sections of ``python -m benchmarks.run``).

Loop (issue 6's benchmark). A dataset of ``shards x shard_mb`` MB of ``sample_kb`` KB random
samples is written once with :func:`streamio.data.write.writer.write_dataset` (to local disk, then the
same files are uploaded to moto). ``ranks`` long-lived processes with ``RANK`` / ``WORLD_SIZE`` set
(one simulated node: torchrun's environment without paying its launch and ``import torch`` per
trial, see :class:`RankPool`) each build a fresh dataset and loader per trial and run a DataLoader
with ``workers`` workers and a fixed simulated compute time per batch
(``time.sleep(compute)``; no collectives). Per rank: samples, loop wall time from ``iter(loader)``
to the last batch (worker start-up included) and the time spent waiting in ``next(loader)``.
Stall fraction = waiting / wall; a trial reports the slowest rank's stall (DDP runs at the pace of
the slowest rank) and samples/s = all samples / the longest wall; start-up = building the dataset and
its loader to the first batch (issue 17's first batch: index, plan, worker start, first read), the
slowest rank; every rank process imports its libraries before its first trial, untimed. Contenders,
interleaved:

* ``streamio cold``     — ``StreamingDataset`` + ``StreamingDataLoader``, empty node cache;
* ``streamio warm``     — the same, every shard already in the node cache (no network);
* ``webdataset stream`` — ``WebDataset(split_by_node, split_by_worker)`` + ``WebLoader`` reading
  the shards through ``s3fs`` (registered as webdataset's ``s3`` gopen scheme), no cache;
* ``webdataset cold``   — the same with ``cache_dir`` (webdataset's cache downloads a whole shard
  before its first sample), empty;
* ``webdataset warm``   — the same cache, already filled;
* with ``--peers mosaicml,litdata``: ``mosaicml cold``/``warm`` and ``litdata cold``/``warm`` — the
  same samples converted to their formats, in the same bucket behind the same proxy, read from
  their own environments in fresh rank processes per trial (:func:`mosaicml_peer`,
  :func:`litdata_peer`, ``benchmarks/peer_*.py``). A mosaicml trial that stalls on its
  shared-connection bug (``benchmarks/peer_mosaicml.py``) or a peer trial that fails is left out of
  the figures and listed with its reason (``excluded``).

Setups (:class:`Setup`): the main one (``LoopConfig.ranks`` x ``batch_size`` x ``workers``: 2 x 8 x
2) with every contender, plus ``LoopConfig.more`` (2 x 32 x 4, 1 x 8 x 2, 1 x 32 x 4: issue 17's two
batch/worker settings at 1 and 2 ranks) without the nginx and no-compute ones.

Storage: moto behind the FaultProxy with 30 ms first-byte latency on every response (a separate
process). With nginx available, ``streamio cold`` and ``webdataset stream`` also run against
nginx serving the same files over ``http://`` (no added latency): where moto, not the reader, is
the limit. No shuffling (the same order for both libraries); batch size, compute time, data size
and repetitions are stated with the results.

Scale (issue 9). 2 simulated nodes x 2 ranks (4 processes, ``RANK`` 0-3, ``WORLD_SIZE`` 4), one
cache directory and one proxy per node, shard order shuffled per epoch, 2 epochs: GETs and bytes
per node and GETs per shard from the proxies' request logs. Then :func:`scale_model` derives from
the planner (:func:`streamio.data.plan.plan_epoch`, every rank's runs) how GETs and bytes grow with
nodes, ranks and epochs, e.g. 64 nodes x 8 GPUs reading 5,000 x 10 GB shards, and checks the model
against the 2 x 2 measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MB,
    REPO,
    Nginx,
    S3Servers,
    boto3_ceiling,
    emit_json,
    free_port,
    http_parallel_ceiling,
    interleave,
    ratio,
    summary,
    timed_rate,
)
from benchmarks.loop import serve, timed_epoch  # noqa: E402

GB = 1_000_000_000
SCALE_SEED = 0  # the scale ranks' StreamingDataset seed (its default): the model plans with the same one


@dataclass(frozen=True)
class LoopConfig:
    """Sizes of the loop benchmark (see module docstring)."""

    shards: int = 32
    shard_mb: int = 16
    sample_kb: int = 64
    # 2 ranks x 8 samples / 20 ms = 800 samples/s (~52 MB/s): half of what the loader delivers
    # here without compute, a tenth of moto's ceiling, so a stall is the reader's, not the CPUs'
    batch_size: int = 8
    compute_ms: float = 20.0
    ranks: int = 2
    workers: int = 2
    prefetch: int = 4
    reps: int = 3
    latency_ms: float = 30.0
    # further (ranks, batch size, workers) setups, with every contender but the nginx and no-compute ones
    more: tuple[tuple[int, int, int], ...] = ((2, 32, 4), (1, 8, 2), (1, 32, 4))

    @classmethod
    def quick(cls) -> LoopConfig:
        return cls(shards=8, shard_mb=4, workers=1, reps=1, more=((1, 32, 2),))


# ----------------------------------------------------------------------------- rank process
def _wds_name(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def _register_s3_gopen(options: dict[str, Any]) -> None:
    """Let webdataset open ``s3://`` URLs through s3fs (one filesystem per process: fork safety)."""
    gopen_mod = sys.modules["webdataset.gopen"]
    fss: dict[int, Any] = {}

    def gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        import s3fs

        fs = fss.get(os.getpid())
        if fs is None:
            fs = fss[os.getpid()] = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        return fs.open(url, "rb")

    gopen_mod.gopen_schemes["s3"] = gopen_s3  # type: ignore[attr-defined]


def rank_main(cfg: dict[str, Any]) -> dict[str, Any]:
    """One rank of a trial (runs in a child process with ``RANK``/``WORLD_SIZE`` set)."""
    import warnings

    warnings.simplefilter("ignore")
    method, bs, nw = cfg["method"], cfg["batch_size"], cfg["workers"]
    epochs = cfg.get("epochs", [0])
    t0 = 0.0
    if method == "streamio":
        from streamio.data.cache import CacheConfig
        from streamio.data.dataset import StreamingDataset
        from streamio.data.loader import StreamingDataLoader
        from streamio.data.options import DatasetOptions
        from streamio.data.plan import Shuffle
        from streamio.data.read.prefetch import PrefetchConfig

        cache = CacheConfig(cfg["cache"], max_bytes=cfg["cache_bytes"], min_free_bytes=0) if cfg.get("cache") else None
        shuffle = Shuffle(shards=True, window=0) if cfg.get("shuffle") else False
        t0 = time.perf_counter()  # after the imports, as in the peers' rank processes
        ds = StreamingDataset(
            cfg["url"], batch_size=bs, shuffle=shuffle, storage_options=cfg.get("options"),
            options=DatasetOptions(policy="drop", cache=cache, prefetch=PrefetchConfig(workers=cfg["prefetch"])),
        )
        loader: Any = StreamingDataLoader(ds, num_workers=nw)
    else:
        import webdataset as wds

        if cfg.get("options") is not None:
            _register_s3_gopen(cfg["options"])
        t0 = time.perf_counter()
        ds = wds.WebDataset(
            cfg["urls"], shardshuffle=False, nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker,
            cache_dir=cfg.get("cache"), url_to_name=_wds_name, empty_check=False,
        )
        loader = wds.WebLoader(ds, batch_size=bs, num_workers=nw)
    init = time.perf_counter() - t0  # building the dataset and its loader (the first epoch's start-up)
    out = []
    for epoch in epochs:
        if hasattr(ds, "set_epoch"):
            ds.set_epoch(epoch)
        out.append({**timed_epoch(loader, cfg["compute_s"], epoch), "init_s": init if not out else 0.0})
    return {"rank": int(os.environ["RANK"]), "epochs": out}


class RankPool:
    """One long-lived process per rank (``RANK``/``WORLD_SIZE`` from ``envs``) that runs trials.

    Starting a rank costs seconds (``import torch``) on these machines; a pool pays it once per
    section instead of once per trial. Each trial still builds its dataset and loader afresh, so
    DataLoader workers are forked (and their start-up timed) every trial, as in a real job.
    Protocol: one JSON config per line on stdin; the answer is one ``RESULT {json}`` line on stdout.
    """

    def __init__(self, envs: Sequence[dict[str, str]], cmd: Sequence[str] | None = None) -> None:
        self._logs = [tempfile.TemporaryFile(mode="w+") for _ in envs]
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self._procs = [
            subprocess.Popen(
                list(cmd or [sys.executable, "-m", "benchmarks.bench_dataset", "--rank-server"]),
                env={**base, **env, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                text=True, cwd=REPO,
            )
            for env, err in zip(envs, self._logs, strict=True)
        ]

    def run(self, cfgs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run one trial: ``cfgs[i]`` on rank process ``i``, all at once; their results in order."""
        for p, cfg in zip(self._procs, cfgs, strict=True):
            assert p.stdin is not None
            p.stdin.write(json.dumps(cfg) + "\n")
            p.stdin.flush()
        results = []
        for i, p in enumerate(self._procs):
            assert p.stdout is not None
            while True:
                line = p.stdout.readline()
                if not line:
                    self._logs[i].seek(0)
                    raise RuntimeError(f"rank process {i} died ({p.poll()}): {self._logs[i].read()[-2000:]}")
                if line.startswith("RESULT "):
                    break
            res = json.loads(line[len("RESULT "):])
            if "error" in res:
                raise RuntimeError(f"rank process {i} failed: {res['error'][-2000:]}")
            results.append(res)
        return results

    def close(self) -> None:
        for p in self._procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self._procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        for f in self._logs:
            f.close()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rank_server() -> None:
    """Child mode of :class:`RankPool`: the libraries imported first, untimed (as the peers' rank processes do)."""
    import s3fs  # noqa: F401
    import webdataset  # noqa: F401

    from streamio.data.dataset import StreamingDataset  # noqa: F401
    from streamio.data.loader import StreamingDataLoader  # noqa: F401

    serve(rank_main)


def _rank_env(rank: int, world: int, local: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local), "OMP_NUM_THREADS": "1"}


# ----------------------------------------------------------------------------- data set
@dataclass
class Dataset:
    local: str  # directory with the shards + index.json
    prefix: str  # key prefix in the bucket
    files: list[str]  # shard file names
    samples: int
    bytes: int


def make_dataset(root: str, shards: int, shard_mb: int, sample_kb: int) -> Dataset:
    """Write ``shards`` x ~``shard_mb`` MB of ``sample_kb`` KB random samples with ``write_dataset``."""
    from streamio.data.write.writer import ShardSpec, write_dataset

    size = sample_kb * 1000
    per_shard = max(1, (shard_mb * MB) // (size + 1536))  # + tar headers of 2 members
    pool = os.urandom(8 << 20)
    n = shards * per_shard

    def samples() -> Any:
        for i in range(n):
            off = (i * 7919 * 64) % (len(pool) - size)
            yield {"__key__": f"{i:08d}", "bin": pool[off : off + size]}

    index = write_dataset(samples(), root, spec=ShardSpec(max_count=per_shard))
    files = [s.path for s in index.shards]
    return Dataset(root, "", files, index.samples, sum(s.bytes for s in index.shards))


def upload_dataset(ds: Dataset, client: Any, bucket: str, prefix: str) -> None:
    """Copy the local dataset's files (shards, index, sidecars) to ``bucket/prefix/`` with boto3."""
    from concurrent.futures import ThreadPoolExecutor

    names = [p.name for p in Path(ds.local).iterdir() if p.is_file()]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: client.put_object(Bucket=bucket, Key=f"{prefix}/{n}",
                                                  Body=Path(ds.local, n).read_bytes()), names))
    ds.prefix = prefix


# ----------------------------------------------------------------------------- loop benchmark
def _trial_stats(results: list[dict[str, Any]], sample_bytes: float, epoch_i: int = 0) -> dict[str, float]:
    eps = [r["epochs"][epoch_i] for r in results]
    wall = max(e["wall_s"] for e in eps)
    return {
        "samples_per_s": sum(e["samples"] for e in eps) / wall,
        "stall": max(e["wait_s"] / e["wall_s"] for e in eps),
        "stall_mean": sum(e["wait_s"] / e["wall_s"] for e in eps) / len(eps),
        # after the first batch: start-up (workers, index, first request) excluded
        "stall_steady": max((e["wait_s"] - e["first_batch_s"]) / max(1e-9, e["wall_s"] - e["first_batch_s"])
                            for e in eps),
        "MBps": sum(e["samples"] for e in eps) * sample_bytes / wall / MB,
        "first_batch_s": max(e["first_batch_s"] for e in eps),
        # from building the dataset to its first batch (index, plan, workers, first read): issue 17's start-up
        "start_s": max(e.get("init_s", 0.0) + e["first_batch_s"] for e in eps),
        "init_s": max(e.get("init_s", 0.0) for e in eps),  # building the dataset and loader alone
        "wall_s": wall,
        "samples": sum(e["samples"] for e in eps),
    }


@dataclass(frozen=True)
class Setup:
    """One loop setting: ranks (processes of one simulated node), batch size, DataLoader workers per rank."""

    ranks: int
    batch_size: int
    workers: int

    @property
    def label(self) -> str:
        return f"{self.ranks} rank{'s' if self.ranks > 1 else ''}, batch {self.batch_size}, {self.workers} workers"


Contenders = dict[str, Callable[[], dict[str, Any]]]
PeerFactory = Callable[[Setup, dict[str, Any]], Contenders]  # a peer's contenders at a setup, from the base config

TRIAL_STATS = ("samples_per_s", "MBps", "stall", "stall_steady", "stall_mean", "first_batch_s", "start_s", "init_s",
               "wall_s")
# the cold contenders of other libraries: the first batch to beat (issue 17, goal 3)
COLD_PEERS = ("webdataset stream", "webdataset cold", "mosaicml cold", "litdata cold")
PEER_LIBRARIES = {"mosaicml": "mosaicml-streaming", "litdata": "litdata"}


class LoopBench:
    """The loop trials over one data set and store, one :class:`Setup` at a time (see module docstring).

    ``peers``: the factories of the peers that run from their own environments
    (:func:`mosaicml_peer`, :func:`litdata_peer`), prepared once (format conversion, upload).
    """

    def __init__(self, cfg: LoopConfig, servers: S3Servers, data: Dataset, scratch: str,
                 log: Callable[[str], None], peers: Sequence[PeerFactory] = ()) -> None:
        self.cfg, self.servers, self.data, self.scratch, self.log = cfg, servers, data, scratch, log
        self.peers = list(peers)
        self.url = servers.s3.url(data.prefix)
        self.options = servers.s3.storage_options(servers.proxies[0])

    def base(self, setup: Setup) -> dict[str, Any]:
        """The trial config every contender gets at ``setup``."""
        return {"batch_size": setup.batch_size, "workers": setup.workers, "prefetch": self.cfg.prefetch,
                "compute_s": self.cfg.compute_ms / 1000, "cache_bytes": self.data.bytes * 2 + 256 * MB}

    def run(self, setup: Setup, nginx_url: str | None = None, no_compute: bool = False) -> dict[str, Any]:
        """Every contender's interleaved trials at ``setup``; summaries (stalled trials left out) and ratios.

        ``nginx_url``: also the ``(nginx)`` contenders; ``no_compute``: also the loop's own ceiling.
        """
        self.log(f"loop: {setup.label}")
        pool = RankPool([_rank_env(r, setup.ranks, r) for r in range(setup.ranks)])
        try:
            contenders = self._own(pool, setup, nginx_url, no_compute)
            for peer in self.peers:
                contenders.update(peer(setup, self.base(setup)))
            # No untimed fill run is needed: in the first repetition (dict order) each cold contender runs
            # before its warm one and leaves the cache full; later repetitions find it full or refill it.
            runs = interleave(contenders, self.cfg.reps, log=self.log)
        finally:
            pool.close()
        out = {name: _summarise(trials) for name, trials in runs.items()}
        cfg = self.cfg
        bound = setup.ranks * setup.batch_size / (cfg.compute_ms / 1000) if cfg.compute_ms else float("nan")
        return {"setup": {**asdict(setup), "label": setup.label}, "compute_bound_samples_per_s": bound,
                "contenders": out, "ratios": _loop_ratios(out, bound, cfg.latency_ms / 1000),
                "fastest_cold_peer": fastest_cold_peers(out)}

    def _own(self, pool: RankPool, setup: Setup, nginx_url: str | None, no_compute: bool) -> Contenders:
        """The contenders of this environment (streamio, webdataset), run by the long-lived rank pool."""
        sample_bytes = self.data.bytes / self.data.samples
        base = self.base(setup)
        dirs = {n: os.path.join(self.scratch, n) for n in ("streamio", "webdataset", "streamio-http")}

        def trial(**over: Any) -> dict[str, float]:
            return _trial_stats(pool.run([{**base, **over}] * setup.ranks), sample_bytes)

        def cold(d: str, **over: Any) -> dict[str, float]:
            """A trial on an empty cache directory ``d``."""
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d, mode=0o700)
            return trial(**over, cache=d)

        streamio = {"method": "streamio", "url": self.url, "options": self.options}
        wds_s3 = {"method": "webdataset", "urls": [f"{self.url}/{f}" for f in self.data.files], "options": self.options}
        contenders: Contenders = {
            "streamio cold": lambda: cold(dirs["streamio"], **streamio),
            "streamio warm": lambda: trial(**streamio, cache=dirs["streamio"]),
            "webdataset stream": lambda: trial(**wds_s3),
            "webdataset cold": lambda: cold(dirs["webdataset"], **wds_s3),
            "webdataset warm": lambda: trial(**wds_s3, cache=dirs["webdataset"]),
        }
        if nginx_url:
            contenders["streamio cold (nginx)"] = lambda: cold(dirs["streamio-http"], method="streamio",
                                                                url=nginx_url.rstrip("/"))
            contenders["webdataset stream (nginx)"] = lambda: trial(
                method="webdataset", urls=[f"{nginx_url}/{f}" for f in self.data.files])
        if no_compute:  # the loop's own ceiling: no compute, as fast as the loader delivers
            contenders["streamio cold, no compute"] = lambda: cold(dirs["streamio"], **streamio, compute_s=0.0)
            contenders["webdataset stream, no compute"] = lambda: trial(**wds_s3, compute_s=0.0)
        return contenders


def bench_loop(cfg: LoopConfig, servers: S3Servers, data: Dataset, scratch: str, nginx_url: str | None,
               log: Callable[[str], None], quick_mode: bool = False, peers: Sequence[str] = ()) -> dict[str, Any]:
    """The loop benchmark: the main setup (``cfg.ranks`` / ``batch_size`` / ``workers``, with the nginx and
    no-compute contenders) at the top level of the result, as before; ``cfg.more`` setups under ``setups``."""
    factories = {"mosaicml": mosaicml_peer, "litdata": litdata_peer}
    for p in peers:
        if p not in factories:  # another section's peer (the suite passes one list to every section)
            log(f"dataset: no loop contender for peer {p!r} (have: {', '.join(factories)})")
    bench = LoopBench(cfg, servers, data, scratch, log,
                      [factories[p](cfg, servers, data, scratch, log) for p in peers if p in factories])
    ceiling, http_ceiling = _ceilings(servers, data, nginx_url, cfg.reps, log)
    main = bench.run(Setup(cfg.ranks, cfg.batch_size, cfg.workers), nginx_url, no_compute=not quick_mode)
    if "streamio cold, no compute" in main["contenders"]:
        main["ratios"].update(_ceiling_ratios(main["contenders"], ceiling))
    more = [bench.run(Setup(*s)) for s in cfg.more]
    return {"config": asdict(cfg), "compute_bound_samples_per_s": main["compute_bound_samples_per_s"],
            "dataset_bytes": data.bytes, "dataset_samples": data.samples, "contenders": main["contenders"],
            "ratios": main["ratios"], "fastest_cold_peer": main["fastest_cold_peer"], "store_ceiling": ceiling,
            "http_ceiling": http_ceiling, "setups": more}


def _summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """A contender's :data:`TRIAL_STATS` summaries over its trials, stalled ones (``excluded``) left out."""
    kept = [t for t in trials if not t.get("excluded")]
    out: dict[str, Any] = {k: summary([t[k] for t in kept]) for k in TRIAL_STATS}
    out["samples"] = kept[0]["samples"] if kept else 0
    excluded = [{"rep": i, "reason": t["excluded"], "wall_s": t["wall_s"]} for i, t in enumerate(trials)
                if t.get("excluded")]
    if excluded:
        out["excluded"] = excluded
    return out


def _ceilings(servers: S3Servers, data: Dataset, nginx_url: str | None, reps: int,
              log: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """boto3 through the proxy (the store's ceiling) and, with nginx, plain HTTP GETs of the same files."""
    s3 = servers.s3
    ceiling = boto3_ceiling(s3.boto3_client(servers.proxies[0]), s3.bucket, [f"{data.prefix}/{f}" for f in data.files],
                            concurrency=8, reps=reps)
    log(f"store ceiling through the proxy: GET {ceiling['get_MBps']['median']:.0f} MB/s, "
        f"PUT {ceiling['put_MBps']['median']:.0f} MB/s")
    if not nginx_url:
        return ceiling, None
    # the same bytes from a fast server: how far below a real server moto + proxy are
    shard_urls = [f"{nginx_url}/{f}" for f in data.files]
    rates = [timed_rate(lambda: http_parallel_ceiling(shard_urls, concurrency=8)) for _ in range(reps)]
    http_ceiling = {"concurrency": 8, "MBps": summary(rates)}
    log(f"nginx ceiling (8 threads): GET {http_ceiling['MBps']['median']:.0f} MB/s")
    return ceiling, http_ceiling


def _loop_ratios(out: dict[str, Any], bound: float, latency_s: float) -> dict[str, float]:
    """A setup's headline ratios, for the contenders that ran."""
    med = {k: v["samples_per_s"]["median"] for k, v in out.items()}
    ratios = {
        "streamio cold / webdataset stream (samples/s)": ratio(med["streamio cold"], med["webdataset stream"]),
        "streamio cold / webdataset cold (samples/s)": ratio(med["streamio cold"], med["webdataset cold"]),
        "streamio warm / webdataset warm (samples/s)": ratio(med["streamio warm"], med["webdataset warm"]),
        "streamio cold / compute bound": ratio(med["streamio cold"], bound),
        "streamio warm / compute bound": ratio(med["streamio warm"], bound),
    }
    for peer, library in PEER_LIBRARIES.items():
        if f"{peer} cold" in med:
            ratios[f"streamio cold / {library} cold (samples/s)"] = ratio(med["streamio cold"], med[f"{peer} cold"])
            ratios[f"streamio warm / {library} warm (samples/s)"] = ratio(med["streamio warm"], med[f"{peer} warm"])
    if "streamio cold (nginx)" in out:
        ratios["streamio cold nginx / webdataset stream nginx (samples/s)"] = ratio(
            med["streamio cold (nginx)"], med["webdataset stream (nginx)"])
    return {**ratios, **_first_batch_ratios(out, latency_s)}


def fastest_cold_peers(out: dict[str, Any]) -> dict[str, str]:
    """Per start-up figure (``start_s``, ``first_batch_s``): the cold peer contender with the lowest median."""
    best = {}
    for key in ("start_s", "first_batch_s"):
        times = {k: out[k][key]["median"] for k in COLD_PEERS if k in out and not math.isnan(out[k][key]["median"])}
        if times:
            best[key] = min(times, key=lambda k: times[k])
    return best


def _first_batch_ratios(out: dict[str, Any], latency_s: float) -> dict[str, float]:
    """Issue 17's start-up goal: streamio's cold start-up (building the dataset to the first batch, the
    slowest rank) against the fastest cold peer's and against 3 first-byte latencies + 0.3 s; and the
    same from ``iter(loader)`` (what the loop times as its first batch)."""
    if "streamio cold" not in out:
        return {}
    ours = {key: out["streamio cold"][key]["median"] for key in ("start_s", "first_batch_s")}
    fastest = fastest_cold_peers(out)
    ratios = {}
    if "start_s" in fastest:
        ratios["streamio cold first batch / fastest cold peer's (from building the dataset) (target <= 1)"] = ratio(
            ours["start_s"], out[fastest["start_s"]]["start_s"]["median"])
    budget = 3 * latency_s + 0.3
    ratios[f"streamio cold first batch / {budget:.2f} s = 3 x first-byte latency + 0.3 s (target <= 1)"] = ratio(
        ours["start_s"], budget)
    if "first_batch_s" in fastest:
        ratios["streamio cold first batch / fastest cold peer's (from iter(loader))"] = ratio(
            ours["first_batch_s"], out[fastest["first_batch_s"]]["first_batch_s"]["median"])
    return ratios


def _ceiling_ratios(out: dict[str, Any], ceiling: dict[str, Any]) -> dict[str, float]:
    """The no-compute contenders against the store's ceiling and each other."""
    med = {k: v["samples_per_s"]["median"] for k, v in out.items()}
    mbps = {k: v["MBps"]["median"] for k, v in out.items()}
    get = ceiling["get_MBps"]["median"]
    return {
        "streamio cold, no compute / store ceiling GET (MB/s)": ratio(mbps["streamio cold, no compute"], get),
        "webdataset stream, no compute / store ceiling GET (MB/s)": ratio(mbps["webdataset stream, no compute"], get),
        "streamio cold / webdataset stream, no compute (samples/s)": ratio(
            med["streamio cold, no compute"], med["webdataset stream, no compute"]),
    }


# ----------------------------------------------------------------------------- peers (own environments)
class _PeerCache:
    """A peer's cache directory: a new one for each cold trial (the previous one removed), kept for warm.

    A new name per cold trial, not the same one emptied: mosaicml keys its shared memory by it.
    """

    def __init__(self, scratch: str, name: str) -> None:
        self._root, self._name, self._n = scratch, name, 0
        self._current: str | None = None

    def get(self, cold: bool) -> str:
        if cold or self._current is None:
            if self._current is not None:
                shutil.rmtree(self._current, ignore_errors=True)
            self._current = os.path.join(self._root, f"{self._name}-{self._n}")
            self._n += 1
        return self._current


def _fresh_trial(exe: Path, script: str, envs: list[dict[str, str]], cfg: dict[str, Any], sample_bytes: float,
                 stalled: Callable[[list[dict[str, Any]]], str | None] = lambda _results: None) -> dict[str, Any]:
    """One trial in fresh rank processes of a peer's interpreter (their start-up is not timed).

    A trial that failed in the peer (its traceback's last line), or that ``stalled`` names a reason for, is
    kept with ``excluded`` set: :func:`_summarise` leaves it out of the figures and lists it with the reason.
    """
    try:
        with RankPool(envs, cmd=[str(exe), script, "--rank-server"]) as pool:
            results = pool.run([cfg] * len(envs))
    except RuntimeError as exc:  # the peer raised or died: a finding about the peer, not the end of the section
        last = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        return {**dict.fromkeys(TRIAL_STATS, math.nan), "samples": 0,
                "excluded": f"failed: {last[-1][:300] if last else exc}"}
    stats = _trial_stats(results, sample_bytes)
    reason = stalled(results)
    return {**stats, "excluded": reason} if reason else stats


def _peer_data(name: str, cfg: LoopConfig, servers: S3Servers, data: Dataset, scratch: str,
               log: Callable[[str], None]) -> tuple[Path, str, str]:
    """Build peer ``name``'s environment, convert the data set to its format (chunks of the shards'
    size) with its script's ``convert`` mode and upload it to ``s3://BUCKET/NAME``.

    Returns the peer's interpreter, its script and the uploaded data set's URL.
    """
    from benchmarks import peer_env

    exe = peer_env.python(name, log=log)
    script = str(REPO / "benchmarks" / f"peer_{name}.py")
    out_dir = os.path.join(scratch, name)
    t0 = time.perf_counter()
    subprocess.run([str(exe), script, "convert", data.local, out_dir, "--chunk-bytes", str(cfg.shard_mb * MB)],
                   check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    s3 = servers.s3
    client = s3.boto3_client()
    files = sorted(os.listdir(out_dir))
    for f in files:
        client.put_object(Bucket=s3.bucket, Key=f"{name}/{f}", Body=Path(out_dir, f).read_bytes())
    log(f"{name}: {exe.parent.parent.name} environment, {len(files)} files converted and uploaded in "
        f"{time.perf_counter() - t0:.1f} s")
    return exe, script, s3.url(name)


def mosaicml_peer(cfg: LoopConfig, servers: S3Servers, data: Dataset, scratch: str,
                  log: Callable[[str], None]) -> PeerFactory:
    """mosaicml-streaming over the same samples, bucket and latency proxy, from its own environment.

    The samples are converted to MDS (same shard size, no compression) and uploaded beside the tar
    shards. Each trial starts fresh rank processes (the peer environment's interpreter running
    ``benchmarks/peer_mosaicml.py``; start-up is not timed), as a real job does. Its local
    directory is its cache: a new one for each ``cold`` trial, kept for ``warm``.
    """
    exe, script, remote = _peer_data("mosaicml", cfg, servers, data, scratch, log)
    s3 = servers.s3
    opts = s3.storage_options(servers.proxies[0])
    env = {"S3_ENDPOINT_URL": servers.proxies[0], "AWS_ACCESS_KEY_ID": opts["key"],
           "AWS_SECRET_ACCESS_KEY": opts["secret"], "AWS_DEFAULT_REGION": s3.region, "MASTER_ADDR": "127.0.0.1"}
    cache = _PeerCache(scratch, "mosaicml-cache")

    def contenders(setup: Setup, base: dict[str, Any]) -> Contenders:
        def trial(cold: bool) -> dict[str, Any]:
            port = str(free_port())
            envs = [{**_rank_env(r, setup.ranks, r), **env, "LOCAL_WORLD_SIZE": str(setup.ranks), "MASTER_PORT": port}
                    for r in range(setup.ranks)]
            c = {**base, "remote": remote, "local": cache.get(cold)}
            return _fresh_trial(exe, script, envs, c, data.bytes / data.samples, stalled=_mosaicml_stalled)

        return {"mosaicml cold": lambda: trial(True), "mosaicml warm": lambda: trial(False)}

    return contenders


def litdata_peer(cfg: LoopConfig, servers: S3Servers, data: Dataset, scratch: str,
                 log: Callable[[str], None]) -> PeerFactory:
    """litdata over the same samples, bucket and latency proxy, from its own environment.

    The samples are converted by ``litdata.optimize`` (chunks of the shards' size, blobs as uint8
    arrays, no compression) and uploaded beside the tar shards; each trial starts fresh rank
    processes running ``benchmarks/peer_litdata.py`` (``StreamingDataset("s3://...",
    cache_dir=...)`` + ``StreamingDataLoader``), a new cache directory for each ``cold`` trial.
    """
    exe, script, remote = _peer_data("litdata", cfg, servers, data, scratch, log)
    s3 = servers.s3
    opts = s3.storage_options(servers.proxies[0])
    # litdata passes storage_options to its boto3 client; its obstore chunk reader copies the endpoint
    options = {"endpoint_url": servers.proxies[0], "aws_access_key_id": opts["key"],
               "aws_secret_access_key": opts["secret"], "region_name": s3.region}
    cache = _PeerCache(scratch, "litdata-cache")

    def contenders(setup: Setup, base: dict[str, Any]) -> Contenders:
        def trial(cold: bool) -> dict[str, Any]:
            # litdata reads its rank from GLOBAL_RANK (RANK is ignored without torch.distributed)
            envs = [{**_rank_env(r, setup.ranks, r), "GLOBAL_RANK": str(r), "NNODES": "1"} for r in range(setup.ranks)]
            c = {**base, "remote": remote, "cache": cache.get(cold), "options": options}
            return _fresh_trial(exe, script, envs, c, data.bytes / data.samples)

        return {"litdata cold": lambda: trial(True), "litdata warm": lambda: trial(False)}

    return contenders


def _mosaicml_stalled(results: list[dict[str, Any]]) -> str | None:
    """Why a mosaicml trial is left out, or None: a batch waited over ``STALL_S``, its shared-connection stall."""
    from benchmarks.peer_mosaicml import STALL_S

    waits = [e.get("max_wait_s", 0.0) for r in results for e in r["epochs"]]
    if max(waits) < STALL_S:
        return None
    return (f"stalled: a batch waited {max(waits):.0f} s. mosaicml-streaming's forked DataLoader workers share the "
            "keep-alive connection of the boto3 client its main process used for index.json; one waits for bytes "
            "another read, until botocore's read timeout (its download_timeout, 60 s): benchmarks/peer_mosaicml.py")


def bench_cpu_cost(data: Dataset, reps: int) -> dict[str, Any]:
    """CPU seconds per GB to turn local shards into samples in one process (no loader, no network).

    Separates the readers' own CPU cost from the loop's stall, which on a loaded machine is mostly
    CPU starvation of the DataLoader processes. streamio verifies every sample's CRC32C here;
    webdataset verifies nothing.
    """
    import webdataset as wds

    from streamio.data.dataset import StreamingDataset

    def cost(fn: Callable[[], int]) -> Callable[[], float]:
        def run() -> float:
            t = time.process_time()
            n = fn()
            if n != data.samples:
                raise RuntimeError(f"read {n} samples of {data.samples}")
            return (time.process_time() - t) / (data.bytes / GB)
        return run

    urls = [os.path.join(data.local, f) for f in data.files]
    contenders = {
        "streamio StreamingDataset": cost(lambda: sum(1 for _ in StreamingDataset(data.local, shuffle=False))),
        "webdataset WebDataset": cost(lambda: sum(1 for _ in wds.WebDataset(urls, shardshuffle=False,
                                                                            empty_check=False))),
    }
    runs = interleave(contenders, reps)
    out = {k: summary(v) for k, v in runs.items()}
    vs_wds = ratio(out["streamio StreamingDataset"]["median"], out["webdataset WebDataset"]["median"])
    return {"cpu_s_per_GB": out, "ratio streamio / webdataset": vs_wds}


# ----------------------------------------------------------------------------- scale
def bench_scale(servers: S3Servers, data: Dataset, scratch: str, *, nodes: int = 2, ranks_per_node: int = 2,
                workers: int = 1, batch_size: int = 16, epochs: int = 2) -> dict[str, Any]:
    """2 simulated nodes x 2 ranks: GETs/bytes per node and GETs per shard from the proxy logs."""
    if len(servers.proxies) < nodes:
        raise ValueError(f"bench_scale needs {nodes} proxies (one per node), got {len(servers.proxies)}")
    s3 = servers.s3
    world = nodes * ranks_per_node
    caches = [os.path.join(scratch, f"node-{n}") for n in range(nodes)]
    for c in caches:
        shutil.rmtree(c, ignore_errors=True)
    per_epoch = []
    envs = [_rank_env(n * ranks_per_node + lr, world, lr) for n in range(nodes) for lr in range(ranks_per_node)]
    pool = RankPool(envs)
    for epoch in range(epochs):
        servers.clear()
        cfgs = []
        for n in range(nodes):
            for _local_rank in range(ranks_per_node):
                cfgs.append({"method": "streamio", "url": s3.url(data.prefix),
                             "options": s3.storage_options(servers.proxies[n]), "cache": caches[n],
                             "cache_bytes": data.bytes * 2 + 256 * MB, "batch_size": batch_size, "workers": workers,
                             "prefetch": 4, "compute_s": 0.0, "shuffle": True, "epochs": [epoch]})
        try:
            results = pool.run(cfgs)
        except BaseException:
            pool.close()
            raise
        logs = servers.log_summary()[:nodes]
        shard_gets: dict[str, int] = {}
        for lg in logs:
            for path, k in lg["gets_per_path"].items():
                if path.endswith(".tar"):
                    shard_gets[path] = shard_gets.get(path, 0) + k
        per_epoch.append({
            "epoch": epoch,
            "samples": sum(r["epochs"][0]["samples"] for r in results),
            "per_node": [_node_counts(lg) for lg in logs],
            "gets_per_shard_max": max(shard_gets.values(), default=0),
            "gets_per_shard_mean": (sum(shard_gets.values()) / len(data.files)),
        })
    pool.close()
    predicted = scale_model(
        [data.samples // len(data.files)] * len(data.files), data.bytes / len(data.files), nodes=nodes,
        gpus=ranks_per_node, workers=workers, epochs=epochs, batch_size=batch_size, cache_epochs=epochs,
    )
    return {"nodes": nodes, "ranks_per_node": ranks_per_node, "workers": workers, "epochs": epochs,
            "shards": len(data.files), "shard_bytes": data.bytes // len(data.files), "measured": per_epoch,
            "model_same_setup": predicted}


def _node_counts(lg: dict[str, Any]) -> dict[str, int]:
    """One node's proxy log summary: all GETs, GETs of shards, bytes, distinct shards fetched."""
    shard_gets = {p: k for p, k in lg["gets_per_path"].items() if p.endswith(".tar")}
    return {"gets": lg["gets"], "shard_gets": sum(shard_gets.values()), "bytes": lg["bytes"],
            "shards_fetched": len(shard_gets)}


def scale_model(counts: Sequence[int], shard_bytes: float, *, nodes: int, gpus: int, workers: int, epochs: int,
                batch_size: int = 32, cache_epochs: int = 1) -> dict[str, Any]:
    """GETs and bytes of an ``epochs``-epoch job, derived from the planner's runs for every rank.

    Model: every run of a (rank, worker) stream is one ranged read; with a node cache each node
    downloads each shard its ranks touch once while it stays cached (whole shard, one streaming GET,
    resumed on reset). ``cache_epochs``: how many epochs' worth of a node's shards its cache holds
    (1: shards are fetched again in a later epoch unless touched in the previous one; >= epochs:
    nothing is fetched twice by one node). Shard order is reshuffled every epoch (``Shuffle``
    shards, no sample window, seed :data:`SCALE_SEED` as the measured ranks); ranks are consecutive per node
    (torchrun's numbering).
    """
    import numpy as np

    from streamio.data.plan import Sampling, Shuffle, Topology, plan_epoch

    counts_a = np.asarray(counts, dtype=np.int64)
    world = nodes * gpus
    history: list[list[set[int]]] = []
    runs_total, touched_total, consumed = 0, 0, 0
    per_shard_fetches = np.zeros(len(counts_a), dtype=np.int64)
    fetched_per_node = np.zeros(nodes, dtype=np.int64)
    for epoch in range(epochs):
        plan = plan_epoch(counts_a, seed=SCALE_SEED, epoch=epoch, topology=Topology(world, workers, batch_size),
                          sampling=Sampling(Shuffle(shards=True, window=0), policy="drop"))
        touched: list[set[int]] = []
        for n in range(nodes):
            shards: set[int] = set()
            for r in range(n * gpus, (n + 1) * gpus):
                for stream in plan.streams(r):
                    runs_total += len(stream.runs)
                    for run in stream.runs:
                        shards.add(run.shard)
                        consumed += run.end - run.first
            # fetched = touched minus what the node's cache still holds from recent epochs
            held: set[int] = set()
            if history and cache_epochs > 0:
                held = held.union(*(h[n] for h in history[-cache_epochs:]))
            new = shards - held
            fetched_per_node[n] += len(new)
            for s in new:
                per_shard_fetches[s] += 1
            touched.append(shards)
            touched_total += len(new)
        history.append(touched)
    sample_bytes = shard_bytes / max(1, float(np.mean(counts_a)))
    return {
        "nodes": nodes, "gpus_per_node": gpus, "workers": workers, "epochs": epochs, "shards": int(len(counts_a)),
        "shard_GB": shard_bytes / GB, "cache_epochs": cache_epochs,
        "uncached_gets": runs_total,
        "cached_downloads": touched_total,
        "downloads_per_shard_max": int(per_shard_fetches.max()),
        "downloads_per_shard_mean": float(per_shard_fetches.mean()),
        "bytes_per_node_TB_max": float(fetched_per_node.max()) * shard_bytes / 1e12,
        "bytes_total_TB": touched_total * shard_bytes / 1e12,
        "consumed_TB": consumed * sample_bytes / 1e12,
        "amplification": touched_total * shard_bytes / max(1.0, consumed * sample_bytes),
    }


def model_table(quick: bool = False) -> list[dict[str, Any]]:
    """The scale table of RESULTS.md: 5,000 x 10 GB shards (10,000 samples of 1 MB each)."""
    counts = [10_000] * 5_000
    rows = []
    setups = [(1, 8, 8, 1, 1), (8, 8, 8, 1, 1), (64, 8, 8, 1, 1), (64, 8, 8, 3, 1), (64, 8, 8, 3, 3), (128, 8, 8, 1, 1)]
    if quick:
        setups = [(8, 8, 8, 1, 1), (64, 8, 8, 1, 1)]
    for nodes, gpus, workers, epochs, cache_epochs in setups:
        rows.append(scale_model(counts, 10 * GB, nodes=nodes, gpus=gpus, workers=workers, epochs=epochs,
                                cache_epochs=cache_epochs))
    return rows


# ----------------------------------------------------------------------------- entry points
def run(quick: bool = False, *, sections: Sequence[str] = ("dataset", "scale"), log: Callable[[str], None] = print,
        use_nginx: bool = True, scratch_dir: str | None = None, peers: Sequence[str] = (),
        cfg: LoopConfig | None = None) -> dict[str, Any]:
    """Prepare data + servers once, run the requested sections; returns their results.

    ``cfg``: the loop's sizes and setups (default: :class:`LoopConfig`, or its ``quick()`` one).
    """
    cfg = cfg or (LoopConfig.quick() if quick else LoopConfig())
    out: dict[str, Any] = {}
    scratch = tempfile.mkdtemp(prefix="bench-dataset-", dir=scratch_dir)
    nginx = None
    try:
        t0 = time.perf_counter()
        data = make_dataset(os.path.join(scratch, "data"), cfg.shards, cfg.shard_mb, cfg.sample_kb)
        with S3Servers(proxies=2, latency=cfg.latency_ms / 1000) as servers:
            upload_dataset(data, servers.s3.boto3_client(), servers.s3.bucket, "ds")
            log(f"dataset: {len(data.files)} shards, {data.samples} samples, {data.bytes / MB:.0f} MB, "
                f"ready in {time.perf_counter() - t0:.1f} s")
            nginx_url = None
            if use_nginx and "dataset" in sections:
                nginx = Nginx(data.local)
                if nginx.start():
                    nginx_url = nginx.url
                else:
                    out["nginx_skipped"] = nginx.why
                    log(f"nginx skipped: {nginx.why}")
            if "dataset" in sections:
                out["dataset"] = bench_loop(cfg, servers, data, scratch, nginx_url, log, quick_mode=quick, peers=peers)
                out["dataset"]["cpu_cost"] = bench_cpu_cost(data, max(3, cfg.reps))
            if "scale" in sections:
                servers.set_latency(0.0)  # counts do not depend on latency; keep the section short
                out["scale"] = bench_scale(servers, data, scratch, workers=1 if quick else 2)
                out["scale"]["model"] = model_table(quick)
    finally:
        if nginx is not None:
            nginx.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def loop_config(quick: bool, setups: str | None, reps: int | None, shards: int | None) -> LoopConfig:
    """The loop config of the command line: the defaults (or quick ones) with what it overrides."""
    cfg = LoopConfig.quick() if quick else LoopConfig()
    over: dict[str, Any] = {k: v for k, v in (("reps", reps), ("shards", shards)) if v is not None}
    if setups:
        parsed = [tuple(int(x) for x in s.split("x")) for s in setups.split(",")]
        if any(len(p) != 3 or min(p[:2]) < 1 or p[2] < 0 for p in parsed):
            raise SystemExit(f"--setups: expected RANKSxBATCHxWORKERS (ranks, batch >= 1), comma-separated; "
                             f"got {setups!r}")
        (ranks, batch, workers), more = parsed[0], parsed[1:]
        over.update(ranks=ranks, batch_size=batch, workers=workers, more=tuple(more))
    return replace(cfg, **over)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--rank-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="8 shards x 4 MB, 1 worker per rank, 1 repetition")
    ap.add_argument("--sections", default="dataset,scale")
    ap.add_argument("--no-nginx", action="store_true")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--peers", default="", help="comma-separated peers from their own environments: mosaicml,litdata")
    ap.add_argument("--setups", help="loop setups RANKSxBATCHxWORKERS, comma-separated, the first one the main "
                    "setup (default 2x8x2,2x32x4,1x8x2,1x32x4; quick 2x8x1,1x32x2)")
    ap.add_argument("--reps", type=int, help="repetitions of every loop contender (default 3; quick 1)")
    ap.add_argument("--shards", type=int, help="shards of the data set (default 32 x 16 MB; quick 8 x 4 MB)")
    args = ap.parse_args(argv)
    if args.rank_server:
        _rank_server()
        sys.stdout.flush()
        os._exit(0)  # no interpreter teardown races with DataLoader workers (docs/design.md)
    res = run(args.quick, sections=args.sections.split(","), use_nginx=not args.no_nginx,
              log=lambda s: print(s, file=sys.stderr, flush=True), peers=[p for p in args.peers.split(",") if p],
              cfg=loop_config(args.quick, args.setups, args.reps, args.shards))
    emit_json(res, args.json, indent=2)


if __name__ == "__main__":
    main()
