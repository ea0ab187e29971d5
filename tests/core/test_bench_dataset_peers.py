"""The dataset benchmark section: failed and stalled peer trials left out with reasons, start-up timing, settings."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import bench_dataset as bd
from benchmarks import common, tables
from benchmarks.report import render_section

FAKE_PEER = '''
import json, sys
for line in sys.stdin:
    cfg = json.loads(line)
    if cfg.get("fail"):
        print("RESULT " + json.dumps({"error": "Traceback (most recent call last):\\nIndexError: boom"}), flush=True)
    else:
        ep = {"samples": 10, "wall_s": 70.0, "wait_s": 65.0, "first_batch_s": 1.0, "init_s": 0.5,
              "max_wait_s": cfg["max_wait_s"]}
        print("RESULT " + json.dumps({"rank": 0, "epochs": [ep]}), flush=True)
'''


@pytest.fixture
def fake_peer(tmp_path: Path) -> str:
    script = tmp_path / "peer.py"
    script.write_text(FAKE_PEER)
    return str(script)


def _trial(fake_peer: str, **cfg: Any) -> dict[str, Any]:
    return bd._fresh_trial(Path(sys.executable), fake_peer, [bd._rank_env(0, 1, 0)], cfg, 1e6,
                           stalled=bd._mosaicml_stalled)


def test_peer_trial_that_fails_is_left_out_with_its_error(fake_peer: str) -> None:
    t = _trial(fake_peer, fail=True)
    assert t["excluded"] == "failed: IndexError: boom"
    s = bd._summarise([t, _trial(fake_peer, max_wait_s=0.1)])
    assert s["samples_per_s"]["n"] == 1 and s["excluded"][0]["rep"] == 0


def test_mosaicml_trial_with_a_60s_batch_is_left_out_as_stalled(fake_peer: str) -> None:
    assert _trial(fake_peer, max_wait_s=61.0)["excluded"].startswith("stalled: a batch waited 61 s")
    assert "excluded" not in _trial(fake_peer, max_wait_s=2.0)


def test_start_up_counts_building_the_dataset() -> None:
    ranks = [{"rank": 0, "epochs": [{"samples": 8, "wall_s": 2.0, "wait_s": 1.0, "first_batch_s": 0.5, "init_s": 0.7}]},
             {"rank": 1, "epochs": [{"samples": 8, "wall_s": 2.0, "wait_s": 1.0, "first_batch_s": 0.9, "init_s": 0.1}]}]
    s = bd._trial_stats(ranks, 1e6)
    assert s["start_s"] == pytest.approx(1.2) and s["first_batch_s"] == pytest.approx(0.9)


def _contender(start: float, first: float, sps: float = 100.0) -> dict[str, Any]:
    s = common.summary
    return {"samples_per_s": s([sps]), "start_s": s([start]), "first_batch_s": s([first])}


def test_first_batch_ratios_against_the_fastest_cold_peer() -> None:
    out = {"streamio cold": _contender(0.6, 0.3), "streamio warm": _contender(0.1, 0.1),
           "webdataset stream": _contender(1.0, 1.0), "webdataset cold": _contender(1.0, 1.0),
           "webdataset warm": _contender(0.1, 0.1), "litdata cold": _contender(0.4, 0.2),
           "litdata warm": _contender(0.1, 0.1)}
    r = bd._loop_ratios(out, 800.0, 0.03)
    assert r["streamio cold first batch / fastest cold peer's (from building the dataset) (target <= 1)"] == \
        pytest.approx(1.5)
    assert r["streamio cold first batch / 0.39 s = 3 x first-byte latency + 0.3 s (target <= 1)"] == \
        pytest.approx(0.6 / 0.39)
    assert r["streamio cold / litdata cold (samples/s)"] == pytest.approx(1.0)
    assert bd.fastest_cold_peers(out) == {"start_s": "litdata cold", "first_batch_s": "litdata cold"}


def test_setups_from_the_command_line() -> None:
    cfg = bd.loop_config(False, "2x32x4,1x8x2", 2, 16)
    assert (cfg.ranks, cfg.batch_size, cfg.workers, cfg.more, cfg.reps, cfg.shards) == (2, 32, 4, ((1, 8, 2),), 2, 16)
    with pytest.raises(SystemExit):
        bd.loop_config(False, "2x8", None, None)


def test_dataset_report_lists_setups_and_left_out_trials() -> None:
    s = common.summary
    c = {"samples_per_s": s([100.0]), "MBps": s([6.0]), "stall": s([0.1]), "stall_steady": s([0.01]),
         "stall_mean": s([0.1]), "first_batch_s": s([1.0]), "start_s": s([1.5]), "wall_s": s([5.0]), "samples": 500}
    setup = {"setup": {"label": "1 rank, batch 32, 4 workers"}, "compute_bound_samples_per_s": 1600.0,
             "contenders": {"streamio cold": c, "mosaicml cold": {**c, "excluded": [
                 {"rep": 1, "reason": "stalled: a batch waited 61 s", "wall_s": 62.0}]}},
             "ratios": {"streamio cold first batch / x (target <= 1)": 1.3}, "fastest_cold_peer": {}}
    sec = {"status": "ok", "config": {"shards": 8, "shard_mb": 4, "sample_kb": 64, "batch_size": 8, "compute_ms": 20.0,
                                      "ranks": 2, "workers": 2, "prefetch": 4, "reps": 2, "latency_ms": 30.0},
           "compute_bound_samples_per_s": 800.0, "dataset_bytes": 31_000_000, "dataset_samples": 488,
           "contenders": {"streamio cold": c}, "ratios": {}, "setups": [setup]}
    text = "\n".join(render_section(tables.DATASET, {"dataset": sec}, []))
    assert "`1 rank, batch 32, 4 workers (compute bound 1,600 samples/s)`" in text
    assert "- `mosaicml cold` repetition 1 (62.0 s loop): stalled: a batch waited 61 s" in text
    assert "| streamio cold first batch / x (target <= 1) | 1.30 | no |" in text
    assert "| 1.50 [1.50-1.50] | 0 |" in text  # start-up column, trials left out
