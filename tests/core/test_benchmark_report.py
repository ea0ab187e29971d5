"""RESULTS.md is rendered from declarative section specs (benchmarks/tables.py) by one renderer.

The committed report must be exactly what the renderer makes of the committed results.json (the
report is generated, never edited by hand), and the renderer's block rules (blank line after each
block, omitted blocks, per-part labels, tables from records) are pinned on small specs.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import run, tables
from benchmarks.report import Column, Each, Plots, SectionSpec, Table, Text, render

REPO = Path(__file__).resolve().parents[2]


def test_committed_report_is_rendered_from_committed_results(tmp_path: Path) -> None:
    res = json.loads((REPO / "benchmarks" / "results.json").read_text())
    plots = run.make_plots(res, tmp_path)
    text = run.write_report(res, tmp_path, plots).read_text()
    assert text == (REPO / "benchmarks" / "RESULTS.md").read_text()


def test_every_suite_section_has_one_spec_in_suite_order() -> None:
    assert [spec.key for spec in tables.SECTIONS] == list(run.SECTIONS)
    assert tables.REPORT[0] is tables.INTRO and tables.REPORT[-1] is tables.PEERS


def test_renderer_block_rules() -> None:
    spec = SectionSpec("T", key="s", blocks=(
        Text(lambda sec: ["intro"]),
        Text(lambda sec: None),  # left out, no blank line
        Table((Column("name", lambda kv: kv[0]), Column("x", lambda kv: str(kv[1]))),
              rows=lambda sec: sec["x"].items()),
        Table((), rows=lambda sec: sec["flat"]),  # columns from the first record's keys
        Table((Column("a", str),), rows=lambda sec: [], empty="_none_"),
        Each(lambda sec: [("p", {"v": 1})], blocks=(Text(lambda part: [f"v={part['v']}"]),)),
        Plots("s_"),
    ))
    sec = {"status": "ok", "x": {"k": 1}, "flat": [{"a": 1, "b": None}]}
    assert render([spec], {"s": sec}, ["s_1.png", "other.png"]) == [
        "## T", "",
        "intro", "",
        "| name | x |", "|---|---|", "| k | 1 |", "",
        "| a | b |", "|---|---|", "| 1 | None |", "",
        "_none_", "",
        "`p`", "", "v=1", "",
        "![s_1.png](s_1.png)", "",
    ]
    assert render([spec], {}, []) == ["## T", "", "_Not run yet: `python -m benchmarks.run --only s`._", ""]
    failed = {"s": {"status": "failed", "error": "boom", "date": "d"}}
    assert render([spec], failed, []) == ["## T", "", "**FAILED** (d): `boom`", ""]
    skipped = {"s": {"status": "ok", "skipped": "why"}}
    assert render([spec], skipped, []) == ["## T", "", "_Skipped: why_", ""]
