"""Data pipeline cost: CPU seconds per delivered GB, samples/s and start-up, streamio vs its peers (issue 17).

Run: ``.venv/bin/python -m benchmarks.bench_pipeline [--quick] [--peers webdataset,mosaicml,litdata] [--json OUT]``
(or as the ``pipeline`` section of ``python -m benchmarks.run``). ``--quick`` (~64 MB) skips
mosaicml-streaming and litdata: their environments take minutes to build the first time and their
servers ~10 s to import; webdataset shares streamio's environment and always runs.

What one trial is. A fresh process (forked from a per-environment server that has only imported
the libraries: :mod:`benchmarks.peer_pipeline` says why) builds the contender's dataset and
loader, iterates one epoch on 1 rank, and reports wall time, the time from building the dataset to
the first batch (start-up), samples and distinct keys (each trial must read every sample exactly
once), and ``getrusage`` CPU of the process and of its reaped children (the DataLoader workers)
over the same span. CPU s per GB = that CPU / the payload bytes delivered (10^9 bytes). Warm: the
files are in the page cache (read once before the trials), streamio's node cache is full.

Part 1, raw samples: 64 KiB random blobs (``KEY.bin`` + ``KEY.cls``), 16,384 (1.07 GB; ``--quick``
1,024) in 16 shards, at batch 8 / 2 workers and batch 32 / 4 workers. Contenders, interleaved:

* ``streamio (default)``: ``StreamingDataset(dir, batch_size=B)`` + ``StreamingDataLoader(ds, num_workers=W)``
  over the local shards (the default shuffle);
* ``streamio shuffle=False``: the same in index order;
* ``streamio threads=W``: the default dataset with ``StreamingDataLoader(ds, threads=W)`` (no worker
  processes: batches made on W threads of the trial's process, issue 39), as many threads as the
  default has workers;
* ``streamio node cache``: the default over an S3 copy (moto) with ``DatasetOptions(cache=CacheConfig(...))``,
  the cache filled by an earlier epoch (its cold figures are the ``cache fill`` trial);
* ``webdataset``: ``wds.WebDataset(urls, shardshuffle=False)`` + ``wds.WebLoader``;
* ``mosaicml-streaming``: the same samples as MDS (``MDSWriter``), ``StreamingDataset(local=DIR)`` + ``DataLoader``;
* ``litdata``: the same samples through ``litdata.optimize`` (blobs as uint8 arrays), its
  ``StreamingDataset(DIR)`` + ``StreamingDataLoader``;
* ``in-memory ceiling``: a ``DataLoader`` over an ``IterableDataset`` yielding the same sample dicts
  from memory (bytes built before the clock starts), split by worker.

Part 2, images: JPEGs of 512 x 384 made with PIL (smooth gradients + noise, quality 95: ~110 KB,
the measured mean is reported), 2,048 (``--quick`` 256), batch 32 / 2 workers, 2 repetitions (3 for
part 1: the image trials are CPU-bound and long, and the section must fit ~10 min); every contender
decodes and resizes them to 224 x 224 uint8 tensors in its workers with the same function
(:func:`benchmarks.peer_pipeline.decode_resize`); ``streamio threads=N`` (N = 2 and 4) does it on N
threads of one process. CPU s per GB there is per GB of JPEG read.

Ratios (``ratios``, each named with its goal from issue 17, read by ``tables.goal_met``): streamio
(default) / each peer in samples/s (>= 1.5 webdataset and litdata, >= 1.2 mosaicml), streamio CPU
s per GB / the lowest peer's (<= 0.5) and absolute, local and from the node cache (<= 1.0),
streamio / the in-memory ceiling (>= 0.5), streamio start-up / the fastest peer's (<= 1.0: this
module's reading of "ahead of every peer on first batch"), and for images streamio / each peer
(>= 1.0). The thread path (issue 39) gets its own lines: ``streamio threads=N`` / ``streamio
(default)`` in samples/s and in CPU s per GB, its CPU s per GB (target <= 1.0) and threads / each
peer in samples/s (issue 39's targets: >= 1.5 raw, >= 1.2 images against litdata). The peers
run at their defaults (no shuffle). All data lives in one scratch directory,
removed at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, S3Servers, emit_json, interleave, ratio, summary  # noqa: E402

GB = 1e9
PEERS = ("webdataset", "mosaicml", "litdata")
OWN_ENV = ("mosaicml", "litdata")  # peers that run from .venv-peers/NAME
STREAMIO = "streamio (default)"
NODE_CACHE = "streamio node cache (default)"
CEILING = "in-memory ceiling"
IMAGE_THREADS = (2, 4)  # the image part's thread-path contenders
PEER_NAMES = {"webdataset": "webdataset", "mosaicml": "mosaicml-streaming", "litdata": "litdata"}
FIGURES = ("samples_per_s", "cpu_s_per_GB", "first_batch_s", "steady_samples_per_s", "cpu_main_s_per_GB",
           "cpu_workers_s_per_GB", "MBps", "wall_s")  # summarised over a contender's trials
SAMPLES_GOAL = {"webdataset": 1.5, "mosaicml": 1.2, "litdata": 1.5}  # streamio / peer samples/s (issue 17)


@dataclass(frozen=True)
class Config:
    """Sizes and loader settings (see the module docstring)."""

    samples: int = 16_384
    sample_bytes: int = 65_536
    shards: int = 16
    images: int = 2_048
    distinct_images: int = 64  # generated, then repeated under new keys (decoding costs the same)
    jpeg_quality: int = 95
    loaders: tuple[tuple[int, int], ...] = ((8, 2), (32, 4))  # (batch, workers)
    image_loader: tuple[int, int] = (32, 2)
    reps: int = 3
    image_reps: int = 2  # image trials are CPU-bound and long: 2 keep the section under ~10 min on 2 loaded cores

    @classmethod
    def quick(cls) -> Config:
        return cls(samples=1_024, images=256, reps=1, image_reps=1)


@dataclass(frozen=True)
class Data:
    dir: str
    samples: int
    payload: int  # member bytes of all samples (what a trial delivers)


# ----------------------------------------------------------------------------- data
def write_raw(root: str, cfg: Config) -> Data:
    """``cfg.samples`` random ``KEY.bin`` blobs + ``KEY.cls`` in ``cfg.shards`` shards (``write_dataset``)."""
    import streamio

    pool = os.urandom(8 << 20)
    size = cfg.sample_bytes

    def samples() -> Any:
        for i in range(cfg.samples):
            off = (i * 7919 * 64) % (len(pool) - size)
            yield {"__key__": f"{i:08d}", "bin": pool[off:off + size], "cls": str(i % 10).encode()}

    streamio.write_dataset(samples(), root, spec=streamio.ShardSpec(max_count=cfg.samples // cfg.shards))
    return Data(root, cfg.samples, cfg.samples * size + sum(len(str(i % 10)) for i in range(cfg.samples)))


def make_jpeg(rng: Any, quality: int) -> bytes:
    """A 512 x 384 RGB JPEG: three smooth sinusoidal gradients plus Gaussian noise (sigma 12)."""
    import numpy as np
    from PIL import Image

    y = np.linspace(0, 1, 384)[:, None]
    x = np.linspace(0, 1, 512)[None, :]
    a, b, c = rng.random(3) * 6
    base = np.stack([np.sin(3 * a * x + 2 * b * y), np.cos(2 * b * x + 3 * c * y), np.sin(2 * c * (x + y) + a)], -1)
    img = np.clip((base * 0.5 + 0.5) * 255 + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def write_images(root: str, cfg: Config) -> Data:
    """``cfg.images`` JPEG samples (``KEY.jpg`` + ``KEY.cls``) in ``cfg.shards`` shards."""
    import numpy as np

    import streamio

    rng = np.random.default_rng([17, 4])
    jpegs = [make_jpeg(rng, cfg.jpeg_quality) for _ in range(cfg.distinct_images)]
    samples = [{"__key__": f"{i:08d}", "jpg": jpegs[i % len(jpegs)], "cls": str(i % 10).encode()}
               for i in range(cfg.images)]
    streamio.write_dataset(iter(samples), root, spec=streamio.ShardSpec(max_count=cfg.images // cfg.shards))
    return Data(root, cfg.images, sum(len(s["jpg"]) + len(s["cls"]) for s in samples))


def warm_page_cache(*dirs: str) -> None:
    for d in dirs:
        for p in Path(d).rglob("*"):
            if p.is_file():
                with open(p, "rb") as f:
                    while f.read(8 << 20):
                        pass


# ----------------------------------------------------------------------------- servers
class ForkServer:
    """One :func:`benchmarks.peer_pipeline.serve` process (an environment's interpreter), asked op by op."""

    def __init__(self, name: str, cmd: Sequence[str]) -> None:
        self.name = name
        self._log = tempfile.TemporaryFile(mode="w+")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RANK", "WORLD_SIZE", "LOCAL_"))}
        env.update(PYTHONPATH=str(REPO), LITDATA_DISABLE_VERSION_CHECK="1")
        self._proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                      text=True, cwd=REPO, env=env)

    def ask(self, **op: Any) -> dict[str, Any]:
        """Send ``op``; its result. Raises RuntimeError when it failed or the server died."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(op) + "\n")
        self._proc.stdin.flush()
        while True:
            line = self._proc.stdout.readline()
            if not line:
                self._log.seek(0)
                raise RuntimeError(f"{self.name} server died ({self._proc.poll()}): {self._log.read()[-2000:]}")
            if line.startswith("RESULT "):
                break
        res = dict(json.loads(line[len("RESULT "):]))
        if "error" in res:
            raise RuntimeError(f"{self.name}: {res['error'][-2000:]}")
        return res

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._log.close()


def start_servers(peers: Sequence[str], log: Callable[[str], None]) -> tuple[dict[str, ForkServer], dict[str, str]]:
    """The streamio environment's server and one per requested peer environment; peers that cannot start: why."""
    from benchmarks import peer_env

    servers = {"streamio": ForkServer("streamio", [sys.executable, "-m", "benchmarks.bench_pipeline", "--serve"])}
    failed: dict[str, str] = {}
    for peer in (p for p in OWN_ENV if p in peers):
        try:
            exe = peer_env.python(peer, log=log)
            servers[peer] = ForkServer(peer, [str(exe), str(REPO / "benchmarks" / "peer_pipeline.py"), "serve"])
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run is reported, the rest still measured
            failed[peer] = f"failed: {type(exc).__name__}: {exc}"[-600:]
    return servers, failed


