"""A restore's broadcasts staged through a bounded device buffer (streamio/checkpoint/lane.py):
the chunking, over gloo with a CPU stage on real ranks; an NCCL job stages on its GPU (not run
here: no GPU on these machines)."""

from __future__ import annotations

import pytest

from streamio.checkpoint.lane import lane_device
from support.sharded_procs import Zygote

pytestmark = pytest.mark.slow


def test_a_broadcast_staged_a_chunk_at_a_time_arrives_whole_on_every_rank(zygote: Zygote) -> None:
    cases = [(1, 1000, 0), (999, 1000, 1), (1000, 1000, 2), (4567, 1000, 1), (3000, 1000, 0), (5, 2, 2), (0, 8, 1)]
    results = zygote.run("staged", 3, {"cases": cases}, worker="support.lane_worker")
    assert all(r["ok"] == [True] * len(cases) for r in results), results
    assert not any(r["lane"] for r in results)  # a gloo job stages nothing on a device
    assert all(r["comm"] for r in results)


def test_without_a_process_group_there_is_no_lane() -> None:
    assert lane_device() is None
