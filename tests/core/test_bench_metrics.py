"""benchmarks/bench_metrics.py keeps running: both modes measured in their own processes, the switch
applied in each, the section rendered (CI checks that it runs, never how fast)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import bench_metrics, common, run


@pytest.mark.slow
def test_metrics_section_measures_on_and_off_and_renders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("AWS_")]:  # run() clears AWS_*: restored after
        monkeypatch.delenv(name)
    # file:// only (S3 is the same code with moto's start-up added); each child checks its mode was applied
    sec = bench_metrics.run(size_mb=1, reps=1, workers=0, targets=("file",))
    figures = {"epoch file cpu_s_per_GB", "save file save_s"}
    assert set(sec["medians"]["on"]) == set(sec["medians"]["off"]) == figures == set(sec["ratios"])
    assert all(len(sec["runs"][mode]) == 1 for mode in bench_metrics.MODES)
    assert set(sec["bound"]) == figures and all(0 < v < 0.5 for v in sec["bound"].values())  # counted, not timed
    assert sec["calls"]["epoch file"]["calls_per_GB"] > 0 and sec["calls"]["save file"]["calls_per_save"] > 0
    for mode in bench_metrics.MODES:  # every sample read, in both modes
        assert {r["epoch file"]["bytes"] for r in sec["runs"][mode]} == {16 * 64 << 10}
    res = {"machine": common.machine(), "metrics": {"status": "ok", "args": ["--size-mb", "1"], **sec}}
    text = run.write_report(res, tmp_path, []).read_text()
    assert "## What recording metrics costs (issue 38: `benchmarks/bench_metrics.py`)" in text
    assert "| metrics: save file save_s, on / off (target <= 1.02) |" in text  # in the headline table
    assert "| recording calls, % of epoch file cpu_s_per_GB |" in text