def make_streamio(cfg: Mapping[str, Any]) -> Any:
    """streamio's trial (:data:`benchmarks.peer_pipeline.Maker`): ``StreamingDataset`` + ``StreamingDataLoader``."""
    import streamio
    from benchmarks.peer_pipeline import image_from_tar_sample

    cache = cfg.get("cache")
    options = streamio.DatasetOptions(cache=streamio.CacheConfig(cache, max_bytes=cfg["cache_bytes"],
                                                                 min_free_bytes=0)) if cache else None

    def build() -> Any:
        ds = streamio.StreamingDataset(cfg["url"], batch_size=cfg["batch_size"], shuffle=cfg.get("shuffle", True),
                                       storage_options=cfg.get("storage_options"), options=options,
                                       transform=image_from_tar_sample if cfg.get("image") else None)
        return streamio.StreamingDataLoader(ds, num_workers=cfg["workers"], threads=cfg.get("threads", 0))

    return build


def _serve() -> None:
    import PIL.Image  # noqa: F401 - imported once here, not in every trial (as the peers' servers do)
    import s3fs  # noqa: F401 - fsspec's s3 protocol, which the node-cache trials open
    import webdataset  # noqa: F401

    import streamio
    from benchmarks.peer_pipeline import MAKERS, serve

    streamio.StreamingDataset, streamio.StreamingDataLoader  # noqa: B018 - resolve the lazy exports once
    serve({**MAKERS, "streamio": make_streamio})


