"""A local tier belongs to one root: another job's copies are never restored, written or pruned.

docs/design.md "Local tier", streamio/checkpoint/owner.py. Real local roots and tiers on disk;
two managers of two roots given one tier path play two jobs on one node.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio import CheckpointManager, LocalTier, SaveOptions
from streamio.checkpoint.admin.tiers import list_tiers
from streamio.errors import ConfigError
from streamio.storage import Store
from support.tiers import saved_steps

LOCAL_ONLY = SaveOptions(part_size=64 << 10, durable_every=100)  # saves stay on the local tier


def state(step: int) -> dict[str, Any]:
    return {"w": torch.randn(32, 256, generator=torch.Generator().manual_seed(step)), "progress": {"step": step}}


def blank() -> dict[str, Any]:
    return {"w": torch.zeros(32, 256), "progress": None}


def owner_record(root: str) -> bytes:
    """An ``owner.json`` naming ``root``, spelt out (what another job's manager writes)."""
    return json.dumps({"format": "streamio.checkpoint.owner/1", "root": root, "recorded": ""}).encode()


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def job_a(tmp_path: Path) -> tuple[str, LocalTier]:
    """Job A's root and tier, with steps 1 and 2 on the tier only (never made durable)."""
    root, tier = str(tmp_path / "a"), LocalTier(str(tmp_path / "local"), keep=2)
    with CheckpointManager(root, local=tier, options=LOCAL_ONLY) as mgr:
        for step in (1, 2):
            mgr.save(step, state(step))
    assert saved_steps(tmp_path / "local" / "rank-00000") == [1, 2] and saved_steps(tmp_path / "a") == []
    return root, tier


def test_a_tier_of_another_root_is_refused_and_its_copies_are_kept(
    job_a: tuple[str, LocalTier], tmp_path: Path
) -> None:
    root_a, tier = job_a
    before = files(tmp_path / "local")
    with pytest.raises(ConfigError, match="holds the checkpoint copies of file://.*/a, not of file://.*/b") as err:
        CheckpointManager(str(tmp_path / "b"), local=tier, options=LOCAL_ONLY)
    assert "LocalTier path of its own" in str(err.value)
    assert files(tmp_path / "local") == before  # nothing of A's pruned, nothing of B's written
    got = blank()
    with CheckpointManager(root_a, local=tier, options=LOCAL_ONLY) as mgr:  # A's own job still restores them
        assert mgr.restore(got) == 2
    assert torch.equal(got["w"], state(2)["w"])


def test_a_copy_of_another_root_is_never_restored_written_or_pruned(job_a: tuple[str, LocalTier], tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """The record is read again at each restore and save: a tier claimed by another root while a
    job runs (a wiped node reused) is not read, written or pruned by it."""
    root_a, tier = job_a
    rank_root = tmp_path / "local" / "rank-00000"
    with caplog.at_level(logging.WARNING), CheckpointManager(root_a, local=tier, options=LOCAL_ONLY) as mgr:
        (rank_root / "owner.json").write_bytes(owner_record("s3://other/job"))
        before = files(tmp_path / "local")
        with pytest.raises(FileNotFoundError):  # A's copies are no longer A's: nothing to restore
            mgr.restore(blank())
        mgr.save(3, state(3))
        mgr.wait()
        assert mgr.durable_step == 3  # the save went to A's root, not into another job's tier
    assert files(tmp_path / "local") == before
    assert saved_steps(tmp_path / "a") == [3]
    assert "do not record file://" in caplog.text and "local copy of step 3" in caplog.text


def test_a_tier_without_an_owner_record_is_adopted_only_by_the_root_that_holds_its_saves(tmp_path: Path) -> None:
    """A tier written before owners were recorded: adopted when one of its saves is in the root
    (same manifest bytes), refused by any other root."""
    root_a, tier = str(tmp_path / "a"), LocalTier(str(tmp_path / "local"))
    options = SaveOptions(part_size=64 << 10, durable_every=2)
    with CheckpointManager(root_a, local=tier, options=options) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, state(step))
    rank_root = tmp_path / "local" / "rank-00000"
    (rank_root / "owner.json").unlink()  # as 15d7008 wrote it
    before = files(tmp_path / "local")
    with pytest.raises(ConfigError, match=r"2 checkpoint copies \(steps 2, 3\) that record no owner"):
        CheckpointManager(str(tmp_path / "b"), local=tier)
    assert files(tmp_path / "local") == before
    got = blank()
    with CheckpointManager(root_a, local=tier, options=options) as mgr:  # step 2 is in A's root: A's tier
        assert mgr.restore(got) == 3  # the local-only step 3 is not lost with the upgrade
    assert torch.equal(got["w"], state(3)["w"])
    assert json.loads((rank_root / "owner.json").read_bytes())["root"] == f"file://{Path(root_a).resolve()}"


def test_a_tier_whose_saves_are_in_no_root_and_record_no_owner_is_refused(job_a: tuple[str, LocalTier],
                                                                          tmp_path: Path) -> None:
    _, tier = job_a
    (tmp_path / "local" / "rank-00000" / "owner.json").unlink()
    with pytest.raises(ConfigError, match="none of them is in file://"):
        CheckpointManager(str(tmp_path / "a"), local=tier)  # A's own root holds none of them: unprovable


def test_an_unreadable_owner_record_is_refused(job_a: tuple[str, LocalTier], tmp_path: Path) -> None:
    _, tier = job_a
    (tmp_path / "local" / "rank-00000" / "owner.json").write_bytes(b'{"format": "streamio.checkpoint.owner/1"')
    with pytest.raises(ConfigError, match="owner record that cannot be read"):
        CheckpointManager(str(tmp_path / "a"), local=tier)


def test_ckpt_ls_local_lists_only_the_roots_own_copies(job_a: tuple[str, LocalTier], tmp_path: Path) -> None:
    root_a, tier = job_a
    rows = list_tiers(Store(root_a), tier)
    assert [(r["step"], r["tier"]) for r in rows] == [(1, "local"), (2, "local")]
    with pytest.raises(ConfigError, match="are file://.*/a's, not file://.*/b's"):
        list_tiers(Store(str(tmp_path / "b")), tier)
