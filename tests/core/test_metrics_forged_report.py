"""A forked child's report is a claim from outside: a count that is negative, NaN or infinite is
refused (the whole report, with a warning), never added to the parent's totals."""

from __future__ import annotations

import json
import logging
import os

import pytest

from streamio import metrics
from streamio.metrics import processes
from streamio.metrics.catalog import CACHE_HITS


@pytest.mark.parametrize("bad", [-5.0, float("nan"), float("inf")])
def test_a_report_with_a_count_that_is_not_finite_or_is_negative_is_refused(
    bad: float, caplog: pytest.LogCaptureFixture
) -> None:
    metrics.reset()
    CACHE_HITS.add(2.0)
    processes._before_fork()  # the directory a forked child reports to (what a fork makes first)
    assert processes._state.own_dir is not None
    path = os.path.join(processes._state.own_dir, f"{os.getpid()}-forged.json")  # a live pid: read as a child's
    with open(path, "w") as f:
        json.dump({"v": 1, "metrics": {"streamio_cache_hits_total": [[[], bad]],
                                       "streamio_loader_wait_seconds": [[[], [0] * 16 + [1.0, 1]]]}}, f)
    try:
        with caplog.at_level(logging.WARNING, logger="streamio.metrics.processes"):
            snap = metrics.snapshot()
    finally:
        os.unlink(path)
    assert snap["streamio_cache_hits_total"] == 2.0 and snap["streamio_loader_wait_seconds"]["count"] == 0
    assert "streamio_cache_hits_total" in caplog.text and "skipped a worker's report" in caplog.text