# ----------------------------------------------------------------------------- trials
class Trials:
    """Runs contenders' trials on their servers, checks them and turns them into rates; remembers failures."""

    def __init__(self, servers: Mapping[str, ForkServer], log: Callable[[str], None]) -> None:
        self.servers = servers
        self.log = log
        self.not_measured: dict[str, str] = {}

    def contender(self, name: str, server: str, data: Data, **op: Any) -> Callable[[], dict[str, float] | None]:
        def run() -> dict[str, float] | None:
            if name in self.not_measured:
                return None
            try:
                return self.once(server, data, **op)
            except Exception as exc:  # noqa: BLE001 - one broken contender must not hide the others
                self.not_measured[name] = f"failed: {exc}"[-1500:]
                self.log(f"pipeline: {name} not measured: {self.not_measured[name]}")
                return None
        return run

    def once(self, server: str, data: Data, **op: Any) -> dict[str, float]:
        r = self.servers[server].ask(op="trial", **op)
        if r["samples"] != data.samples or r["distinct"] != data.samples:
            raise RuntimeError(f"read {r['samples']} samples ({r['distinct']} distinct) of {data.samples}")
        gb = data.payload / GB
        cpu = r["cpu_main_s"] + r["cpu_workers_s"]
        steady = r["wall_s"] - r["first_batch_s"]
        return {"samples_per_s": r["samples"] / r["wall_s"], "cpu_s_per_GB": cpu / gb,
                "first_batch_s": r["first_batch_s"], "MBps": data.payload / r["wall_s"] / 1e6,
                "steady_samples_per_s": (r["samples"] - op["batch_size"]) / steady if steady > 0 else float("nan"),
                "cpu_main_s_per_GB": r["cpu_main_s"] / gb, "cpu_workers_s_per_GB": r["cpu_workers_s"] / gb,
                "wall_s": r["wall_s"], "loadavg_1m": r["loadavg_1m"], "children_left": r["children_left"]}

    def measure(self, contenders: Mapping[str, Callable[[], dict[str, float] | None]], reps: int) -> dict[str, Any]:
        """Interleaved repetitions; per contender, a summary of each figure over its trials."""
        runs = interleave(contenders, reps, log=self.log)
        out: dict[str, Any] = {}
        for name, trials in runs.items():
            got = [t for t in trials if t is not None]
            if got:
                out[name] = {k: summary([t[k] for t in got]) for k in FIGURES}
                out[name].update(loadavg_1m=[t["loadavg_1m"] for t in got],
                                 children_left=max(t["children_left"] for t in got))
        return out


