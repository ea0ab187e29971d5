"""The benchmark suite keeps running: helpers, the scale model, the report, and a quick real run.

CI checks that the benchmarks run and write their report, never how fast anything is. The real run
(``python -m benchmarks.run --quick``) is restricted to the sections that fit the test budget on two
busy cores (references + the 2-node x 2-rank scale simulation over moto); the other sections are
covered by their own ``--quick`` modes and by the report tests below on synthetic results.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import common, run
from benchmarks.bench_dataset import _trial_stats, scale_model

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
        "loader": {"status": "ok", "samples": 976, "bytes": 64_000_000, "reps": 2,
                   "samples_per_s": {"streamio (default sample)": s([1000.0, 1200.0]),
                                     "streamio, ints dropped": s([2000.0]),
                                     "webdataset": s([1800.0])},
                   "ratios": {"streamio ints dropped / webdataset": 1.11}},
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
    assert "| streamio (default sample) | 1,100 [1,000-1,200] |" in text
    assert "| loader (1 rank, local, no compute, samples/s): streamio ints dropped / webdataset | 1.11 |" in text
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
        [sys.executable, "-m", "benchmarks.run", "--quick", "--only", "references,scale", "--no-nginx",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["references"]["status"] == "ok" and res["scale"]["status"] == "ok"
    measured = res["scale"]["measured"]
    assert len(measured) == 2 and len(measured[0]["per_node"]) == 2
    # every shard was fetched by some node in epoch 0; the planner-derived model predicts the
    # measured number of per-node shard downloads exactly (same seed, topology, cache that keeps all)
    assert sum(n["shards_fetched"] for n in measured[0]["per_node"]) >= res["scale"]["shards"]
    fetched = sum(n["shards_fetched"] for ep in measured for n in ep["per_node"])
    assert fetched == res["scale"]["model_same_setup"]["cached_downloads"]
    text = (tmp_path / "RESULTS.md").read_text()
    assert "## Scale: simulated nodes and a model (issue 9)" in text and "| 8 x 8 |" in text


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
