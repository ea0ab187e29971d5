"""Under DDP a local-tier save costs about what it costs in one process (issue 34, item 19).

Two gloo ranks (forked by tests/support/sharded_procs.py) save a tiny state at every step with
``durable_every=1``, never waiting, to moto S3 behind the FaultProxy with 0.2 s per request (a
store slower than the save cadence). On 15d7008 a local commit took 0.4-0.6 s on rank 0 at every
save: each due save waited in the save thread for room in the upload queue, behind uploads that
rank 0 finishes last (it also writes the root's manifest and pointer and runs its retention).
Now a newer due save replaces the queued one and the local commit needs only the local disk and
the ranks' collectives (one fewer: the due vote rides on the commit's agreement).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from streamio.checkpoint import root
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from support.sharded_procs import Zygote

pytestmark = pytest.mark.slow

WORKER = "support.tiers_worker"


def test_a_local_save_under_ddp_does_not_wait_for_a_slow_store(
    zygote: Zygote, s3: S3Endpoint, moto_endpoint: str, tmp_path: Path
) -> None:
    with FaultProxy(moto_endpoint) as proxy:
        proxy.set_latency(0.2)
        args = {"root": s3.url("root"), "storage": s3.storage_options(proxy.endpoint_url),
                "local": str(tmp_path / "local"), "steps": list(range(1, 11))}
        results = zygote.run("cadence", 2, args, timeout=180, worker=WORKER)
    for rank, r in enumerate(results):
        later = r["local_s"][2:]  # the first saves also wait for the first plan and upload to start
        assert statistics.median(later) < 0.35, (rank, r["local_s"])  # 15d7008: >= 1 s each
        assert r["durable"] == 10, (rank, r)
    assert root.pointed_step(Store(s3.url("root"), s3.storage_options())) == 10


def test_ranks_keep_saving_in_step_when_the_root_is_down_from_the_start(
    zygote: Zygote, s3: S3Endpoint, moto_endpoint: str, tmp_path: Path
) -> None:
    """Rank 0 alone asks the root where the job stands and plans offline when it does not answer;
    on 15d7008 its StorageError reached rank 1 as a CheckpointError the tier did not catch, so
    rank 1's save failed while rank 0 planned offline and waited for it in a broadcast."""
    with FaultProxy(moto_endpoint) as proxy:
        proxy.fail_next(1_000_000, 503, "SlowDown")
        args = {"root": s3.url("root"), "storage": s3.storage_options(proxy.endpoint_url), "attempts": 2,
                "local": str(tmp_path / "local-{rank}"), "steps": [1, 2, 3, 4]}
        results = zygote.run("cadence", 2, args, timeout=90, worker=WORKER)
    assert [r["durable"] for r in results] == [None, None]
    for rank in range(2):  # every save committed locally on every rank: keep=2 holds the newest two
        local = Store(str(tmp_path / f"local-{rank}" / f"rank-{rank:05d}"))
        assert [s.step for s in root.committed_saves(local)] == [3, 4] and root.pointed_step(local) == 4
    assert root.pointed_step(Store(s3.url("root"), s3.storage_options())) is None
