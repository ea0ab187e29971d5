"""The tiers benchmark section: ratios paired per round, goals judged, the report's section rendered."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import bench_tiers as bt
from benchmarks import tables
from benchmarks.report import render_section


def _runs(**overrides: list[float]) -> dict[str, list[float]]:
    runs = {k: [1.0, 1.0] for k in (
        "local.disk", "local.disk.commit", "ceiling.disk", "ceiling.disk.seq", "restore.local", "restore.s3",
        "save.tier.blocked", "save.root.blocked", "save.tier.host_copy", "save.root.host_copy", "copy",
        "save.tier.durable", "save.root.durable", "loop.tier.save_per_step", "loop.root.save_per_step",
        "loop.none", "loop.tier", "loop.root")}
    return runs | overrides


def test_ratios_pair_the_members_of_each_round_against_the_faster_ceiling() -> None:
    # round 0 is slow for everyone (a noisy minute), round 1 fast: paired, both rounds say 1.5
    runs = _runs(**{"local.disk.commit": [3.0, 0.3], "ceiling.disk": [2.0, 0.2], "ceiling.disk.seq": [4.0, 0.25],
                    "restore.local": [0.4, 0.1], "restore.s3": [2.0, 0.5]})
    r = bt.ratios(runs)
    assert r["local disk: commit (host copy done to latest.json) / write+fsync ceiling (target <= 1.2)"] == 1.5
    assert r["restore: local tier / S3 (target <= 0.25)"] == 0.2
    assert not any("shm" in k for k in r)  # no RAM tier ran: no RAM ratios


def test_write_ceiling_writes_every_byte_and_leaves_nothing(tmp_path: Path) -> None:
    chunks = [b"a" * 1000, b"b" * 10]
    for threads in (0, 2):
        assert bt.write_ceiling(str(tmp_path / f"c{threads}"), chunks, threads) > 0
    assert os.listdir(tmp_path) == []


def test_tiers_section_renders_rows_requests_and_goals() -> None:
    runs = _runs(**{"restore.local": [0.5, 0.5], "restore.s3": [1.0, 1.0]})
    sec = {"status": "ok", "size_bytes": 302_000_000, "reps": 2, "latency_s": 0.03, "every": 2, "steps_per_loop": 20,
           "durable_every": 10, "local_parts": 8, "shm": False, "args": ["--size-mb", "300"], "runs_s": runs,
           "ratios": bt.ratios(runs),
           "restore_requests": {"restore.local": {"part GETs": [0, 0], "other requests": [3, 3]}}}
    text = "\n".join(render_section(tables.TIERS, {"tiers": sec}, []))
    assert "| restore.local | 0, 0 | 3, 3 |" in text
    assert "| restore: local tier / S3 (target <= 0.25) | 0.50 | no |" in text
    assert "RAM tier in /dev/shm (skipped: no room)" in text
    assert ("tiers: restore: local tier / S3 (target <= 0.25)", 0.5) in tables.headline({"tiers": sec})
