"""``streamio ckpt plan``: a save's and a restore's requests on paper (issue 26)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from streamio.checkpoint import CheckpointManager, SaveOptions
from streamio.checkpoint.admin import GCS, plan_requests
from streamio.checkpoint.root import read_manifest, read_pointer
from streamio.cli.main import cli
from streamio.errors import ConfigError
from streamio.storage import Store

TB = 10**12


def test_a_terabyte_on_4096_ranks() -> None:
    p = plan_requests(TB, 4096)
    assert p.objects_per_rank == 4 and p.part_bytes <= 64 << 20  # the job's parts bounded, not two per thread
    assert p.save_requests == 4096 * (4 + 1) + 2  # parts, a marker per rank, manifest, pointer
    assert p.restore_requests == 4096 * 4 + 2 and TB <= p.restore_store_bytes <= TB + 4096
    assert p.save_bound == "request rate" and p.save_s == p.save_requests / 3500
    alone = plan_requests(TB, 4096, options=SaveOptions(restore_fanout=False))
    assert alone.restore_store_bytes == 4096 * p.restore_store_bytes  # every rank reads all of it
    assert plan_requests(TB, 4096, sharded=True, options=SaveOptions(restore_fanout=False)).restore_store_bytes \
        == p.restore_store_bytes
    assert plan_requests(TB, 4096, limits=GCS).save_s > p.save_s


@given(st.integers(1, 10**16), st.integers(1, 1 << 16), st.sampled_from([4 << 20, 64 << 20, 1 << 30]))
def test_every_byte_is_in_a_part_and_no_part_is_larger_than_part_size(state: int, world: int, part: int) -> None:
    p = plan_requests(state, world, options=SaveOptions(part_size=part))
    share = -(-state // world)
    assert p.part_bytes <= part and p.objects_per_rank * p.part_bytes >= share
    assert p.save_requests >= world * (p.objects_per_rank + 1) + 2
    assert p.save_s > 0 and p.restore_s > 0


def test_the_plan_cuts_a_share_as_a_real_save_does(tmp_path: Path) -> None:
    root = f"memory://{tmp_path.name}/ckpt"  # a store with requests (a local disk is cut per thread)
    options = SaveOptions(part_size=8 << 20)
    with CheckpointManager(root, options=options, async_save=False) as mgr:
        mgr.save(1, {"w": torch.zeros(30 << 20, dtype=torch.uint8)})
    store = Store(root)
    pointer = read_pointer(store)
    assert pointer is not None
    files = read_manifest(store, 1, path=pointer.path).files
    total = sum(f.raw_size for f in files)
    assert plan_requests(total, 1, options=options).objects_per_rank == len(files) == 8  # 4 MiB each


def test_ckpt_plan_prints_and_answers_json() -> None:
    text = CliRunner().invoke(cli, ["ckpt", "plan", "--state-bytes", "1TB", "--world", "4096"])
    assert text.exit_code == 0, text.output
    assert "4 parts of 61.0 MB per rank" in text.output and "20,482 write requests" in text.output
    doc = json.loads(CliRunner().invoke(cli, ["ckpt", "plan", "--state-bytes", "10TB", "--world", "16384",
                                              "--store", "gcs", "--sharded", "--json"]).output)
    assert doc["world"] == 16384 and doc["save_bound"] == "request rate" and doc["store"].startswith("gcs")
    bad = CliRunner().invoke(cli, ["ckpt", "plan", "--state-bytes", "lots", "--world", "8"])
    assert bad.exit_code == 2 and "'lots' is not a size" in bad.output
    assert CliRunner().invoke(cli, ["ckpt", "plan", "--state-bytes", "1TB", "--world", "0"]).exit_code == 2


@pytest.mark.parametrize(("state", "world", "per_node"), [(0, 8, 8), (TB, 0, 8), (TB, 8, 0)])
def test_a_size_or_count_that_is_not_positive_is_refused(state: int, world: int, per_node: int) -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        plan_requests(state, world, ranks_per_node=per_node)


def test_spreading_over_key_prefixes_divides_the_request_bound_once_the_store_partitions_them() -> None:
    p = plan_requests(10 * TB, 16384)
    assert p.key_prefixes == 16 and p.save_s == p.save_requests / 3500  # one prefix: the bound as before
    busiest = 16384 // 16 * (p.objects_per_rank + 1)  # 1,024 ranks per prefix: parts and markers
    assert p.save_s_spread == pytest.approx(busiest / 3500) and p.save_s_spread < p.save_s / 15
    flat = plan_requests(10 * TB, 16384, options=SaveOptions(key_prefixes=1))
    assert flat.key_prefixes == 1 and flat.save_s_spread >= flat.save_s - 0.01 and flat.restore_s_spread >= (
        flat.restore_s - 0.01)
    assert plan_requests(TB, 3).key_prefixes == 3  # never more prefixes than ranks
    out = CliRunner().invoke(cli, ["ckpt", "plan", "--state-bytes", "10TB", "--world", "16384"]).output
    assert "spread     over 16 key prefixes" in out and "save >= 3.2 s" in out
    assert "spread" not in CliRunner().invoke(cli, ["ckpt", "plan", "--state-bytes", "10TB", "--world", "16384",
                                                    "--key-prefixes", "1"]).output
