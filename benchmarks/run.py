"""The benchmark suite: one command runs every section and writes RESULTS.md, results.json and plots.

Run: ``python -m benchmarks.run [--quick] [--only NAME[,NAME]] [--out DIR]`` (``make bench`` /
``make bench-quick``). The full suite (~15 min on 2 CPUs) writes into ``benchmarks/``, the figures
that are committed; ``--quick`` (~2 min, what CI runs) writes into ``benchmarks/out/quick/``.
``--report-only`` re-renders the report and plots from ``results.json``; the report's sections are
declarative specs in :mod:`benchmarks.tables`, rendered by :mod:`benchmarks.report`. Sections, in order:

* ``references`` — memory copy bandwidth and local disk sequential write (fsync'd) / read (page
  cache dropped or bypassed where possible, and warm): :mod:`benchmarks.common`.
* ``dataset``    — training loop samples/s and stall fraction, streamio vs webdataset, cold and
  warm cache, 2 ranks, moto behind a 30 ms proxy, plus nginx, plus the store's boto3 ceiling:
  :mod:`benchmarks.bench_dataset` (in-process driver, rank processes).
* ``mixture``    — the same bytes as 3 weighted sources vs 1 source: samples/s and first-batch time,
  moto behind the same 30 ms proxy, 2 ranks: :mod:`benchmarks.bench_mixture`.
* ``scale``      — 2 simulated nodes x 2 ranks: GETs / bytes per node from proxy logs, and the
  planner-derived model for 64 nodes x 8 GPUs (same module; shares the dataset's setup).
* ``pipeline``   — one rank, warm (local shards; streamio's node cache): CPU seconds per delivered
  GB (process + DataLoader workers), samples/s and start-up, streamio vs webdataset, an in-memory
  ceiling and (``--peers mosaicml,litdata``, not with ``--quick``) mosaicml-streaming and litdata,
  at batch 8 / 2 workers and 32 / 4, plus a JPEG decode + resize pipeline:
  :mod:`benchmarks.bench_pipeline`.
* ``read``       — the prefetching caching reader vs boto3/s3fs/local ceilings (issue 5's
  ``benchmarks/bench_read.py --json``, a subprocess).
* ``shard``      — writer throughput vs webdataset ``ShardWriter`` and a plain copy (issue 3's
  ``bench_shard.py --json``).
* ``prepare``    — preparing datasets at scale (issue 27): ``streamio shard`` of ~1 GB of 100 KB
  samples with 1 vs 2 workers (tar, zstd), through ``streamio.ray.DatasetSink`` on 2 Ray CPUs,
  webdataset's ``ShardWriter`` and Ray's ``write_webdataset``; ``streamio index`` 1 vs 2 workers vs
  ``streamio.ray.index``: :mod:`benchmarks.bench_prepare` (``--json``, a subprocess).
* ``plan``       — planner cost and shuffle quality (issue 4's ``bench_plan.py``, JSON lines).
* ``shuffle``    — shuffle quality on a data set of class-sorted shards: distinct shards and classes
  per batch, displacement; streamio's shuffles vs webdataset, iid and (``--peers mosaicml,litdata``,
  not with ``--quick``) mosaicml-streaming py1e and litdata, from their own code:
  :mod:`benchmarks.bench_shuffle` (orders only, no I/O).
* ``checkpoint`` — save blocked/durable and restore vs torch.save and torch DCP (issue 7's
  ``bench_checkpoint.py --json``).
* ``sharded``    — FSDP2 + Adam on 2 gloo rank processes: save durable / restore vs torch DCP
  (fsspec on moto, FileSystemWriter on disk) and the parallel PUT / GET / write+fsync ceilings,
  and restores resharded 2 -> 1 and 2 -> 3 (issue 16): :mod:`benchmarks.bench_sharded`.
* ``fanout``     — restore fan-out (issue 26): bytes the store serves and restore time at W = 1, 2, 4
  gloo ranks, with and without: :mod:`benchmarks.bench_fanout`.
* ``throttle``   — writers through a 503-SlowDown rate limit, paced vs unpaced:
  :mod:`benchmarks.bench_throttle`.
* ``tiers``      — the local checkpoint tier (issue 25): a local commit (disk, /dev/shm) vs the
  disk's write+fsync ceiling, restore from the local tier vs from S3 (moto behind the 30 ms
  proxy), blocked time with and without a tier, and a training loop saving every N steps with
  ``durable_every=10`` vs every save uploaded vs no checkpoint: :mod:`benchmarks.bench_tiers`
  (``--json``, a subprocess).
* ``lightning``  — Lightning checkpoints to S3 (issue 35): time blocked per save and restore time
  through ``streamio.lightning.CheckpointIO`` vs Lightning's ``TorchCheckpointIO`` on the same
  moto bucket, each also wrapped in Lightning's ``AsyncCheckpointIO``, for the checkpoint dict a
  real ``Trainer`` builds (MLP + Adam + loops): :mod:`benchmarks.bench_lightning` (``--json``, a subprocess).
* ``accelerate`` — HF Accelerate checkpoints to S3 (issue 36): time blocked per save and load time of
  ``streamio.accelerate.save_state`` / ``load_state`` vs ``accelerator.save_state`` to local disk then an
  s3fs upload (and download + ``accelerator.load_state``), same bucket, MLP + Adam + scheduler:
  :mod:`benchmarks.bench_accelerate` (``--json``, a subprocess).
* ``preemption`` — ``streamio.Preemption.requested(step)`` in the reference trainer (issue 37): ms
  per step the loop waits inside it at ``check_every=1`` and ``10`` vs the demo's step, 2 gloo
  ranks: :mod:`benchmarks.bench_preemption` (``--json``, a subprocess).
* ``metrics`` — what recording metrics costs (issue 38): CPU seconds per GB of a dataset epoch
  (``file://`` and moto S3, 2 DataLoader workers) and a checkpoint save's time (``file://`` and S3)
  with ``STREAMIO_METRICS=on`` over ``off``, each mode in processes of its own, alternating:
  :mod:`benchmarks.bench_metrics` (``--json``, a subprocess).
* ``transformers`` — the transformers Trainer (issue 36): time to resume at step N through
  ``StreamioTrainer`` vs the stock Trainer's replay (over the same ``StreamingDataset``, and over
  the samples as a map-style list), and the loop's blocked time per save:
  :mod:`benchmarks.bench_transformers` (``--json``, a subprocess).

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
from benchmarks.common import REPO, machine, machine_line  # noqa: E402
from benchmarks.report import fmt, render  # noqa: E402
from benchmarks.tables import REPORT  # noqa: E402

SECTIONS = ("references", "dataset", "mixture", "tokens", "scale", "pipeline", "read", "shard", "prepare", "plan",
            "shuffle", "checkpoint", "sharded", "tiers", "fanout", "throttle", "lightning",
            "accelerate", "transformers", "preemption", "metrics")
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


def _json_section(
    name: str, args: list[str], scratch: str, timeout: float, *, extra: Sequence[str] = ()
) -> dict[str, Any]:
    """Run ``benchmarks.bench_<name> --json DEST *extra *args`` and return what it wrote, with ``args``."""
    dest = os.path.join(scratch, f"{name}.json")
    _subprocess(["-m", f"benchmarks.bench_{name}", "--json", dest, *extra, *args], timeout)
    res = json.loads(Path(dest).read_text())
    res["args"] = args
    return dict(res)


def section_references(quick: bool, scratch: str) -> dict[str, Any]:
    return {
        "memcpy": common.memcpy_reference(64 if quick else 256, 3 if quick else 5),
        "disk": common.disk_reference(scratch, 64 if quick else 512, 1 if quick else 3),
    }


def section_pipeline(quick: bool, scratch: str, peers: Sequence[str]) -> dict[str, Any]:
    from benchmarks import bench_pipeline

    return bench_pipeline.run(quick, peers=["webdataset", *peers], log=log, scratch_dir=scratch)


def section_read(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["-m", "benchmarks.bench_read", "--json"] + (["--quick"] if quick else ["--rounds", "3"])
    proc = _subprocess(args, 900)
    out = proc.stdout
    return dict(json.loads(out[out.index("{"):]))


def section_shard(quick: bool, scratch: str) -> dict[str, Any]:
    dest = os.path.join(scratch, "shard.json")
    args = ["-m", "benchmarks.bench_shard", "--json", dest]
    if quick:
        args += ["--size-mb", "64", "--rounds", "1", "--targets", "local,read,index"]
    else:
        args += ["--size-mb", "500", "--rounds", "2"]
    _subprocess(args, 1200)
    res = json.loads(Path(dest).read_text())
    res["args"] = args[2:]
    return dict(res)


def section_prepare(quick: bool, scratch: str) -> dict[str, Any]:
    dest = os.path.join(scratch, "prepare.json")
    args = ["-m", "benchmarks.bench_prepare", "--json", dest]
    args += ["--size-mb", "64", "--rounds", "1"] if quick else ["--size-mb", "1000", "--rounds", "2"]
    _subprocess(args, 1800)
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


def section_mixture(quick: bool, scratch: str) -> dict[str, Any]:
    from benchmarks import bench_mixture

    return bench_mixture.run(quick, log=log, scratch_dir=scratch)


def section_tokens(quick: bool, scratch: str, peers: Sequence[str]) -> dict[str, Any]:
    from benchmarks import bench_tokens

    return bench_tokens.run(quick, peers=[p for p in peers if p == "litdata"], log=log, scratch_dir=scratch)


def section_shuffle(quick: bool, peers: Sequence[str]) -> dict[str, Any]:
    from benchmarks import bench_shuffle

    return bench_shuffle.run(quick, peers=peers, log=log)


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


def section_tiers(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["--quick"] if quick else ["--size-mb", "300", "--reps", "5"]
    return _json_section("tiers", args, scratch, 1500, extra=["--dir", scratch])


def section_fanout(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["--size-mb", "16", "--reps", "1"] if quick else ["--size-mb", "64", "--reps", "2"]
    return _json_section("fanout", args, scratch, 1500)


def section_throttle(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["--reps", "1"] if quick else ["--reps", "3"]
    return _json_section("throttle", args, scratch, 900)


def section_lightning(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["--size-mb", "8", "--reps", "1"] if quick else ["--size-mb", "96", "--reps", "3"]
    return _json_section("lightning", args, scratch, 900)


def section_accelerate(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["--size-mb", "8", "--reps", "1"] if quick else ["--size-mb", "96", "--reps", "3"]
    return _json_section("accelerate", args, scratch, 900)


def section_transformers(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["--steps", "4,12", "--reps", "1", "--embd", "16"] if quick else ["--steps", "50,200,800", "--reps", "2"]
    return _json_section("transformers", args, scratch, 900)


def section_preemption(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["--steps", "30", "--calls", "200"] if quick else ["--steps", "150", "--calls", "1000"]
    return _json_section("preemption", args, scratch, 900)


def section_metrics(quick: bool, scratch: str) -> dict[str, Any]:
    args = ["--quick"] if quick else ["--size-mb", "128", "--reps", "9"]  # 5 left a 19% spread at a load of 2
    return _json_section("metrics", args, scratch, 1500)


def section_sharded(quick: bool, scratch: str) -> dict[str, Any]:
    from benchmarks import bench_sharded

    return bench_sharded.run(quick, log=log, scratch_dir=scratch)


def run_sections(names: list[str], quick: bool, scratch: str, use_nginx: bool,
                 on_result: Callable[[dict[str, Any]], None] | None = None,
                 peers: Sequence[str] = (), dataset_cfg: Any = None) -> dict[str, Any]:
    """Run ``names`` in suite order; each result carries its status, duration and date.

    ``on_result`` is called with each section's results as soon as they exist (saved at once, so
    an interrupted run keeps what it measured).
    """
    from benchmarks import bench_dataset

    out: dict[str, Any] = {}
    simple: dict[str, Callable[[bool, str], dict[str, Any]]] = {
        "references": section_references, "read": section_read, "shard": section_shard, "prepare": section_prepare,
        "plan": section_plan, "checkpoint": section_checkpoint, "mixture": section_mixture,
        "sharded": section_sharded, "tiers": section_tiers, "fanout": section_fanout, "throttle": section_throttle,
        "lightning": section_lightning, "accelerate": section_accelerate, "transformers": section_transformers,
        "preemption": section_preemption, "metrics": section_metrics,
        "shuffle": lambda quick, _scratch: section_shuffle(quick, peers),
        "pipeline": lambda quick, scratch: section_pipeline(quick, scratch, peers),
        "tokens": lambda quick, scratch: section_tokens(quick, scratch, peers),
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
                res = bench_dataset.run(quick, sections=data_secs, log=log, use_nginx=use_nginx, scratch_dir=scratch,
                                        peers=peers, cfg=dataset_cfg)
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
            r.update({"seconds": round(dt, 1), "quick": quick,
                      "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "loadavg_end": " ".join(f"{x:.1f}" for x in os.getloadavg())})
            out[n] = r
        if on_result is not None:
            on_result(results)
        log(f"== {name}: {dt:.0f} s")
    return out


# ----------------------------------------------------------------------------- report
def write_report(res: dict[str, Any], out_dir: Path, plots: list[str]) -> Path:
    """Render RESULTS.md from the merged results: the section specs of :mod:`benchmarks.tables`."""
    path = out_dir / "RESULTS.md"
    path.write_text("\n".join(render(REPORT, res, plots)) + "\n")
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
        peers = ("webdataset", "s3fs", "torch.", "dcp.", "mosaicml", "litdata")
        colors = ["tab:blue" if n.startswith("streamio") else "tab:orange" if n.startswith(peers) else "tab:gray"
                  for n in names]
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
        sub = (f"{ds['dataset_bytes'] / 1e6:.0f} MB, {cfg['ranks']} ranks x {cfg['workers']} workers, "
               f"{cfg['compute_ms']:.0f} ms/batch, {cfg['latency_ms']:.0f} ms proxy latency, {cfg['reps']} reps")
        bars("dataset_throughput.png", f"Training loop samples/s (median, min-max)\n{sub}", names,
             [c[n]["samples_per_s"] for n in names], "samples/s",
             lines=((ds["compute_bound_samples_per_s"], "compute bound"),))
        names2 = [n for n in names if "no compute" not in n]
        bars("dataset_stall.png", f"Data-stall fraction, steady state (after the first batch)\n{sub}", names2,
             [c[n]["stall_steady"] for n in names2], "% of loop time waiting for data", 100.0,
             lines=((5.0, "5% cold target"), (1.0, "1% warm")))
    rd = res.get("read", {})
    if rd.get("status") == "ok" and rd.get("runs"):
        names = list(rd["runs"])
        a = rd.get("args", {})
        bars("read_throughput.png", f"Reader MB/s (median, min-max): {a.get('shards')} x {a.get('shard_mb')} MB, "
             f"{fmt(a.get('latency', 0) * 1000, 0)} ms latency, {a.get('rounds')} rounds", names,
             [common.summary(rd["runs"][n]) for n in names], "MB/s")
    sh = res.get("shuffle", {})
    if sh.get("status") == "ok" and "skipped" not in sh:
        from benchmarks.bench_shuffle import plot

        written += plot(sh, out_dir, plt, mline)
    ck = res.get("checkpoint", {})
    if ck.get("status") == "ok":
        for target in ("disk", "s3"):
            t = ck.get(target)
            if not t:
                continue
            names = list(t["runs_s"])
            bars(f"checkpoint_{target}.png",
                 f"Checkpoint {target}: seconds (blocked = training paused; durable = committed)\n"
                 f"state {ck['size_bytes'] / 1e6:.0f} MB, {ck['reps']} reps", names,
                 [common.summary(t["runs_s"][n]) for n in names], "seconds")
    return written


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true",
                    help="small sizes, 1 repetition: checks the suite runs (CI), ~2 min when idle")
    ap.add_argument("--only", help=f"comma-separated sections of {', '.join(SECTIONS)}")
    ap.add_argument("--out", type=Path, help="where RESULTS.md, results.json and the plots go (default: "
                    "benchmarks/, and benchmarks/out/quick/ with --quick so a smoke run never replaces the "
                    "committed figures)")
    ap.add_argument("--no-nginx", action="store_true", help="skip the nginx rows (no apt-get)")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render RESULTS.md and the plots from DIR/results.json")
    ap.add_argument("--peers", default="", help="comma-separated peers run from their own environments "
                    "(benchmarks/peers/NAME.txt, built once into .venv-peers/NAME): mosaicml (dataset, shuffle, "
                    "pipeline), litdata (shuffle, pipeline)")
    ap.add_argument("--setups", help="the dataset section's loop setups RANKSxBATCHxWORKERS, comma-separated "
                    "(default 2x8x2,2x32x4,1x8x2,1x32x4: ~40 min with the peers)")
    ap.add_argument("--reps", type=int, help="the dataset section's repetitions (default 3)")
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

        from benchmarks.bench_dataset import loop_config

        dataset_cfg = loop_config(args.quick, args.setups, args.reps, None) if args.setups or args.reps else None
        run_sections(names, args.quick, scratch, use_nginx=not args.no_nginx, on_result=save,
                     peers=[p.strip() for p in args.peers.split(",") if p.strip()], dataset_cfg=dataset_cfg)
    store.write_text(json.dumps(res, indent=1, default=str))
    plots = make_plots(res, args.out)
    path = write_report(res, args.out, plots)
    failed = [n for n in names if res.get(n, {}).get("status") != "ok"]
    log(f"wrote {path} and {len(plots)} plots in {time.perf_counter() - t0:.0f} s"
        + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
