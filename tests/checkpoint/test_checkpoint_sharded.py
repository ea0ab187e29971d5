"""FSDP2 / DTensor state on real gloo ranks: saved without a gather, restored onto any sharding, exactly.

Every group of ranks is forked from one zygote (tests/support/sharded_procs.py) and runs a scenario
of tests/support/sharded_worker.py: FSDP2 MLP + Adam through DCP's state-dict helpers, a DTensor
(tensor-parallel style), a plain replicated tensor, per-rank and plain JSON state, every tensor at
a value known exactly in every process. Checked here:

* 2 ranks save (CheckpointManager, and torch DCP through StreamioWriter) to S3 (moto); each rank
  uploads about half the bytes (its own shards);
* restore on 2, 3 (FSDP) and 1 rank (a plain module): every element equal, and each rank reads
  about its share of the bytes (ranged, block-verified reads), not the whole checkpoint;
* 4 ranks with a replicated mesh dimension (each box held twice, written once) restore on 2;
  a plain module's checkpoint restores into FSDP2 on 2 ranks;
* a corrupted part: restore walks back to the previous step and records the bad one;
* ``kill -9`` of both ranks mid-upload leaves the previous checkpoint current and exact.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from streamio.checkpoint.admin import check_pointer, verify_checkpoint
from streamio.checkpoint.root import read_bad, read_manifest
from streamio.cli.main import cli
from streamio.storage import Store
from streamio.testing import S3Endpoint
from support.sharded_procs import Zygote, wait_gone

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(zygote: Zygote, moto_endpoint: str) -> dict[str, Any]:
    """Steps 1 and 2 saved by 2 FSDP ranks through the manager, step 50 through torch DCP (S3)."""
    s3 = S3Endpoint(moto_endpoint, "unused").new_bucket()
    args = {"root": s3.url("mgr"), "dcp_root": s3.url("dcp"), "storage": s3.storage_options(), "steps": [1, 2]}
    t0 = time.monotonic()
    results = zygote.run("save", 2, args)
    print(f"2-rank FSDP save: {time.monotonic() - t0:.1f} s")
    return {**args, "results": results, "s3": s3}


def _total(store: Store, step: int) -> int:
    return read_manifest(store, step).total_bytes


def test_each_rank_writes_only_its_own_shards(saved: dict[str, Any]) -> None:
    store = Store(saved["root"], saved["storage"])
    m = read_manifest(store, 2)
    assert m.world_size == 2 and read_manifest(store, 1).world_size == 2
    fc1 = m.sharded["app/model/fc1.weight"]
    assert fc1.shape == (512, 64) and fc1.layout["placements"] == ["Shard(dim=0)"]
    boxes = sorted((c.rank, c.offsets, c.sizes) for c in fc1.chunks)
    assert boxes == [(0, (0, 0), (256, 64)), (1, (256, 0), (256, 64))]
    assert {c.rank for c in m.sharded["app/optim/state/fc1.weight/exp_avg"].chunks} == {0, 1}
    assert "app/optim/state/fc1.weight/step" in m.replicated.tensors  # a plain tensor stays replicated
    written = [r["stats"][-1]["bytes"] for r in saved["results"]]
    assert all(0.4 * sum(written) <= b <= 0.6 * sum(written) for b in written), written
    assert all(f.block_size == 1024 and f.blocks for f in m.files)
    assert verify_checkpoint(store, 2) == [] and check_pointer(store) == (2, [])
    dcp = read_manifest(Store(saved["dcp_root"], saved["storage"]), 50)
    assert {c.rank for c in dcp.sharded["app.model.fc1.weight"].chunks} == {0, 1}


@pytest.mark.parametrize(("world", "kind"), [(2, "fsdp"), (3, "fsdp"), (1, "plain")])
def test_restore_onto_another_sharding_is_exact(zygote: Zygote, saved: dict[str, Any], world: int, kind: str) -> None:
    t0 = time.monotonic()
    results = zygote.run("restore", world, {"root": saved["root"], "dcp_root": saved["dcp_root"],
                                            "storage": saved["storage"], "saved_world": 2, "kind": kind})
    print(f"2 -> {world} ({kind}) restore: {time.monotonic() - t0:.1f} s")
    for r in results:
        assert r["step"] == 2 and all(v for k, v in r["checks"].items() if k != "bad"), r
        assert all(v for k, v in r["dcp_checks"].items() if k != "bad"), r
    # ranged reads: each rank reads about its share (+ replicated state and block rounding)
    total = _total(Store(saved["root"], saved["storage"]), 2)
    for r in results:
        assert r["bytes_read"] <= total / world * 1.1 + (32 << 10), (r["bytes_read"], total, world)
    assert sum(r["bytes_read"] for r in results) <= total * 1.15 + world * (32 << 10)


def test_four_ranks_with_a_replicated_mesh_dim_restore_on_two_from_the_module_itself(
    zygote: Zygote, tmp_path: Path
) -> None:
    root = str(tmp_path / "four")
    # the FSDP module and its optimizer as state entries of their own (no ShardedModelState)
    saved = zygote.run("save", 4, {"root": root, "storage": {}, "steps": [4], "tp_mesh": "2d", "direct": True})
    m = read_manifest(Store(root), 4)
    tp = m.sharded["tp"]
    assert tp.layout["placements"] == ["Replicate()", "Shard(dim=1)"] and tp.layout["dims"] == ["rep", "tp"]
    assert sorted(c.rank for c in tp.chunks) == [0, 1]  # the replicas at coordinate 1 write nothing
    assert len(m.sharded["model/fc2.weight"].chunks) == 4  # 7 rows on 4 ranks: 2, 2, 2, 1
    assert {c.rank for c in m.sharded["optim/state/0/exp_avg"].chunks} == {0, 1, 2, 3}
    results = zygote.run("restore", 2, {"root": root, "storage": {}, "saved_world": 4, "direct": True})
    assert all(r["step"] == 4 and all(v for k, v in r["checks"].items() if k != "bad") for r in results), results
    assert len(saved) == 4
    shown = CliRunner().invoke(cli, ["ckpt", "inspect", root])
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if x.split()[:2] == ["sharded", "tp"])
    assert "[6, 10]" in line and line.endswith("(Replicate(), Shard(dim=1) over mesh [2, 2] (rep, tp), 2 chunks)")


def test_a_plain_modules_checkpoint_restores_into_fsdp(zygote: Zygote, tmp_path: Path) -> None:
    root = str(tmp_path / "plain")
    zygote.run("save", 1, {"root": root, "storage": {}, "steps": [3], "kind": "plain"})
    assert not read_manifest(Store(root), 3).sharded  # nothing sharded: a format-2 checkpoint
    results = zygote.run("restore", 2, {"root": root, "storage": {}, "saved_world": 1})
    assert all(r["step"] == 3 and all(v for k, v in r["checks"].items() if k != "bad") for r in results), results


def test_a_corrupt_part_walks_back_to_the_previous_step(zygote: Zygote, tmp_path: Path) -> None:
    root = tmp_path / "root"
    zygote.run("save", 2, {"root": str(root), "storage": {}, "steps": [1, 2]})
    part = sorted(root.glob("p-01/step-000000002/rank-00001/part-*.bin"))[0]  # two ranks: two key prefixes
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 3] ^= 0x01
    part.write_bytes(bytes(raw))
    results = zygote.run("restore", 3, {"root": str(root), "storage": {}, "saved_world": 2})
    assert all(r["step"] == 1 and all(v for k, v in r["checks"].items() if k != "bad") for r in results), results
    bad = read_bad(Store(str(root)), "step-000000002")
    assert bad is not None and "corrupt" in bad.reason


def test_kill_minus_9_mid_upload_on_both_ranks_keeps_the_previous_checkpoint(zygote: Zygote, tmp_path: Path) -> None:
    root = str(tmp_path / "kill")
    _, pids = zygote.start("save", 2, {"root": root, "storage": {}, "steps": [1, 2], "die": {"step": 2, "put": 3}})
    wait_gone(pids, 120)
    store = Store(root)
    assert check_pointer(store) == (1, []) and verify_checkpoint(store, 1) == []
    assert any(Path(root).glob("p-*/step-000000002/rank-*/part-*.bin"))  # it died mid-upload, parts written
    assert not (Path(root) / "step-000000002" / "manifest.json").exists()
    results = zygote.run("restore", 2, {"root": root, "storage": {}, "saved_world": 2})
    assert all(r["step"] == 1 and all(v for k, v in r["checks"].items() if k != "bad") for r in results), results
    shutil.rmtree(root)


def test_state_that_cannot_be_saved_sharded_is_refused(zygote: Zygote, tmp_path: Path) -> None:
    [got] = zygote.run("refusals", 1, {"root": str(tmp_path)})
    assert "a DTensor in per-rank state" in got["per_rank"]
    assert "Partial()" in got["partial"] and "redistribute" in got["partial"]
    assert got["fine"] is None  # the manager is still usable after a refused save