def _loader_contenders(t: Trials, raw: Data, paths: Mapping[str, str], s3: Mapping[str, Any], batch: int,
                       workers: int, peers: Sequence[str]) -> dict[str, Callable[[], dict[str, float] | None]]:
    base = {"batch_size": batch, "workers": workers}
    c = {
        STREAMIO: t.contender(STREAMIO, "streamio", raw, loader="streamio", url=raw.dir, **base),
        "streamio shuffle=False": t.contender("streamio shuffle=False", "streamio", raw, loader="streamio",
                                              url=raw.dir, shuffle=False, **base),
        NODE_CACHE: t.contender(NODE_CACHE, "streamio", raw, loader="streamio", **s3, **base),
        threads_name(workers): t.contender(threads_name(workers), "streamio", raw, loader="streamio", url=raw.dir,
                                           batch_size=batch, workers=0, threads=workers),
    }
    if "webdataset" in peers:
        c["webdataset"] = t.contender("webdataset", "streamio", raw, loader="webdataset", dir=raw.dir, **base)
    for peer in (p for p in OWN_ENV if p in t.servers):
        name = PEER_NAMES[peer]
        c[name] = t.contender(name, peer, raw, loader=peer, dir=paths[f"{peer}-raw"], key="key", **base)
    c[CEILING] = t.contender(CEILING, "streamio", raw, loader="memory", dir=raw.dir, **base)
    return c


def _image_contenders(t: Trials, img: Data, paths: Mapping[str, str], batch: int, workers: int,
                      peers: Sequence[str]) -> dict[str, Callable[[], dict[str, float] | None]]:
    base = {"batch_size": batch, "workers": workers, "image": True}
    c = {STREAMIO: t.contender(f"image {STREAMIO}", "streamio", img, loader="streamio", url=img.dir, **base)}
    for n in IMAGE_THREADS:
        c[threads_name(n)] = t.contender(f"image {threads_name(n)}", "streamio", img, loader="streamio", url=img.dir,
                                         **{**base, "workers": 0, "threads": n})
    if "webdataset" in peers:
        c["webdataset"] = t.contender("image webdataset", "streamio", img, loader="webdataset", dir=img.dir, **base)
    for peer in (p for p in OWN_ENV if p in t.servers):
        name = PEER_NAMES[peer]
        c[name] = t.contender(f"image {name}", peer, img, loader=peer, dir=paths[f"{peer}-image"], **base)
    c[CEILING] = t.contender(f"image {CEILING}", "streamio", img, loader="memory", dir=img.dir, **base)
    return c


