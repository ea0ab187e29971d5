"""The local tier: saves commit to node-local disk first, the root in the background; restore takes
the nearest good copy (docs/design.md "Local tier").

Real stores: a local directory for the tier, a local root or moto S3 through the FaultProxy for the
durable root (the proxy counts what a restore reads from the store, and plays the store going down).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from streamio import CheckpointManager, LocalTier, SaveOptions
from streamio.checkpoint.admin import verify_checkpoint
from streamio.errors import CheckpointNotFoundError, ConfigError
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint
from support.tiers import FAST, OPTS, blank, saved_steps, state


def assert_state(got: dict[str, Any], step: int) -> None:
    assert torch.equal(got["w"], state(step)["w"]) and got["progress"] == {"step": step}


@pytest.fixture
def s3_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


# ------------------------------------------------------------------ save
def test_every_save_commits_locally_and_every_nth_goes_to_the_root(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "local"), keep=2)
    options = SaveOptions(part_size=64 << 10, durable_every=3)
    with CheckpointManager(str(tmp_path / "root"), local=tier, options=options) as mgr:
        for step in range(1, 8):
            mgr.save(step, state(step))
            stats = mgr.wait()
            assert stats is not None and stats.local_s is not None and stats.step == step
        assert mgr.durable_step == 6
    assert saved_steps(tmp_path / "root") == [3, 6]  # the root's own retention: KeepLast(2)
    assert saved_steps(tmp_path / "local" / "rank-00000") == [6, 7]  # keep=2
    assert verify_checkpoint(Store(str(tmp_path / "root")), 6) == []
    assert verify_checkpoint(Store(str(tmp_path / "local" / "rank-00000")), 7) == []


def test_durable_true_and_local_override_durable_every(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path / "local"))
    with CheckpointManager(str(tmp_path / "root"), local=tier, options=SaveOptions(durable_every=100)) as mgr:
        mgr.save(1, state(1), durable=True)
        mgr.save(2, state(2))
        mgr.wait()
        assert mgr.durable_step == 1
    tier2 = LocalTier(str(tmp_path / "local2"))  # a tier belongs to one root
    with CheckpointManager(str(tmp_path / "root2"), local=tier2, options=SaveOptions(durable_every=1)) as mgr:
        mgr.save(10, state(10), durable="local")
        mgr.wait()
        assert mgr.durable_step is None
    assert saved_steps(tmp_path / "root") == [1] and saved_steps(tmp_path / "root2") == []


def test_a_save_blocks_for_the_host_copy_only_while_an_upload_is_slow(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    """The uploads read the local files: the next save needs the host buffer only, not the upload."""
    store = Store(s3.url("root"), s3.storage_options(s3_proxy.endpoint_url))
    mgr = CheckpointManager(store.root_url, storage_options=s3.storage_options(s3_proxy.endpoint_url),
                            local=LocalTier(str(tmp_path / "local")), options=OPTS)
    s3_proxy.set_bandwidth(512 << 10)  # an upload of the 128 KiB state takes ~0.3 s and more
    try:
        blocked = []
        for step in range(1, 4):
            mgr.save(step, state(step))
            mgr._wait_pending()  # the local commit only
            blocked.append(mgr.last_stats.blocked_s if mgr.last_stats else 0.0)
        assert max(blocked) < 0.25, blocked
        mgr.wait()
        assert mgr.durable_step == 3
    finally:
        mgr.close()


# ------------------------------------------------------------------ restore: the nearest good copy
def test_a_rank_with_the_save_locally_reads_no_part_from_the_store(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    options = s3.storage_options(s3_proxy.endpoint_url)
    tier = LocalTier(str(tmp_path / "local"))
    with CheckpointManager(s3.url("root"), storage_options=options, local=tier, options=OPTS) as mgr:
        mgr.save(5, state(5))
    s3_proxy.clear()
    got = blank()
    with CheckpointManager(s3.url("root"), storage_options=options, local=tier, options=OPTS) as mgr:
        assert mgr.restore(got) == 5
    assert_state(got, 5)
    assert s3_proxy.count("GET", "/part-") == 0, [r.path for r in s3_proxy.log()]
    s3_proxy.clear()
    got = blank()  # the same root without the tier reads its parts from the store
    with CheckpointManager(s3.url("root"), storage_options=options, options=OPTS) as mgr:
        assert mgr.restore(got) == 5
    assert_state(got, 5)
    assert s3_proxy.count("GET", "/part-") > 0


def test_a_damaged_local_copy_falls_back_to_the_root(s3: S3Endpoint, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    options, tier = s3.storage_options(), LocalTier(str(tmp_path / "local"))
    with CheckpointManager(s3.url("root"), storage_options=options, local=tier, options=OPTS) as mgr:
        mgr.save(5, state(5))
    [part] = list((tmp_path / "local" / "rank-00000").glob("step-*/rank-00000/part-*-00000.bin"))
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    got = blank()
    with caplog.at_level(logging.WARNING), CheckpointManager(
        s3.url("root"), storage_options=options, local=tier, options=OPTS
    ) as mgr:
        assert mgr.restore(got) == 5
    assert_state(got, 5)
    assert "is damaged" in caplog.text and "reading the root's" in caplog.text


def test_a_local_save_newer_than_the_root_is_restored_and_the_root_moves_forward_along_it(tmp_path: Path) -> None:
    root, tier = str(tmp_path / "root"), LocalTier(str(tmp_path / "local"), keep=3)
    with CheckpointManager(root, local=tier, options=SaveOptions(durable_every=2)) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, state(step))
    assert saved_steps(tmp_path / "root") == [2]
    got = blank()
    with CheckpointManager(root, local=tier, options=SaveOptions(durable_every=2)) as mgr:
        assert mgr.restore(got) == 3  # local only, newer than the root's 2
        assert_state(got, 3)
        mgr.save(4, state(4), durable=True)
    got = blank()
    with CheckpointManager(root) as mgr:  # the root alone: its pointer moved to 4, on the restored line
        assert mgr.latest_step() == 4 and mgr.restore(got) == 4
    assert_state(got, 4)


def test_without_any_copy_restore_says_there_is_none(tmp_path: Path) -> None:
    with CheckpointManager(str(tmp_path / "root"), local=LocalTier(str(tmp_path / "local"))) as mgr:
        with pytest.raises(CheckpointNotFoundError):
            mgr.restore(blank())


# ------------------------------------------------------------------ failures never stop training
def test_a_store_that_is_down_never_stops_training(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path, caplog  # type: ignore[no-untyped-def]
) -> None:
    options, tier = s3.storage_options(s3_proxy.endpoint_url), LocalTier(str(tmp_path / "local"))
    mgr = CheckpointManager(s3.url("root"), storage_options=options, local=tier, options=OPTS, retry=FAST)
    try:
        mgr.save(1, state(1))
        mgr.wait()
        assert mgr.durable_step == 1
        s3_proxy.fail_next(10_000, 503, "SlowDown")  # everything, reads included
        with caplog.at_level(logging.WARNING):
            for step in (2, 3):
                mgr.save(step, state(step))  # never raises
                mgr.wait()
        assert mgr.durable_step == 1
        assert "could not be made durable" in caplog.text and "step 2" in caplog.text
        s3_proxy.clear()
        mgr.save(4, state(4), durable="local")  # the failure makes the next save durable anyway
        mgr.wait()
        assert mgr.durable_step == 4
    finally:
        mgr.close()
    got = blank()
    with CheckpointManager(s3.url("root"), storage_options=s3.storage_options()) as plain:
        assert plain.restore(got) == 4
    assert_state(got, 4)


def test_the_root_down_at_restore_restores_from_the_local_tier(
    s3: S3Endpoint, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    options, tier = s3.storage_options(s3_proxy.endpoint_url), LocalTier(str(tmp_path / "local"))
    with CheckpointManager(s3.url("root"), storage_options=options, local=tier, options=OPTS, retry=FAST) as mgr:
        mgr.save(3, state(3))
    s3_proxy.fail_next(10_000, 503, "SlowDown")
    got = blank()
    mgr = CheckpointManager(s3.url("root"), storage_options=options, local=tier, options=OPTS, retry=FAST)
    try:
        assert mgr.restore(got) == 3
        assert_state(got, 3)
        mgr.save(4, state(4))  # planned offline: the root still does not answer
        mgr.wait()
        s3_proxy.clear()
        mgr.save(5, state(5), durable=True)
        mgr.wait()
        assert mgr.durable_step == 5
    finally:
        mgr.close()


def test_what_a_killed_deletion_left_is_removed_by_the_next_save(tmp_path: Path) -> None:
    """kill -9 while local retention deletes a save can leave its directory tree without a file
    (the objects gone, the ``rmdir``s not done), which no listing of objects shows; the next save's
    retention removes it."""
    tier = LocalTier(str(tmp_path / "local"), keep=2)
    with CheckpointManager(str(tmp_path / "root"), local=tier, options=SaveOptions(durable_every=10)) as mgr:
        mgr.save(1, state(1))
        mgr.wait()
        rank_root = tmp_path / "local" / "rank-00000"
        (rank_root / "step-000000000-6b0f00000000abcd" / "rank-00000").mkdir(parents=True)  # empty, as left
        mgr.save(2, state(2))
        mgr.wait()
    assert sorted(p.name.split("-")[1] for p in rank_root.iterdir() if p.is_dir()) == ["000000001", "000000002"]


def test_a_local_disk_that_fails_sends_saves_to_the_root(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "local").write_text("a file where the tier's directory should be")
    tier = LocalTier(str(tmp_path / "local"))
    with caplog.at_level(logging.WARNING), CheckpointManager(
        str(tmp_path / "root"), local=tier, options=SaveOptions(durable_every=10)
    ) as mgr:
        mgr.save(1, state(1))
        mgr.wait()
        assert mgr.durable_step == 1
    assert saved_steps(tmp_path / "root") == [1]
    assert "local copy of step 1" in caplog.text and "root only" in caplog.text


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: LocalTier("s3://bucket/x"), "local directory"),
        (lambda: LocalTier("/tmp/x", keep=0), "keep"),
        (lambda: SaveOptions(durable_every=0), "durable_every"),
        (lambda: SaveOptions(durable_every=True), "durable_every"),
    ],
)
def test_tier_settings_are_checked(make: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        make()
