"""The benchmark suite: one command runs every section and writes RESULTS.md, results.json and plots.

Run: ``python -m benchmarks.run [--quick] [--only NAME[,NAME]] [--out DIR]`` (``make bench`` /
``make bench-quick``). The full suite (~15 min on 2 CPUs) writes into ``benchmarks/``, the figures
that are committed; ``--quick`` (~2 min, what CI runs) writes into ``benchmarks/out/quick/``.
``--report-only`` re-renders the report and plots from ``results.json``. Sections, in order:

* ``references`` — memory copy bandwidth and local disk sequential write (fsync'd) / read (page
  cache dropped or bypassed where possible, and warm): :mod:`benchmarks.common`.
* ``dataset``    — training loop samples/s and stall fraction, streamio vs webdataset, cold and
  warm cache, 2 ranks, moto behind a 30 ms proxy, plus nginx, plus the store's boto3 ceiling:
  :mod:`benchmarks.bench_dataset` (in-process driver, rank processes).
* ``scale``      — 2 simulated nodes x 2 ranks: GETs / bytes per node from proxy logs, and the
  planner-derived model for 64 nodes x 8 GPUs (same module; shares the dataset's setup).
* ``loader``     — one rank, local shards, no compute: the DataLoader path's own cost per batch,
  with and without streamio's integer sample fields (same module).
* ``read``       — the prefetching caching reader vs boto3/s3fs/local ceilings (issue 5's
  ``benchmarks/bench_read.py --json``, a subprocess).
* ``shard``      — writer throughput vs webdataset ``ShardWriter`` and a plain copy (issue 3's
  ``bench_shard.py --json``).
* ``plan``       — planner cost and shuffle quality (issue 4's ``bench_plan.py``, JSON lines).
* ``checkpoint`` — save blocked/durable and restore vs torch.save and torch DCP (issue 7's
  ``bench_checkpoint.py --json``).

Each section runs its contenders interleaved, several repetitions, and reports medians with
min-max and ratios to references measured in the same run (absolute numbers move between runs on
these shared machines; ratios much less). A section that fails is reported as failed in
RESULTS.md (with the tail of its error) and the command exits 1 after writing the report, so CI
notices a benchmark that rotted. ``--only`` re-runs some sections and keeps the others' last
results from ``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import common  # noqa: E402
from benchmarks.common import REPO, machine, machine_line, ratio  # noqa: E402

SECTIONS = ("references", "dataset", "scale", "loader", "read", "shard", "plan", "checkpoint")
HERE = Path(__file__).resolve().parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- sections
def _subprocess(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log(f"  $ {' '.join(args)}")
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` exited {proc.returncode}:\n{(proc.stderr or proc.stdout)[-1500:]}")
    return proc


def section_references(quick: bool, scratch: str) -> dict[str, Any]:
    return {
        "memcpy": common.memcpy_reference(64 if quick else 256, 3 if quick else 5),
        "disk": common.disk_reference(scratch, 64 if quick else 512, 1 if quick else 3),
    }


def section_loader(quick: bool, scratch: str) -> dict[str, Any]:
    from benchmarks.bench_dataset import bench_loader_overhead

    return bench_loader_overhead(quick, scratch)


def section_read(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["-m", "benchmarks.bench_read", "--json"] + (["--quick"] if quick else ["--rounds", "3"])
    proc = _subprocess(args, 900)
    out = proc.stdout
    return dict(json.loads(out[out.index("{"):]))


def section_shard(quick: bool, scratch: str) -> dict[str, Any]:
    dest = os.path.join(scratch, "shard.json")
    args = ["-m", "benchmarks.bench_shard", "--json", dest]
    args += ["--size-mb", "64", "--rounds", "1", "--targets", "local,read,index"] if quick else ["--size-mb", "500", "--rounds", "2"]
    _subprocess(args, 1200)
    res = json.loads(Path(dest).read_text())
    res["args"] = args[2:]
    return dict(res)


def section_plan(quick: bool, scratch: str) -> dict[str, Any]:
    proc = _subprocess(["-m", "benchmarks.bench_plan", "--quick"], 900)  # its full mode repeats 15x the same figures
    rows: dict[str, list[dict[str, Any]]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows.setdefault(row.pop("bench"), []).append(row)
    return {"rows": rows}


def section_checkpoint(quick: bool, scratch: str) -> dict[str, Any]:
    if not (HERE / "bench_checkpoint.py").exists():
        return {"skipped": "benchmarks/bench_checkpoint.py does not exist yet"}
    dest = os.path.join(scratch, "checkpoint.json")
    args = ["-m", "benchmarks.bench_checkpoint", "--json", dest]
    args += ["--size-mb", "48", "--reps", "1", "--targets", "disk"] if quick else ["--size-mb", "300", "--reps", "3"]
    _subprocess(args, 1500)
    res = json.loads(Path(dest).read_text())
    res["args"] = args[2:]
    return dict(res)


def run_sections(names: list[str], quick: bool, scratch: str, use_nginx: bool,
                 on_result: Callable[[dict[str, Any]], None] | None = None, peers: Sequence[str] = ()) -> dict[str, Any]:
    """Run ``names`` in suite order; each result carries its status, duration and date.

    ``on_result`` is called with each section's results as soon as they exist (saved at once, so
    an interrupted run keeps what it measured).
    """
    from benchmarks import bench_dataset

    out: dict[str, Any] = {}
    simple: dict[str, Callable[[bool, str], dict[str, Any]]] = {
        "references": section_references, "loader": section_loader, "read": section_read, "shard": section_shard,
        "plan": section_plan, "checkpoint": section_checkpoint,
    }
    data_secs = [n for n in ("dataset", "scale") if n in names]
    for name in SECTIONS:
        if name not in names or (name == "scale" and "dataset" in data_secs):
            continue
        t0 = time.perf_counter()
        log(f"== {name}")
        group = data_secs if name in ("dataset", "scale") else [name]
        try:
            if name in ("dataset", "scale"):
                res = bench_dataset.run(quick, sections=data_secs, log=log, use_nginx=use_nginx, scratch_dir=scratch, peers=peers)
                results = {n: {"status": "ok", **res[n]} for n in data_secs}
                if "nginx_skipped" in res:
                    results.setdefault("dataset", {})["nginx_skipped"] = res["nginx_skipped"]
            else:
                results = {name: {"status": "ok", **simple[name](quick, scratch)}}
        except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others' figures
            log(traceback.format_exc())
            results = {n: {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[-2000:]} for n in group}
        dt = time.perf_counter() - t0
        for n, r in results.items():
            r.update({"seconds": round(dt, 1), "quick": quick, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "loadavg_end": " ".join(f"{x:.1f}" for x in os.getloadavg())})
            out[n] = r
        if on_result is not None:
            on_result(results)
        log(f"== {name}: {dt:.0f} s")
    return out


# ----------------------------------------------------------------------------- report
def _f(x: Any, nd: int = 2) -> str:
    if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)):
        return f"{x:,.{nd}f}" if isinstance(x, float) else f"{x:,}"
    return "n/a"


def _med(s: dict[str, Any], nd: int = 1, pct: bool = False) -> str:
    k = 100.0 if pct else 1.0
    return f"{_f(s['median'] * k, nd)} [{_f(s['min'] * k, nd)}-{_f(s['max'] * k, nd)}]"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _status(name: str, sec: dict[str, Any] | None) -> list[str] | None:
    if sec is None:
        return [f"_Not run yet: `python -m benchmarks.run --only {name}`._", ""]
    if sec.get("status") != "ok":
        return [f"**FAILED** ({sec.get('date')}): `{sec.get('error', '')[:600]}`", ""]
    if "skipped" in sec:
        return [f"_Skipped: {sec['skipped']}_", ""]
    return None


def headline(res: dict[str, Any]) -> list[tuple[str, float]]:
    """The ratios a reviewer reads first (streamio vs each peer and vs the ceilings)."""
    out: list[tuple[str, float]] = []
    ds = res.get("dataset", {})
    if ds.get("status") == "ok":
        c = ds["contenders"]
        for k, v in ds["ratios"].items():
            out.append((f"data: {k}", v))
        if "cpu_cost" in ds:
            out.append(("data: reader CPU s per GB, one process, streamio / webdataset (lower is better)", ds["cpu_cost"]["ratio streamio / webdataset"]))
        for name in ("streamio cold", "streamio warm", "webdataset stream", "webdataset cold", "webdataset warm", "mosaicml cold", "mosaicml warm"):
            if name in c:
                out.append((f"data: {name} stall fraction (steady state, after the first batch)", c[name]["stall_steady"]["median"]))
    ld = res.get("loader", {})
    if ld.get("status") == "ok":
        for k, v in ld["ratios"].items():
            out.append((f"loader (1 rank, local, no compute, samples/s): {k}", v))
    rd = res.get("read", {})
    if rd.get("status") == "ok":
        for k, v in rd.get("ratios", {}).items():
            out.append((f"read: {k}", v))
    ck = res.get("checkpoint", {})
    if ck.get("status") == "ok":
        for target in ("disk", "s3"):
            for k, v in ck.get(target, {}).get("ratios", {}).items():
                out.append((f"checkpoint {target}: {k}", v))
    sh = res.get("shard", {})
    if sh.get("status") == "ok":
        for target in ("local", "s3"):
            if target in sh:
                out.append((f"shard {target}: streamio / webdataset ShardWriter", sh[target].get("vs_peer", float("nan"))))
                out.append((f"shard {target}: streamio / limit", sh[target].get("vs_limit", float("nan"))))
    return out


def write_report(res: dict[str, Any], out_dir: Path, plots: list[str]) -> Path:
    """Render RESULTS.md from the merged results."""
    m = res.get("machine", {})
    L: list[str] = [
        "# streamio benchmarks",
        "",
        "Generated by `python -m benchmarks.run` (`make bench`; `--quick` for the CI smoke run). Do not edit by hand.",
        "",
        f"Machine: {machine_line(m) if m else 'unknown'}.",
        "",
        "How to read these figures. The machines are small and shared (other jobs ran at the same time), so",
        "absolute numbers move between runs. Every comparison runs its contenders interleaved in one run",
        "(A B C, B C A, ...), reports the median and [min-max] of the repetitions, and ratios to references",
        "measured in the same run. moto is a slow S3 (uploads ~0.15 GB/s, every ranged GET reads the whole",
        "object, ~1 GB/s downloads at best), so S3 figures are ratios to moto's own ceiling (boto3 through the",
        "same server and proxy); nginx serving the same files shows where moto, not the reader, is the limit.",
        "",
    ]
    for name in SECTIONS:
        sec = res.get(name)
        if sec is not None:
            L.append(f"- `{name}`: {sec.get('status')}, {sec.get('seconds')} s, {'quick' if sec.get('quick') else 'full'} mode, "
                     f"{sec.get('date')}, load average at its end {sec.get('loadavg_end', 'n/a')} (on {m.get('nproc', '?')} CPUs)")
    L += ["", "## Headline ratios", ""]
    rows = [[k, _f(v, 2)] for k, v in headline(res)]
    L += _table(["ratio", "value"], rows) if rows else ["_none yet_"]
    L += [""]

    # references
    L += ["## References (this machine, this run)", ""]
    sec = res.get("references")
    st = _status("references", sec)
    if st:
        L += st
    else:
        assert sec is not None
        mem, disk = sec["memcpy"], sec["disk"]
        L += _table(["reference", "MB/s median [min-max]", "how"], [
            ["memory copy (numpy)", _med(mem["MBps"], 0), f"{mem['size_MB']} MB, {mem['reps']} reps, warm buffers"],
            ["disk sequential write + fsync", _med(disk["write_fsync_MBps"], 0), f"{disk['size_MB']} MB, 4 MiB writes, {disk['reps']} reps"],
            ["disk sequential read, cold", _med(disk["read_cold_MBps"], 0) if disk["read_cold_MBps"]["n"] else "n/a",
             f"page cache: {disk['read_cold_how']}"],
            ["disk sequential read, warm", _med(disk["read_warm_MBps"], 0), "page cache hot"],
        ])
        L += [""]

    # dataset
    L += ["## Data loading: training loop (issue 6)", ""]
    sec = res.get("dataset")
    st = _status("dataset", sec)
    if st:
        L += st
    else:
        assert sec is not None
        c = sec["config"]
        L += [
            f"{sec['dataset_samples']:,} samples of {c['sample_kb']} KB in {c['shards']} shards ({sec['dataset_bytes'] / 1e6:,.0f} MB) written by",
            f"`write_dataset`; {c['ranks']} ranks (processes with RANK/WORLD_SIZE, one simulated node) x {c['workers']} DataLoader",
            f"workers, batch {c['batch_size']}, {c['compute_ms']:.0f} ms simulated compute per batch (sleep; compute bound = "
            f"{_f(sec['compute_bound_samples_per_s'], 0)} samples/s = "
            f"{_f(sec['compute_bound_samples_per_s'] * sec['dataset_bytes'] / sec['dataset_samples'] / 1e6, 0)} MB/s of demand), "
            f"streamio prefetch depth {c['prefetch']}, no shuffling (same order for both).",
            f"Storage: moto behind the FaultProxy with {c['latency_ms']:.0f} ms first-byte latency per response; `(nginx)` rows read",
            "the same files from nginx on 127.0.0.1 without added latency. webdataset reads S3 through s3fs (its `s3` gopen scheme),",
            "`cold`/`warm` use its `cache_dir` (whole shard downloaded before its first sample). "
            f"{c['reps']} repetitions interleaved; median [min-max].",
            "Stall = time in `next(loader)` / loop time of the slowest rank; `steady` excludes the first batch (worker start-up,",
            "index load, first request). Targets (issue 6): stall < 5 % cold, < 1 % warm.",
            "",
        ]
        rows = []
        for name, v in sec["contenders"].items():
            rows.append([name, _med(v["samples_per_s"], 0), _med(v["MBps"], 0), _med(v["stall"], 1, True), _med(v["stall_steady"], 1, True),
                         _med(v["first_batch_s"], 2)])
        L += _table(["contender", "samples/s", "MB/s", "stall % (all)", "stall % (steady)", "first batch s"], rows)
        ceil = sec.get("store_ceiling")
        if ceil:
            L += ["", f"Store ceiling (boto3, {ceil['concurrency']} threads, whole objects, same proxy): GET {_med(ceil['get_MBps'], 0)} MB/s, "
                  f"PUT {_med(ceil['put_MBps'], 0)} MB/s ({ceil['objects']} objects, {ceil['bytes'] / 1e6:,.0f} MB)."]
        hc = sec.get("http_ceiling")
        if hc:
            L += ["", f"nginx ceiling (plain http.client, {hc['concurrency']} threads, the same files): GET {_med(hc['MBps'], 0)} MB/s "
                  f"= {_f(ratio(hc['MBps']['median'], ceil['get_MBps']['median']) if ceil else float('nan'), 1)}x the moto + proxy ceiling."]
        cpu = sec.get("cpu_cost")
        if cpu:
            cs = cpu["cpu_s_per_GB"]
            L += ["", "Reader CPU cost, one process, local shards, no loader (CPU seconds per GB, median [min-max]): "
                  + ", ".join(f"{k} {_med(v, 2)}" for k, v in cs.items())
                  + f"; streamio / webdataset = {_f(cpu['ratio streamio / webdataset'], 2)} (streamio verifies every sample's CRC32C)."]
        L += ["", "When the load average exceeds the CPU count (see the section list above), the stall measures CPU starvation",
              "of the DataLoader processes as much as storage: compare contenders within one run, not with the targets alone."]
        if sec.get("nginx_skipped"):
            L += ["", f"nginx rows skipped: {sec['nginx_skipped']}"]
        L += ["", "| ratio | value |", "|---|---|"] + [f"| {k} | {_f(v, 2)} |" for k, v in sec["ratios"].items()]
        L += [""] + [f"![{p}]({p})" for p in plots if p.startswith("dataset")] + [""]

    # scale
    L += ["## Scale: simulated nodes and a model (issue 9)", ""]
    sec = res.get("scale")
    st = _status("scale", sec)
    if st:
        L += st
    else:
        assert sec is not None
        L += [
            f"Measured: {sec['nodes']} simulated nodes x {sec['ranks_per_node']} ranks (4 processes, RANK 0-3) x {sec['workers']} workers,",
            f"{sec['shards']} shards of {sec['shard_bytes'] / 1e6:.1f} MB, one node cache directory and one proxy per node, shard order",
            f"reshuffled per epoch, {sec['epochs']} epochs, no latency (counts only). From each node's proxy log:",
            "",
        ]
        rows = []
        for ep in sec["measured"]:
            for n, node in enumerate(ep["per_node"]):
                rows.append([str(ep["epoch"]), str(n), str(node["gets"]), str(node["shard_gets"]), str(node["shards_fetched"]), _f(node["bytes"] / 1e6, 1)])
        L += _table(["epoch", "node", "GETs (all)", "shard GETs", "distinct shards", "MB fetched"], rows)
        gm = [ep["gets_per_shard_mean"] for ep in sec["measured"]]
        mm = sec["model_same_setup"]
        L += ["", f"GETs per shard per epoch, mean over shards: {', '.join(_f(x, 2) for x in gm)} (max "
              f"{', '.join(str(ep['gets_per_shard_max']) for ep in sec['measured'])}). The model below, run on the same setup, predicts "
              f"{mm['cached_downloads']} shard downloads in all ({_f(mm['downloads_per_shard_mean'], 2)} per shard); measured: "
              f"{sum(node['shards_fetched'] for ep in sec['measured'] for node in ep['per_node'])}.", ""]
        L += [
            "Model (from `plan_epoch`: every rank's runs; a node cache downloads each shard its ranks touch once, whole,",
            "one streaming GET; ranks numbered consecutively per node; shard order reshuffled every epoch). 5,000 shards x 10 GB",
            "(10,000 samples of 1 MB), 8 DataLoader workers per GPU, batch 32, policy drop. `cache epochs` = how many epochs of",
            "a node's shards its cache keeps (1: a shard is fetched again in a later epoch unless the node read it the epoch",
            "before). `uncached GETs` = ranged reads with no node cache (one per run).",
            "",
        ]
        rows = []
        for r in sec["model"]:
            rows.append([f"{r['nodes']} x {r['gpus_per_node']}", str(r["epochs"]), str(r["cache_epochs"]), f"{r['uncached_gets']:,}",
                         f"{r['cached_downloads']:,}", _f(r["downloads_per_shard_mean"], 3), str(r["downloads_per_shard_max"]),
                         _f(r["bytes_per_node_TB_max"], 2), _f(r["bytes_total_TB"], 1), _f(r["amplification"], 3)])
        L += _table(["nodes x GPUs", "epochs", "cache epochs", "uncached GETs", "node-cache downloads", "downloads/shard mean",
                     "max", "TB per node (max)", "TB fetched", "fetched / consumed"], rows)
        L += ["", "Reading: with a node cache, bytes fetched stay ~1x what is consumed at any scale (ranks of a node read",
              "consecutive blocks, so only the shards at block boundaries are fetched by two nodes); GETs grow with",
              "shards x epochs, not with ranks x workers; without the cache every (rank, worker) run is its own request.", ""]

    # loader
    L += ["## DataLoader path: one rank, local shards, no compute", ""]
    sec = res.get("loader")
    st = _status("loader", sec)
    if st:
        L += st
    else:
        assert sec is not None
        L += [f"{sec['samples']:,} samples of 64 KB ({sec['bytes'] / 1e6:,.0f} MB) on local disk, 1 rank, 2 DataLoader workers, batch 8,",
              f"no compute, {sec['reps']} repetitions interleaved. `ints dropped`: streamio's `__shard__`/`__index__` removed by",
              "`transform`, so `default_collate` makes no tensors (each tensor of a batch crosses from a worker to the main process",
              "through its own shared-memory segment).", ""]
        L += _table(["contender", "samples/s"], [[k, _med(v, 0)] for k, v in sec["samples_per_s"].items()])
        L += ["", "| ratio | value |", "|---|---|"] + [f"| {k} | {_f(v, 2)} |" for k, v in sec["ratios"].items()] + [""]

    # read
    L += ["## Reader and cache (issue 5: `benchmarks/bench_read.py`)", ""]
    sec = res.get("read")
    st = _status("read", sec)
    if st:
        L += st
    else:
        assert sec is not None
        a = sec.get("args", {})
        L += [f"{a.get('shards')} shards x {a.get('shard_mb')} MB of random bytes in moto behind the FaultProxy with "
              f"{_f(a.get('latency', 0) * 1000, 0)} ms first-byte latency; prefetch depth {a.get('workers')}; {a.get('rounds')} rounds "
              "interleaved (order rotating); median [min-max] MB/s.", ""]
        rows = [[k, f"{_f(sec['median_MBps'][k], 0)} [{_f(min(v), 0)}-{_f(max(v), 0)}]"] for k, v in sec.get("runs", {}).items()]
        L += _table(["contender", "MB/s"], rows)
        L += ["", "| ratio | value |", "|---|---|"] + [f"| {k} | {_f(v, 2)} |" for k, v in sec.get("ratios", {}).items()]
        L += [""] + [f"![{p}]({p})" for p in plots if p.startswith("read")] + [""]

    # shard
    L += ["## Shard writing (issue 3: `benchmarks/bench_shard.py`)", ""]
    sec = res.get("shard")
    st = _status("shard", sec)
    if st:
        L += st
    else:
        assert sec is not None
        L += [f"{sec.get('samples')} samples, {sec.get('size_mb')} MB (arguments: `{' '.join(sec.get('args', []))}`); medians of the",
              "interleaved rounds, MB/s of shard output. The `s3` target writes to moto (no proxy latency).", ""]
        rows = []
        for target in ("local", "s3", "read"):
            for k, v in sec.get(target, {}).get("median_MBps", {}).items():
                rows.append([target, k, _f(v, 0)])
        L += _table(["target", "contender", "MB/s"], rows)
        if "index" in sec:
            ix = sec["index"]
            L += ["", f"5,000-shard index ({ix['index_bytes'] / 1e6:.2f} MB): load {_f(ix['load_ms'], 1)} ms; one sidecar {_f(ix['sidecar_ms'], 2)} ms."]
        L += [""]

    # plan
    L += ["## Planner (issue 4: `benchmarks/bench_plan.py --quick`)", ""]
    sec = res.get("plan")
    st = _status("plan", sec)
    if st:
        L += st
    else:
        assert sec is not None
        for part, rows_ in sec["rows"].items():
            if not rows_:
                continue
            keys = list(rows_[0])
            L += [f"`{part}`", ""] + _table(keys, [[str(r.get(k)) for k in keys] for r in rows_]) + [""]

    # checkpoint
    L += ["## Checkpoint (issue 7: `benchmarks/bench_checkpoint.py`)", ""]
    sec = res.get("checkpoint")
    st = _status("checkpoint", sec)
    if st:
        L += st
    else:
        assert sec is not None
        L += [f"State {sec['size_bytes'] / 1e6:,.0f} MB (MLP + Adam), {sec['reps']} repetitions after a warm-up, interleaved "
              f"(arguments: `{' '.join(sec.get('args', []))}`); S3 = moto, no proxy latency. Seconds, median [min-max].", ""]
        for target in ("disk", "s3"):
            t = sec.get(target)
            if not t:
                continue
            rows = []
            for k, v in t["runs_s"].items():
                s = common.summary(v)
                rows.append([k, _med(s, 3), _f(sec["size_bytes"] / s["median"] / 1e9, 2) if s["median"] else "n/a"])
            L += [f"`{target}`", ""] + _table(["operation", "seconds", "GB/s"], rows)
            L += ["", "| ratio | value |", "|---|---|"] + [f"| {k} | {_f(v, 2)} |" for k, v in t["ratios"].items()] + [""]
        L += [f"![{p}]({p})" for p in plots if p.startswith("checkpoint")] + [""]

    L += [
        "## Peers in their own environments",
        "",
        "mosaicml-streaming and litdata cannot share streamio's virtual environment (pins of google-cloud-storage, numpy",
        "and botocore conflict with s3fs/gcsfs; PyPI's torchvision, which mosaicml-streaming imports, does not load beside",
        "the CPU torch 2.13.0: KNOWN-BEHAVIOUR.md). With `--peers mosaicml` (what `make bench` passes) mosaicml-streaming",
        "runs in the loop benchmark from `.venv-peers/mosaicml`, built once from the pins in `benchmarks/peers/mosaicml.txt`",
        "(torch 2.14.1 + torchvision 0.29.1, the pair on these machines' disk that imports together): the same samples as",
        "MDS shards of the same size in the same bucket, behind the same latency proxy, the same loop"
        + (" (rows `mosaicml cold` / `mosaicml warm` above)." if "mosaicml cold" in res.get("dataset", {}).get("contenders", {})
           else "; this run did not include it."),
        "litdata is not compared: it would need the same treatment (its own environment and format conversion).",
        "",
    ]
    path = out_dir / "RESULTS.md"
    path.write_text("\n".join(L) + "\n")
    return path


# ----------------------------------------------------------------------------- plots
def make_plots(res: dict[str, Any], out_dir: Path) -> list[str]:
    """PNG plots (matplotlib, Agg); returns the file names written. No matplotlib: no plots."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install -e '.[bench]'): no plots")
        return []
    written: list[str] = []
    mline = machine_line(res.get("machine", {})) if res.get("machine") else ""

    def bars(fname: str, title: str, names: list[str], stats: list[dict[str, float]], xlabel: str, scale: float = 1.0,
             lines: tuple[tuple[float, str], ...] = ()) -> None:
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.8))
        med = [s["median"] * scale for s in stats]
        err = [[(s["median"] - s["min"]) * scale for s in stats], [(s["max"] - s["median"]) * scale for s in stats]]
        peers = ("webdataset", "s3fs", "torch.", "dcp.")
        colors = ["tab:blue" if n.startswith("streamio") else "tab:orange" if n.startswith(peers) else "tab:gray" for n in names]
        ax.barh(names, med, xerr=err, color=colors, capsize=3)
        for i, (value, label) in enumerate(lines):
            ax.axvline(value, color="red", linestyle="--", linewidth=1)
            ax.text(value, len(names) - 0.5 + 0.35 * i, f" {label}", color="red", fontsize=8, va="bottom")
        ax.invert_yaxis()
        ax.set_xlabel(xlabel + "   (blue: streamio, orange: peers, gray: references)")
        ax.set_title(title, fontsize=10)
        fig.text(0.01, 0.005, mline, fontsize=6, color="gray")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
        written.append(fname)

    ds = res.get("dataset", {})
    if ds.get("status") == "ok":
        c = ds["contenders"]
        cfg = ds["config"]
        names = list(c)
        sub = (f"{ds['dataset_bytes'] / 1e6:.0f} MB, {cfg['ranks']} ranks x {cfg['workers']} workers, {cfg['compute_ms']:.0f} ms/batch, "
               f"{cfg['latency_ms']:.0f} ms proxy latency, {cfg['reps']} reps")
        bars("dataset_throughput.png", f"Training loop samples/s (median, min-max)\n{sub}", names, [c[n]["samples_per_s"] for n in names],
             "samples/s", lines=((ds["compute_bound_samples_per_s"], "compute bound"),))
        names2 = [n for n in names if "no compute" not in n]
        bars("dataset_stall.png", f"Data-stall fraction, steady state (after the first batch)\n{sub}", names2,
             [c[n]["stall_steady"] for n in names2], "% of loop time waiting for data", 100.0, lines=((5.0, "5% cold target"), (1.0, "1% warm")))
    rd = res.get("read", {})
    if rd.get("status") == "ok" and rd.get("runs"):
        names = list(rd["runs"])
        a = rd.get("args", {})
        bars("read_throughput.png", f"Reader MB/s (median, min-max): {a.get('shards')} x {a.get('shard_mb')} MB, "
             f"{_f(a.get('latency', 0) * 1000, 0)} ms latency, {a.get('rounds')} rounds", names, [common.summary(rd["runs"][n]) for n in names], "MB/s")
    ck = res.get("checkpoint", {})
    if ck.get("status") == "ok":
        for target in ("disk", "s3"):
            t = ck.get(target)
            if not t:
                continue
            names = list(t["runs_s"])
            bars(f"checkpoint_{target}.png", f"Checkpoint {target}: seconds (blocked = training paused; durable = committed)\n"
                 f"state {ck['size_bytes'] / 1e6:.0f} MB, {ck['reps']} reps", names, [common.summary(t["runs_s"][n]) for n in names], "seconds")
    return written


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 repetition: checks the suite runs (CI), ~2 min when idle")
    ap.add_argument("--only", help=f"comma-separated sections of {', '.join(SECTIONS)}")
    ap.add_argument("--out", type=Path, help="where RESULTS.md, results.json and the plots go (default: benchmarks/, and "
                    "benchmarks/out/quick/ with --quick so a smoke run never replaces the committed figures)")
    ap.add_argument("--no-nginx", action="store_true", help="skip the nginx rows (no apt-get)")
    ap.add_argument("--report-only", action="store_true", help="re-render RESULTS.md and the plots from DIR/results.json")
    ap.add_argument("--peers", default="", help="comma-separated peers run from their own environments (benchmarks/peers/NAME.txt, "
                    "built once into .venv-peers/NAME): mosaicml")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = HERE / "out" / "quick" if args.quick else HERE
    if args.report_only:
        res = json.loads((args.out / "results.json").read_text())
        path = write_report(res, args.out, make_plots(res, args.out))
        log(f"wrote {path}")
        return 0
    names = list(SECTIONS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    common.clean_aws_env()
    store = args.out / "results.json"
    res: dict[str, Any] = json.loads(store.read_text()) if store.exists() and args.only else {}
    res["machine"] = machine()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-run-", dir=os.environ.get("BENCH_DIR")) as scratch:
        def save(part: dict[str, Any]) -> None:
            res.update(part)
            store.write_text(json.dumps(res, indent=1, default=str))

        run_sections(names, args.quick, scratch, use_nginx=not args.no_nginx, on_result=save,
                     peers=[p.strip() for p in args.peers.split(",") if p.strip()])
    store.write_text(json.dumps(res, indent=1, default=str))
    plots = make_plots(res, args.out)
    path = write_report(res, args.out, plots)
    failed = [n for n in names if res.get(n, {}).get("status") != "ok"]
    log(f"wrote {path} and {len(plots)} plots in {time.perf_counter() - t0:.0f} s" + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
