"""The benchmark suite keeps running: helpers, the scale model, the report, and a quick real run.

CI checks that the benchmarks run and write their report, never how fast anything is. The real run
(``python -m benchmarks.run --quick``) is restricted to the sections that fit the test budget on two
busy cores (references, the 2-node x 2-rank scale simulation over moto, and the shuffle orders
without peers); the other sections are
covered by their own ``--quick`` modes and by the report tests below on synthetic results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from benchmarks import common, run
from benchmarks.bench_dataset import _trial_stats, scale_model
from benchmarks.tables import ACCELERATE_ROWS, LIGHTNING_ROWS

REPO = Path(__file__).resolve().parents[2]


def test_summary_median_spread_and_ratio() -> None:
    s = common.summary([4.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 4.0, 3)
    assert s["spread"] == pytest.approx(1.5)
    assert common.ratio(3.0, 2.0) == 1.5
    assert common.ratio(1.0, 0.0) != common.ratio(1.0, 0.0)  # NaN, not an exception or inf


def test_interleave_rotates_order_and_calls_before_untimed() -> None:
    calls: list[str] = []
    contenders = {n: (lambda n=n: calls.append(n) or len(calls)) for n in "ABC"}
    befores: list[str] = []
    out = common.interleave(contenders, 3, before=befores.append)
    assert calls == list("ABC" "BCA" "CAB")
    assert befores == calls
    assert out == {"A": [1, 6, 8], "B": [2, 4, 9], "C": [3, 5, 7]}


def test_trial_stats_uses_slowest_rank_and_steady_state() -> None:
    ranks = [
        {"rank": 0, "epochs": [{"samples": 100, "wall_s": 10.0, "wait_s": 2.0, "first_batch_s": 1.5}]},
        {"rank": 1, "epochs": [{"samples": 100, "wall_s": 5.0, "wait_s": 0.5, "first_batch_s": 0.5}]},
    ]
    s = _trial_stats(ranks, sample_bytes=1e6)
    assert s["samples_per_s"] == pytest.approx(20.0)  # 200 samples / the longest wall
    assert s["stall"] == pytest.approx(0.2)
    assert s["stall_steady"] == pytest.approx(0.5 / 8.5)
    assert s["MBps"] == pytest.approx(20.0)


def test_scale_model_small_setup_is_exact() -> None:
    # 8 shards of 10 samples, 1 node x 1 GPU: one epoch touches every shard once, no amplification
    one = scale_model([10] * 8, 1e9, nodes=1, gpus=1, workers=1, epochs=1, batch_size=1)
    assert one["cached_downloads"] == 8 and one["downloads_per_shard_max"] == 1
    assert one["amplification"] == pytest.approx(1.0)
    # a cache that keeps every epoch never fetches a shard twice on one node
    kept = scale_model([10] * 8, 1e9, nodes=1, gpus=2, workers=2, epochs=3, batch_size=1, cache_epochs=3)
    assert kept["cached_downloads"] == 8
    # a cache of one epoch refetches what the previous epoch did not read: more than 8, at most 3 x 8
    one_epoch = scale_model([10] * 8, 1e9, nodes=2, gpus=2, workers=2, epochs=3, batch_size=1, cache_epochs=1)
    assert 8 < one_epoch["cached_downloads"] <= 3 * 2 * 8
    assert one_epoch["uncached_gets"] >= 3 * 2 * 2 * 2  # at least one run per (epoch, rank, worker)


def test_scale_model_grows_with_epochs_not_ranks() -> None:
    counts = [1000] * 200
    a = scale_model(counts, 1e10, nodes=4, gpus=8, workers=4, epochs=1)
    b = scale_model(counts, 1e10, nodes=16, gpus=8, workers=4, epochs=1)
    c = scale_model(counts, 1e10, nodes=4, gpus=8, workers=4, epochs=2)
    assert a["cached_downloads"] <= 200 + 4 and b["cached_downloads"] <= 200 + 16  # boundaries only
    assert b["uncached_gets"] > a["uncached_gets"]  # every (rank, worker) run is a request
    # epoch 2 refetches what this node did not read in epoch 1 (~3/4 of its shards with 4 nodes)
    assert 1.5 * a["cached_downloads"] <= c["cached_downloads"] <= 2 * a["cached_downloads"]


def _pipeline_synthetic() -> dict[str, Any]:
    from benchmarks import bench_pipeline as bp

    s = common.summary

    def fig(sps: float, cpu: float, start: float) -> dict[str, Any]:
        out = {k: s([1.0]) for k in bp.FIGURES}
        out.update(samples_per_s=s([sps, sps * 1.1]), cpu_s_per_GB=s([cpu]), first_batch_s=s([start]))
        return {**out, "loadavg_1m": [2.0], "children_left": 0}

    loaders = {"batch 8, 2 workers": {bp.STREAMIO: fig(3000.0, 2.0, 0.5), "webdataset": fig(1000.0, 5.0, 0.2),
                                      "litdata": fig(2500.0, 4.0, 0.25), bp.NODE_CACHE: fig(2900.0, 0.9, 0.6),
                                      bp.CEILING: fig(5000.0, 1.5, 0.1)}}
    image = {bp.STREAMIO: fig(100.0, 50.0, 1.0), "webdataset": fig(110.0, 52.0, 0.8)}
    return {"status": "ok", "config": {**asdict(bp.Config.quick()), "image_loader": [32, 2]},
            "raw": {"samples": 1024, "payload_bytes": 67_110_000},
            "images": {"samples": 256, "payload_bytes": 28_300_000, "mean_jpeg_bytes": 110_500.0, "distinct": 64},
            "cache_fill": {"samples_per_s": 500.0, "first_batch_s": 1.5, "cpu_s_per_GB": 20.0},
            "loaders": loaders, "image": image, "ratios": bp.ratios(loaders, image),
            "not_measured": {"mosaicml-streaming": "not requested"},
            "versions": {"streamio": {"torch": "2.13.0", "numpy": "2", "pillow": "13", "webdataset": "1.0.2"}},
            "loadavg": {"start": [1.0, 1.0, 1.0], "end": [2.0, 2.0, 2.0]}}


def _synthetic() -> dict[str, Any]:
    s = common.summary
    contenders = {
        name: {"samples_per_s": s([100.0, 120.0]), "MBps": s([6.0, 7.0]), "stall": s([0.1, 0.2]),
               "stall_steady": s([0.01, 0.02]), "stall_mean": s([0.1]), "first_batch_s": s([1.0]),
               "wall_s": s([5.0]), "samples": 500}
        for name in ("streamio cold", "streamio warm", "webdataset stream", "webdataset cold", "webdataset warm")
    }
    return {
        "machine": common.machine(),
        "references": {"status": "ok", "memcpy": {"size_MB": 1, "reps": 1, "MBps": s([1000.0])},
                       "disk": {"size_MB": 1, "reps": 1, "write_fsync_MBps": s([100.0]), "read_cold_MBps": s([]),
                                "read_cold_how": "unavailable", "read_warm_MBps": s([900.0])}},
        "dataset": {"status": "ok",
                    "config": {"shards": 8, "shard_mb": 4, "sample_kb": 64, "batch_size": 16, "compute_ms": 20.0,
                               "ranks": 2, "workers": 1, "prefetch": 4, "reps": 2, "latency_ms": 30.0},
                    "compute_bound_samples_per_s": 1600.0, "dataset_bytes": 31_000_000, "dataset_samples": 488,
                    "contenders": contenders, "ratios": {"streamio cold / webdataset stream (samples/s)": 1.25},
                    "store_ceiling": {"concurrency": 8, "objects": 8, "bytes": 31_000_000,
                                      "get_MBps": s([500.0]), "put_MBps": s([100.0])}},
        "pipeline": _pipeline_synthetic(),
        "checkpoint": {"status": "failed", "error": "RuntimeError: boom"},
    }


def test_report_and_plots_from_results(tmp_path: Path) -> None:
    res = _synthetic()
    plots = run.make_plots(res, tmp_path)
    assert set(plots) == {"dataset_throughput.png", "dataset_stall.png"}
    assert all((tmp_path / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    text = run.write_report(res, tmp_path, plots).read_text()
    assert "| streamio cold / webdataset stream (samples/s) | 1.25 |" in text  # headline and section table
    assert "| streamio warm | 110 [100-120] | 6 [6-7] | 15.0 [10.0-20.0] | 1.5 [1.0-2.0] |" in text
    assert "| streamio (default) | 3,150 [3,000-3,300] | 0.50 [0.50-0.50] | 2.00 [2.00-2.00] |" in text
    assert "| batch 8, 2 workers: streamio / webdataset, samples/s (target >= 1.5) | 3.00 | yes |" in text
    assert "| batch 8, 2 workers: streamio / best peer, CPU s per GB (target <= 0.5) | 0.50 | yes |" in text
    assert "| batch 8, 2 workers: streamio / best peer, start-up s (target <= 1.0) | 2.50 | no |" in text
    assert "| images: streamio / webdataset, samples/s (target >= 1.0) | 0.91 | no |" in text
    assert "- not measured: mosaicml-streaming: not requested" in text
    assert "| pipeline: batch 8, 2 workers: streamio / litdata, samples/s (target >= 1.5) | 1.20 |" in text  # headline
    assert "**FAILED**" in text and "RuntimeError: boom" in text  # a broken section is shown, not hidden
    assert "_Not run yet: `python -m benchmarks.run --only read`._" in text
    assert "![dataset_stall.png](dataset_stall.png)" in text
    assert "2 CPUs" in text or f"{common.machine()['nproc']} CPUs" in text


def test_unknown_section_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run.main(["--only", "nope"])
    assert exc.value.code == 2
    assert "unknown section" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_suite_runs_and_writes_its_report(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--only", "references,scale,shuffle", "--no-nginx",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["references"]["status"] == "ok" and res["scale"]["status"] == "ok"
    assert res["shuffle"]["status"] == "ok" and (tmp_path / "shuffle_quality.png").exists()
    measured = res["scale"]["measured"]
    assert len(measured) == 2 and len(measured[0]["per_node"]) == 2
    # every shard was fetched by some node in epoch 0; the planner-derived model predicts the
    # measured number of per-node shard downloads exactly (same seed, topology, cache that keeps all)
    assert sum(n["shards_fetched"] for n in measured[0]["per_node"]) >= res["scale"]["shards"]
    fetched = sum(n["shards_fetched"] for ep in measured for n in ep["per_node"])
    assert fetched == res["scale"]["model_same_setup"]["cached_downloads"]
    text = (tmp_path / "RESULTS.md").read_text()
    assert "## Scale: simulated nodes and a model (issue 9)" in text and "| 8 x 8 |" in text
    assert "| streamio Shuffle() (default) | 1x2 | 32.0 (32) | 10.0 (10) |" in text


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")  # Lightning's
def test_lightning_section_measures_both_plugins_on_s3_and_renders(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    from benchmarks import bench_lightning

    for name in [n for n in os.environ if n.startswith("AWS_")]:  # run() sets and clears AWS_*: restored after
        monkeypatch.delenv(name)

    lines: list[str] = []
    sec = bench_lightning.run(2, 1, log=lines.append)  # a real Trainer's dict, both plugins, moto in a child
    layers, width = sec["layers"], sec["width"]  # params + Adam's two moments + its float32 step per param
    assert sec["size_bytes"] == 3 * 4 * layers * (width**2 + width) + 2 * 4 * layers
    assert set(sec["runs_s"]) == {k for k, _ in LIGHTNING_ROWS}  # every row the report shows, measured
    assert all(len(v) == 1 and v[0] > 0 for v in sec["runs_s"].values())
    assert len([line for line in lines if line.startswith("warm-up")]) == 6  # one untimed run of each timed call
    assert set(sec["ratios"]) == {"save blocked: streamio / TorchCheckpointIO", "load: streamio / TorchCheckpointIO",
                                  "async blocked: streamio / TorchCheckpointIO",
                                  "async durable: streamio / TorchCheckpointIO", "streamio: async blocked / sync save"}
    res = {"machine": common.machine(), "lightning": {"status": "ok", "args": ["--size-mb", "2"], **sec}}
    text = run.write_report(res, tmp_path, []).read_text()
    assert "## Lightning checkpoints to S3 (issue 35: `benchmarks/bench_lightning.py`)" in text
    assert "| torch save | Lightning's `TorchCheckpointIO`" in text
    assert "| lightning: load: streamio / TorchCheckpointIO |" in text  # in the headline table


@pytest.mark.slow
def test_accelerate_section_measures_both_ways_on_s3_and_renders(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    from benchmarks import bench_accelerate

    for name in [n for n in os.environ if n.startswith("AWS_")]:  # run() clears AWS_*: restored after
        monkeypatch.delenv(name)
    lines: list[str] = []
    try:
        sec = bench_accelerate.run(2, 1, log=lines.append)  # a real Accelerator, both ways, moto in a child
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    layers, width = sec["layers"], sec["width"]
    assert sec["size_bytes"] == 3 * 4 * layers * (width**2 + width)  # parameters + Adam's two moments
    assert set(sec["runs_s"]) == {k for k, _ in ACCELERATE_ROWS}  # every row the report shows, measured
    assert all(len(v) == 1 and v[0] > 0 for v in sec["runs_s"].values())
    assert len([line for line in lines if line.startswith("warm-up")]) == 5  # one untimed run of each timed call
    assert set(sec["ratios"]) == {"save blocked: streamio / accelerate save + put",
                                  "save durable: streamio / accelerate save + put",
                                  "load: streamio / get + accelerate load"}
    res = {"machine": common.machine(), "accelerate": {"status": "ok", "args": ["--size-mb", "2"], **sec}}
    text = run.write_report(res, tmp_path, []).read_text()
    assert "## HF Accelerate checkpoints to S3 (issue 36: `benchmarks/bench_accelerate.py`)" in text
    assert "| accelerate save + put | `accelerator.save_state(dir)` then `s3fs.put(dir)`" in text
    assert "| accelerate: load: streamio / get + accelerate load |" in text  # in the headline table


def test_peer_environment_needs_its_pins_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import peer_env

    with pytest.raises(FileNotFoundError, match="no pins for peer 'nope'"):
        peer_env.python("nope")
    # a built environment whose pins match is reused without pip
    monkeypatch.setattr(peer_env, "REPO", tmp_path)
    monkeypatch.setattr(peer_env, "PEERS", tmp_path / "peers")
    (tmp_path / "peers").mkdir()
    (tmp_path / "peers" / "x.txt").write_text("six==1.16.0\n")
    venv = tmp_path / ".venv-peers" / "x"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    import hashlib

    (venv / ".pins-sha256").write_text(hashlib.sha256(b"six==1.16.0\n").hexdigest())
    monkeypatch.setattr(peer_env.subprocess, "run", lambda *a, **k: pytest.fail(f"pip ran: {a}"))
    assert peer_env.python("x") == venv / "bin" / "python"


# ----------------------------------------------------------------------------- shuffle quality
def test_shuffle_quality_measures_batches_and_displacement() -> None:
    from benchmarks import bench_shuffle as bs

    n = bs.SHARDS * bs.PER_SHARD
    index_order = [[list(range(i, i + bs.BATCH)) for i in range(0, n, bs.BATCH)]]
    q = bs.quality([index_order])
    assert q["displacement"] == 0.0 and q["batches"] == n // bs.BATCH
    # 100-sample shards: 32 consecutive samples span 1 or 2 shards; 56 of the 63 shard ends fall inside a batch
    assert q["shards_mean"] == pytest.approx(1 + 56 / 200) and q["shards_p10"] == 1.0
    reverse = [[list(range(n - 1 - i, max(-1, n - 1 - i - bs.BATCH), -1)) for i in range(0, n, bs.BATCH)]]
    assert bs.quality([reverse])["displacement"] == pytest.approx(0.5, abs=1e-3)
    # two ranks: step t of rank 0, then step t of rank 1, so index order split in halves is displaced
    halves = [index_order[0][: n // bs.BATCH // 2], index_order[0][n // bs.BATCH // 2:]]
    assert bs.quality([halves])["displacement"] == pytest.approx(0.25, abs=0.01)


def test_shuffle_orders_cover_the_epoch_once() -> None:
    from benchmarks import bench_shuffle as bs
    from streamio.data.plan import Shuffle

    n = bs.SHARDS * bs.PER_SHARD
    for batches in (bs.streamio_batches(Shuffle(), 2, 2, 0), bs.webdataset_batches(2, 2, 0), bs.iid_batches(2, 2, 0)):
        flat = sorted(x for rank in batches for b in rank for x in b)
        assert flat == list(range(n))
        assert all(len(b) <= bs.BATCH for rank in batches for b in rank)
    off = bs.streamio_batches(Shuffle.off(), 1, 1, 0)
    assert [x for b in off[0] for x in b] == list(range(n))
    # the default interleaves 32 shards per worker: 1 rank x 2 workers holds 32 shards each
    assert bs.quality([bs.streamio_batches(Shuffle(), 1, 2, 0)])["shards_mean"] == 32.0
    # webdataset splits shards by rank and worker before shuffling them: worker 1 of rank 0 of 2 x 2
    # reads shards 2, 6, 10, ... only
    first = bs.webdataset_batches(2, 2, 0)[0][1]
    assert {x // bs.PER_SHARD for x in first} <= set(range(2, bs.SHARDS, 4))


def test_shuffle_run_reports_peers_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import bench_shuffle as bs

    monkeypatch.setattr(bs, "TOPOLOGIES", ((1, 2),))
    monkeypatch.setattr(bs, "SEEDS", (0,))

    def broken(peer: str, *a: Any, **k: Any) -> Any:
        raise RuntimeError(f"{peer} environment is broken")

    monkeypatch.setattr(bs, "peer_orders", broken)
    res = bs.run(False, peers=["mosaicml"], log=lambda s: None)
    assert res["not_measured"]["mosaicml"] == "failed: RuntimeError: mosaicml environment is broken"
    assert res["not_measured"]["litdata"].startswith("not requested")
    assert [r["loader"] for r in res["rows"]][-1] == "iid (reference)"
    quick = bs.run(True, log=lambda s: None)
    assert set(quick["not_measured"]) == set(bs.PEERS) and quick["setup"]["seeds"] == [0]
    with pytest.raises(ValueError, match="unknown peer 'nope'"):
        bs._peer_main("nope", [(1, 2)], [0])


def test_mixture_sources_must_hold_the_same_bytes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from benchmarks import bench_mixture
    from benchmarks.bench_dataset import Dataset

    cfg, split = bench_mixture.config(quick=True)
    assert cfg.shards == sum(split) and cfg.compute_ms == 0.0
    made = iter([Dataset("s", "", ["a"] * 4, 40, 4000), Dataset("p", "", ["a"] * 2, 20, 2000),
                 Dataset("p", "", ["a"], 10, 1000), Dataset("p", "", ["a"], 9, 1000)])
    monkeypatch.setattr(bench_mixture, "make_dataset", lambda *a: next(made))
    with pytest.raises(RuntimeError, match="hold 39 samples / 4000 bytes, the single source 40 / 4000"):
        bench_mixture._datasets(str(tmp_path), cfg, split)
    ranks = [{"epochs": [{"samples": 88, "wall_s": 5.0, "first_batch_s": 3.0}]},
             {"epochs": [{"samples": 88, "wall_s": 4.0, "first_batch_s": 1.0}]}]
    assert bench_mixture._steady(ranks, 8)["steady_samples_per_s"] == pytest.approx(160 / 3.0)


def test_shuffle_and_mixture_sections_render(tmp_path: Path) -> None:
    s = common.summary
    row = {"loader": "streamio Shuffle() (default)", "topology": "1x2", "shards_mean": 32.0, "shards_p10": 32.0,
           "classes_mean": 10.0, "classes_p10": 10.0, "displacement": 0.331, "batches": 200, "seeds": 1,
           "reads": "32 sequential shard reads"}
    res = {
        "machine": common.machine(),
        "shuffle": {"status": "ok", "setup": {"shards": 64, "samples_per_shard": 100, "classes": 10, "batch_size": 32,
                                              "seeds": [0], "topologies": ["1x2"]},
                    "rows": [row, {**row, "loader": "iid (reference)", "shards_mean": 25.3, "shards_p10": 23.0}],
                    "not_measured": {"litdata": "not requested"}},
        "mixture": {"status": "ok", "config": {"shards": 4, "sample_kb": 64, "latency_ms": 30.0, "ranks": 2,
                                               "workers": 1, "batch_size": 8, "reps": 1, "split": [2, 1, 1],
                                               "weights": [2, 1, 1]},
                    "dataset_bytes": 16_000_000, "dataset_samples": 244,
                    "contenders": {n: {"samples_per_s": s([100.0]), "MBps": s([6.5]), "first_batch_s": s([2.0]),
                                       "stall_steady": s([0.1])} for n in ("1 source", "3 sources mixed")},
                    "ratios": {"mixture / 1 source (samples/s)": 0.97}},
    }
    plots = run.make_plots(res, tmp_path)
    assert plots == ["shuffle_quality.png"] and (tmp_path / plots[0]).read_bytes()[:4] == b"\x89PNG"
    text = run.write_report(res, tmp_path, plots).read_text()
    assert "| streamio Shuffle() (default) | 1x2 | 32.0 (32) | 10.0 (10) | 0.331 | 32 sequential shard reads |" in text
    assert "| litdata | - | n/a | n/a | n/a | not measured: not requested |" in text
    assert "Distinct shards per batch with streamio's default, on average: 32.0 at 1 x 2." in text
    assert "![shuffle_quality.png](shuffle_quality.png)" in text
    assert "| 3 sources mixed | 100 [100-100] | n/a | 6 [6-6] | 2.00 [2.00-2.00] | 10.0 [10.0-10.0] |" in text
    assert "| mixture: mixture / 1 source (samples/s) | 0.97 |" in text  # in the headline table
    assert "The shuffle section ran no peer environment this time" in text


def test_sharded_section_ratios_goals_and_report(tmp_path: Path) -> None:
    from benchmarks import bench_sharded
    from benchmarks.tables import goal_met

    width, layers = bench_sharded.shape(300)
    per_rank = 3 * 4 * layers * (width * width + width) / 2  # params + 2 Adam moments, half on each rank
    assert width == 2048 and abs(per_rank / 300e6 - 1) < 0.1
    assert bench_sharded.shape(8)[0] == 512  # --quick: small layers
    med = {"streamio.blocked": 0.12, "copy": 0.1, "streamio.durable": 1.2, "ceiling.put": 1.0, "dcp.save": 1.8,
           "ceiling.get": 0.5, "streamio.restore": 0.6, "dcp.load": 3.0}
    ratios = bench_sharded.ratios("s3", med, {1: {"streamio.restore": 0.72, "dcp.load": 2.16}})
    assert ratios["durable / ceiling.put (target <= 1.25)"] == pytest.approx(1.2)
    assert ratios["durable speedup vs dcp fsspec (target >= 1.5)"] == pytest.approx(1.5)
    assert ratios["restore speed / ceiling.get (target >= 0.8)"] == pytest.approx(0.5 / 0.6)
    assert ratios["restore speedup vs dcp fsspec (target >= 4)"] == pytest.approx(5.0)
    assert ratios["resharded restore 2->1 / same-topology 2->2 (target <= 1.3)"] == pytest.approx(1.2)
    assert ratios["resharded restore 2->1: speedup vs dcp fsspec"] == pytest.approx(3.0)
    assert "durable speedup vs dcp FileSystemWriter (target >= 1.2)" in bench_sharded.ratios("disk", med, {})
    assert [goal_met("a (target <= 1.25)", 1.3), goal_met("b (target >= 4)", 5.0), goal_met("c", 1.0),
            goal_met("d (target >= 0.8)", float("nan"))] == ["no", "yes", "-", "-"]
    runs = {k: [v] for k, v in med.items()}
    res = {"machine": common.machine(), "sharded": {
        "status": "ok", "size_bytes": 600_000_000,
        "config": {"ranks": 2, "width": 2048, "layers": 12, "reps": 1, "size_mb_per_rank": 300,
                   "local_bytes": [300_000_000, 300_000_000], "part_size": 1 << 26, "reshard_worlds": [1, 3]},
        "s3": {"runs_s": runs, "reshard_runs_s": {"1": {"streamio.restore": [0.72], "dcp.load": [2.16]}},
               "ratios": ratios}}}
    text = run.write_report(res, tmp_path, []).read_text()
    assert "| 2->1 streamio.restore | 0.720 [0.720-0.720] | 0.83 |" in text
    assert "| durable / ceiling.put (target <= 1.25) | 1.20 | yes |" in text
    assert "| restore speed / ceiling.get (target >= 0.8) | 0.83 | yes |" in text
    assert "| sharded s3: restore speedup vs dcp fsspec (target >= 4) | 5.00 |" in text  # in the headline table


# ----------------------------------------------------------------------------- pipeline
def test_pipeline_trial_reads_every_sample_once_and_counts_worker_cpu(tmp_path: Path) -> None:
    from benchmarks import bench_pipeline as bp
    from benchmarks.peer_pipeline import all_samples, decode_resize, make_memory, make_webdataset, run_trial

    cfg = bp.Config(samples=64, shards=4, images=8, distinct_images=2)
    raw = bp.write_raw(str(tmp_path / "raw"), cfg)
    assert raw.payload == 64 * (65_536 + 1)
    assert [s["__key__"] for s in all_samples(raw.dir)] == [f"{i:08d}" for i in range(64)]
    for make in (make_memory, make_webdataset):
        r = run_trial(make, {"dir": raw.dir, "batch_size": 8, "workers": 2})
        assert (r["samples"], r["distinct"], r["children_left"]) == (64, 64, 0)
        assert r["cpu_workers_s"] > 0 and r["wall_s"] >= r["first_batch_s"] > 0  # the reaped workers' CPU counts
    img = bp.write_images(str(tmp_path / "img"), cfg)
    jpg = next(all_samples(img.dir))["jpg"]
    assert jpg[:2] == b"\xff\xd8" and tuple(decode_resize(jpg).shape) == (224, 224, 3)
    assert 60_000 < img.payload / img.samples < 200_000  # ~110 KB JPEGs


@pytest.mark.slow
# S3Servers.stop() (benchmarks/common.py) leaves its child's pipes to the garbage collector, which may run here
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_transformers_section_resumes_every_trainer_at_every_step_and_renders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from benchmarks import bench_transformers

    for name in [n for n in os.environ if n.startswith("AWS_")]:  # run() sets and clears AWS_*: restored after
        monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lines: list[str] = []
    sec = bench_transformers.run([1, 3], 1, 8, log=lines.append)  # run() raises if a resume ends at another step
    kinds = bench_transformers.KINDS
    assert {k for k in sec["runs_s"] if " at " in k} == {f"{kind} at {n}" for kind in kinds for n in (1, 3)}
    assert all(len(sec["runs_s"][f"{kind} at {n}"]) == 1 for kind in kinds for n in (1, 3))
    assert [len(sec["runs_s"][f"{kind} blocked per save"]) for kind in kinds] == [2, 2, 2]  # saved at 1 and at 3
    assert len([line for line in lines if line.startswith("warm-up")]) == 3
    res = {"machine": common.machine(), "transformers": {"status": "ok", "args": ["--steps", "1,3"], **sec}}
    text = run.write_report(res, tmp_path, []).read_text()
    assert "## The transformers Trainer: resume at step N (issue 36" in text
    assert "| stock iterable at 3 | `Trainer` over the same `StreamingDataset`" in text
    assert "| transformers: resume at 3: stock iterable / streamio |" in text  # in the headline table


def test_profile_marginal_removes_the_fixed_cost() -> None:
    from benchmarks.profile_pipeline import marginal

    # 2 CPU s fixed + 3 CPU s per GB, measured at 1.0 and 0.25 GB
    def row(gb: float) -> dict[str, float]:
        return {"cpu_s_per_GB": (2 + 3 * gb) / gb, "main_s_per_GB": 2 / gb, "children_s_per_GB": 3.0,
                "minflt_main_per_MB": 0.0, "minflt_children_per_MB": 10.0, "MBps": 100.0}

    out = marginal({"loader": row(1.0)}, {"loader": row(0.25)}, 1.0, 0.25)["loader"]
    assert out["cpu_s_per_GB"] == pytest.approx(3.0)
    assert out["main_s_per_GB"] == pytest.approx(0.0)
    assert out["fixed_cpu_s"] == pytest.approx(2.0)
    assert out["MBps"] == 100.0


def test_obstore_trial_refuses_wrong_bytes() -> None:
    from benchmarks.bench_obstore import trial
    from streamio.checksum import crc32c

    crcs = {"a": crc32c(b"right")}
    assert trial(lambda p: [b"ri", memoryview(b"ght")], ["a"], 1, crcs)["cpu_s_per_GB"] >= 0
    with pytest.raises(RuntimeError, match="wrong bytes"):
        trial(lambda p: [b"wrong"], ["a"], 1, crcs)


def test_obstore_contenders_read_the_same_bytes_from_moto(s3: Any) -> None:
    pytest.importorskip("obstore")  # the bench extra
    from benchmarks.bench_obstore import MiB, contenders, obstore_store
    from streamio.storage import Store

    body = os.urandom(MiB + 5)  # two 1 MiB ranges, the second short
    s3.boto3_client().put_object(Bucket=s3.bucket, Key="o/x.bin", Body=body)
    reads = contenders(Store(s3.url(), storage_options=s3.storage_options()), obstore_store(s3), ["o/x.bin"], len(body))
    for name, read in reads.items():
        assert b"".join(bytes(memoryview(p)) for p in read("o/x.bin")) == body, name
