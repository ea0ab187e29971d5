"""The transport's rings under an address-space limit: sized to the batches, one per worker, or the pipe.

Issue 23, item 12: under ``ulimit -v`` 3 GiB, 8 StreamingDataLoader workers failed where a plain
DataLoader worked: every iteration mapped a 256 MiB ring per worker, and every worker inherited
every ring. Now a ring is sized from the batch (batch size x the largest mean sample of a shard,
room for 16 batches, 4 MiB to 256 MiB), each worker unmaps the rings that are not its own, and a ring
that cannot be mapped turns the transport off for that iteration with a log line. Each case runs in
a child whose address space is capped at its size plus a margin a plain DataLoader needs
(tests/support/ring_limits.py).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamio.data.dataloader.transport import MIN_RING, RESERVE, SharedBatches, ring_bytes
from streamio.data.write.writer import ShardSpec, write_dataset

CHILD = str(Path(__file__).parents[1] / "support" / "ring_limits.py")
MARGIN_MIB = 1280  # above what 8 workers of a plain DataLoader add here, below 8 rings of 256 MiB


def dataset(path: Path, samples: int, size: int) -> str:
    url = str(path)
    rows = ({"__key__": f"{i:05d}", "bin": os.urandom(size), "cls": b"%d" % (i % 10)} for i in range(samples))
    write_dataset(rows, url, spec=ShardSpec(max_count=25))
    return url


def epoch_under_limit(url: str, batch: int, workers: int) -> dict[str, Any]:
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1"}
    out = subprocess.run(
        [sys.executable, CHILD, url, str(batch), str(workers), str(MARGIN_MIB)],
        capture_output=True, text=True, timeout=240, check=False, env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


@pytest.mark.slow
def test_eight_workers_read_an_epoch_where_a_plain_dataloader_does(tmp_path: Path) -> None:
    got = epoch_under_limit(dataset(tmp_path / "ds", 200, 64 << 10), batch=32, workers=8)
    assert got["plain"] == 7  # the control: the limit leaves room for a plain DataLoader
    assert got["streaming"] == 7 and got["logged"] == []  # through rings of 32 MiB, not 256


@pytest.mark.slow
def test_rings_that_cannot_be_mapped_leave_the_batches_to_the_pipe(tmp_path: Path) -> None:
    got = epoch_under_limit(dataset(tmp_path / "ds", 48, 1 << 20), batch=16, workers=8)  # rings of 256 MiB
    assert got["plain"] == 3 and got["streaming"] == 3
    [line] = got["logged"]
    assert "rings of 256 MiB for 8 DataLoader workers could not be mapped" in line and "through the pipe" in line


def test_a_ring_is_sized_to_its_batches() -> None:
    assert ring_bytes(32 * (64 << 10)) == 32 << 20
    assert ring_bytes(100) == MIN_RING and ring_bytes(1 << 30) == RESERVE


def _child_keeps_one(shared: SharedBatches, conn: Any) -> None:
    shared.keep_only(1)
    conn.send([r.mem.closed for r in shared._rings or ()])


def test_a_worker_keeps_only_its_own_ring() -> None:
    shared = SharedBatches(3, MIN_RING)
    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_child_keeps_one, args=(shared, theirs))
    child.start()
    closed = mine.recv()
    child.join(30)
    assert closed == [True, False, True]  # in the worker: only ring 1 is still mapped
    assert [r.mem.closed for r in shared._rings or ()] == [False, False, False]  # the main process keeps all
    shared.close()