def threads_name(n: int) -> str:
    return f"streamio threads={n}"


def _medians(contenders: Mapping[str, Any], figure: str) -> dict[str, float]:
    return {n: c[figure]["median"] for n, c in contenders.items()}


def _vs_peers(tag: str, med: Mapping[str, float], what: str, goals: Mapping[str, float]) -> dict[str, float]:
    """streamio / each measured peer, named with the peer's goal."""
    return {f"{tag}: streamio / {PEER_NAMES[p]}, {what} (target >= {goals[p]})": ratio(med.get(STREAMIO),
                                                                                         med[PEER_NAMES[p]])
            for p in PEERS if PEER_NAMES[p] in med}


def _vs_best_peer(tag: str, med: Mapping[str, float], what: str, goal: float) -> dict[str, float]:
    """streamio / the lowest figure of any measured peer (lower is better: CPU, start-up)."""
    got = [med[PEER_NAMES[p]] for p in PEERS if PEER_NAMES[p] in med]
    if not got:
        return {}
    return {f"{tag}: streamio / best peer, {what} (target <= {goal})": ratio(med.get(STREAMIO), min(got))}


def ratios(loaders: Mapping[str, Mapping[str, Any]], image: Mapping[str, Any]) -> dict[str, float]:
    """The issue's figures, each named with its goal (``(target >= x)``, read by ``tables.goal_met``).

    The start-up goal (no worse than the fastest peer) is this module's reading of the issue's
    "ahead of every peer on ... first batch".
    """
    out: dict[str, float] = {}
    for tag, cs in loaders.items():
        sps, cpu = _medians(cs, "samples_per_s"), _medians(cs, "cpu_s_per_GB")
        out.update(_vs_peers(tag, sps, "samples/s", SAMPLES_GOAL))
        out.update(_vs_best_peer(tag, cpu, "CPU s per GB", 0.5))
        out[f"{tag}: streamio CPU s per GB (target <= 1.0)"] = cpu.get(STREAMIO, float("nan"))
        out[f"{tag}: streamio node cache CPU s per GB (target <= 1.0)"] = cpu.get(NODE_CACHE, float("nan"))
        out[f"{tag}: streamio / in-memory ceiling, samples/s (target >= 0.5)"] = ratio(sps.get(STREAMIO),
                                                                                        sps.get(CEILING))
        out.update(_vs_best_peer(tag, _medians(cs, "first_batch_s"), "start-up s", 1.0))
    out.update(_vs_peers("images", _medians(image, "samples_per_s"), "samples/s", dict.fromkeys(PEERS, 1.0)))
    for tag, cs in loaders.items():
        out.update(_threads_ratios(tag, cs, 1.5, raw=True))
    out.update(_threads_ratios("images", image, 1.2, raw=False))
    return out


def _threads_ratios(tag: str, cs: Mapping[str, Any], goal: float, *, raw: bool) -> dict[str, float]:
    """The thread path (issue 39) against the default workers path and each peer, for each thread count run
    (its CPU s per GB has a target for raw samples only: decoding JPEGs costs ~40 s per GB whoever does it)."""
    sps, cpu = _medians(cs, "samples_per_s"), _medians(cs, "cpu_s_per_GB")
    out: dict[str, float] = {}
    for name in sorted(n for n in sps if n.startswith("streamio threads=")):
        out[f"{tag}: {name} / {STREAMIO}, samples/s"] = ratio(sps[name], sps.get(STREAMIO))
        out[f"{tag}: {name} / {STREAMIO}, CPU s per GB"] = ratio(cpu[name], cpu.get(STREAMIO))
        out[f"{tag}: {name} CPU s per GB{' (target <= 1.0)' if raw else ''}"] = cpu[name]
        for p in PEERS:
            if PEER_NAMES[p] in sps:
                target = f" (target >= {goal})" if p == "litdata" else ""
                out[f"{tag}: {name} / {PEER_NAMES[p]}, samples/s{target}"] = ratio(sps[name], sps[PEER_NAMES[p]])
    return out


