"""A slow or dead store delays durability, never training (issue 34, item 8).

With a local tier, every save after a failed upload is due for the root. The save thread used to
wait for room in the upload queue, so during an outage every ``save()`` blocked the training loop
for as long as an upload against the dead store took. Now newer due saves supersede older ones
waiting in the queue, and while the root does not answer saves are planned without asking it.

Real parts: moto S3 over HTTP behind the FaultProxy (every request answered 503 after a delay: a
store that is down and slow to say so), a local directory for the tier.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from streamio import CheckpointManager, LocalTier
from streamio.checkpoint.admin import verify_checkpoint
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from support.tiers import FAST, OPTS, blank, state

DOWN_S = 0.3  # every request to the dead store takes this long to fail


@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


def _blocked(mgr: CheckpointManager, step: int) -> float:
    """Seconds ``save(step)`` held the caller."""
    began = time.perf_counter()
    mgr.save(step, state(step))
    return time.perf_counter() - began


def _restored(s3: S3Endpoint) -> int:
    got = blank()
    with CheckpointManager(s3.url("root"), storage_options=s3.storage_options()) as plain:
        step = plain.restore(got)
    assert torch.equal(got["w"], state(step)["w"]) and got["progress"] == {"step": step}
    return step


@pytest.mark.parametrize("durable_first", [True, False], ids=["down-after-a-durable-save", "down-from-the-start"])
def test_a_dead_store_never_blocks_save_and_the_newest_save_becomes_durable_when_it_is_back(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture, durable_first: bool
) -> None:
    options = s3.storage_options(s3_proxy.endpoint_url)
    mgr = CheckpointManager(s3.url("root"), storage_options=options, local=LocalTier(str(tmp_path / "local")),
                            options=OPTS, retry=FAST)
    try:
        if durable_first:
            mgr.save(1, state(1))
            mgr.wait()
            assert mgr.durable_step == 1
        s3_proxy.set_latency(DOWN_S)
        s3_proxy.fail_next(1_000_000, 503, "SlowDown")  # everything, reads included
        with caplog.at_level(logging.INFO, logger="streamio.checkpoint.save.tiers"):
            blocked = []
            for step in range(2, 8):
                blocked.append(_blocked(mgr, step))
                time.sleep(0.05)  # a training step
            # save(3) waits for save 2's plan, which asks the root where a job that never saved
            # stands (once, bounded by the RetryPolicy) when it has no timeline yet; after that,
            # nothing: 15d7008 blocked 3-6 s in all, behind the upload queue and asking the root again
            later = blocked[2:] if not durable_first else blocked
            assert sum(later) < 1.0, blocked
            assert mgr.durable_step == (1 if durable_first else None)
            assert "is superseded in the upload queue by step" in caplog.text
            s3_proxy.clear()  # the store is back; the upload running may still fail: the next save is due
            assert _blocked(mgr, 8) < 1.0
            mgr.wait()
        assert mgr.durable_step == 8
    finally:
        mgr.close()
    assert _restored(s3) == 8
    assert verify_checkpoint(Store(s3.url("root"), s3.storage_options()), 8) == []
    local = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "local" / "rank-00000").glob("step-*"))
    assert local == [7, 8]  # keep=2 once nothing waits for the root


def test_a_store_that_hangs_never_blocks_save(s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path) -> None:
    """The store answers nothing for seconds (no error): uploads wait, saves do not."""
    options = s3.storage_options(s3_proxy.endpoint_url)
    mgr = CheckpointManager(s3.url("root"), storage_options=options, local=LocalTier(str(tmp_path / "local")),
                            options=OPTS, retry=FAST)
    try:
        mgr.save(1, state(1))
        mgr.wait()
        s3_proxy.set_latency(2.0)
        blocked = [_blocked(mgr, step) for step in range(2, 6)]
        assert sum(blocked) < 1.0, blocked  # 15d7008: the fourth save waits for the first upload
        s3_proxy.clear()  # the uploads that waited complete: 2, then the newest (it superseded the others)
        mgr.wait()
        assert mgr.durable_step == 5
    finally:
        mgr.close()
    assert _restored(s3) == 5
