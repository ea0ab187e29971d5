"""Bounded saves across 2 gloo ranks (issue 37): only rank 1's part uploads stall (FaultProxy), yet
both ranks raise ``SaveTimeoutError`` within the bound, rank 0's message names rank 1 and its part,
and the pointer still names the previous step; for replicated and for FSDP2 (DTensor) state, and
through torch DCP with a StreamioWriter, in one launch (tests/support/bounded_worker.py)."""

from __future__ import annotations

import pytest

from streamio.testing import S3Endpoint
from streamio.testing.proxy import FaultProxy
from support.sharded_procs import Zygote

pytestmark = pytest.mark.slow

BOUND = 3.0
MARGIN = 4.0  # two shared CPUs, two ranks and other test workers: generous, far below "for ever"


def test_only_rank_1_stalls_and_every_rank_fails_within_the_bound(
    s3: S3Endpoint, moto_endpoint: str, zygote: Zygote
) -> None:
    with FaultProxy(moto_endpoint) as proxy:
        proxy.stall(method="PUT", path_contains="/rank-00001/part-")
        args = {"root": s3.url("run"), "bound": BOUND, "direct": s3.storage_options(),
                "proxied": s3.storage_options(proxy.endpoint_url)}
        ranks = zygote.run("stalled", 2, args, timeout=240, worker="support.bounded_worker")
        assert proxy.held() >= 1  # rank 1's upload is still stuck: nobody waited for it
    for kind in ("replicated", "sharded", "dcp"):
        for rank, got in enumerate(r[kind] for r in ranks):
            raised = got["raised"]
            assert raised is not None and raised["type"] == "SaveTimeoutError" and raised["timeout"], (kind, rank, got)
            assert BOUND - 0.1 <= got["took"] <= BOUND + MARGIN, (kind, rank, got["took"])
            assert got["close_s"] < 1.0, (kind, rank, got["close_s"])
            message = raised["message"]
            assert f"saving step 2 to {s3.url('run')}/{kind}/" in message and "save_timeout_s=3 s" in message
            assert "rank 1 was uploading its share, waiting for s3://" in message, message
            assert "/rank-00001/part-" in message and "rank 0 was" not in message
        rank0 = ranks[0][kind]
        assert rank0["latest"] == 1 and rank0["steps"] == [1], (kind, rank0)