# ----------------------------------------------------------------------------- the section
def _prepare(root: str, cfg: Config, servers: dict[str, ForkServer], failed: dict[str, str],
             log: Callable[[str], None]) -> tuple[Data, Data, dict[str, str]]:
    raw = write_raw(os.path.join(root, "raw"), cfg)
    img = write_images(os.path.join(root, "image"), cfg)
    log(f"pipeline: {raw.payload / 1e6:,.0f} MB raw, {img.samples} images of {img.payload / img.samples / 1e3:.1f} KB")
    paths: dict[str, str] = {}
    for peer in [p for p in OWN_ENV if p in servers]:
        fmt = "mds" if peer == "mosaicml" else "litdata"
        try:
            for kind, data, blob in (("raw", raw, "bin"), ("image", img, "jpg")):
                out = paths[f"{peer}-{kind}"] = os.path.join(root, f"{peer}-{kind}")
                servers[peer].ask(op="write", format=fmt, src=data.dir, out=out, data=blob,
                                  shard_bytes=data.payload // cfg.shards + (1 << 20))
        except Exception as exc:  # noqa: BLE001 - reported, the others still measured
            failed[peer] = f"failed to write its format: {exc}"[-1500:]
            servers[peer].close()
            del servers[peer]
    warm_page_cache(root)
    return raw, img, paths


def run(quick: bool = False, peers: Sequence[str] = PEERS, log: Callable[[str], None] = print,
        scratch_dir: str | None = None, cfg: Config | None = None) -> dict[str, Any]:
    """The whole section: data, servers, the interleaved trials, ratios (see the module docstring)."""
    cfg = cfg or (Config.quick() if quick else Config())
    peers = [p for p in peers if p in PEERS and not (quick and p in OWN_ENV)]
    load_start = os.getloadavg()
    root = tempfile.mkdtemp(prefix="bench-pipeline-", dir=scratch_dir)
    servers, failed = start_servers(peers, log)
    try:
        raw, img, paths = _prepare(root, cfg, servers, failed, log)
        versions = {name: s.ask(op="versions") for name, s in servers.items()}
        t = Trials(servers, log)
        with S3Servers(proxies=1, latency=0.0) as s3srv:
            client = s3srv.s3.boto3_client()
            for p in Path(raw.dir).iterdir():
                client.put_object(Bucket=s3srv.s3.bucket, Key=f"raw/{p.name}", Body=p.read_bytes())
            s3 = {"url": s3srv.s3.url("raw"), "storage_options": s3srv.s3.storage_options(),
                  "cache": os.path.join(root, "node-cache"), "cache_bytes": 2 * raw.payload + (256 << 20)}
            fill = t.once("streamio", raw, loader="streamio", batch_size=32, workers=4, **s3)
            loaders = {f"batch {b}, {w} workers": t.measure(_loader_contenders(t, raw, paths, s3, b, w, peers),
                                                              cfg.reps) for b, w in cfg.loaders}
        b, w = cfg.image_loader
        image = t.measure(_image_contenders(t, img, paths, b, w, peers), cfg.image_reps)
    finally:
        for s in servers.values():
            s.close()
        shutil.rmtree(root, ignore_errors=True)
    not_measured = {PEER_NAMES[p]: why for p, why in failed.items()}
    not_measured.update(t.not_measured)
    for p in PEERS:
        if p not in peers:
            not_measured[PEER_NAMES[p]] = ("--quick skips the peers' own environments (minutes to build the first "
                                           "time, ~10 s to import)" if quick and p in OWN_ENV else "not requested")
    return {"config": asdict(cfg), "raw": {"samples": raw.samples, "payload_bytes": raw.payload},
            "images": {"samples": img.samples, "payload_bytes": img.payload,
                       "mean_jpeg_bytes": img.payload / img.samples, "distinct": cfg.distinct_images},
            "cache_fill": fill, "loaders": loaders, "image": image, "ratios": ratios(loaders, image),
            "not_measured": not_measured, "versions": versions,
            "loadavg": {"start": list(load_start), "end": list(os.getloadavg())}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="~64 MB, 256 images, 1 repetition, webdataset the only peer")
    ap.add_argument("--peers", default=",".join(PEERS), help="peers to compare (mosaicml, litdata: own environments)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the streamio environment's fork server
    args = ap.parse_args(argv)
    if args.serve:
        _serve()
        return
    from benchmarks.common import clean_aws_env

    clean_aws_env()
    out = run(args.quick, [p for p in args.peers.split(",") if p], log=lambda s: print(s, file=sys.stderr, flush=True))
    emit_json(out, args.json, indent=1)


if __name__ == "__main__":
    main()
