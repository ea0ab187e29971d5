"""Checkpoints on local disk: how a local root is cut into parts and read back.

Local roots get one part per upload thread (each part pays a temp file, fsync and rename; a
rank's parts share one directory fsync, its marker's; there are no slow requests to spread) and
a ``Store.read`` that reads a file in one call instead of joining 1 MiB pieces. These tests pin
both down, and that speed did not cost a guarantee: a corrupt part is still refused before
anything is loaded.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from streamio.checkpoint import CheckpointManager, KeepLast, SaveOptions
from streamio.checkpoint.format import layout
from streamio.checkpoint.options import part_size_for
from streamio.checkpoint.root import read_manifest
from streamio.errors import CorruptDataError, ObjectNotFoundError
from streamio.storage import Store

MiB = 1 << 20


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(5 * MiB // 4, generator=g), "b": torch.randn(3 * MiB // 4, generator=g)}  # 8 MiB


def test_part_size_local_is_one_part_per_thread_remote_two() -> None:
    opts = SaveOptions(part_size=64 * MiB, concurrency=8)
    total = 300 * MiB
    assert part_size_for(total, opts, local=True) == math.ceil(total / 8)
    assert part_size_for(total, opts) == math.ceil(total / 16)
    assert part_size_for(total, SaveOptions(part_size=16 * MiB, concurrency=8), local=True) == 16 * MiB  # cap kept
    assert part_size_for(1 * MiB, opts, local=True) == 4 * MiB  # floor kept


@pytest.mark.parametrize(("url_kind", "parts"), [("file", 4), ("memory", 6)])
def test_saved_part_count_per_backend(tmp_path, url_kind: str, parts: int) -> None:  # type: ignore[no-untyped-def]
    root = str(tmp_path / "ckpt") if url_kind == "file" else f"memory://ckpt-local-io-{os.getpid()}-{id(tmp_path)}"
    state = {"t": torch.arange(6 * MiB, dtype=torch.float32)}  # 24 MiB: 4 parts of 6 MiB on disk, 6 of 4 MiB elsewhere
    with CheckpointManager(root, async_save=False, options=SaveOptions(concurrency=4)) as mgr:
        mgr.save(1, state)
        assert mgr.last_stats is not None and mgr.last_stats.files == parts
        live = {"t": torch.zeros_like(state["t"])}
        assert mgr.restore(live) == 1
    assert torch.equal(live["t"], state["t"])


def _two_steps(root: Path) -> list[Path]:
    """Save steps 1 and 2 under ``root``; the paths of step 2's part files."""
    with CheckpointManager(
        str(root), async_save=False, retention=KeepLast(5), options=SaveOptions(concurrency=4)
    ) as mgr:
        mgr.save(1, _state(1))
        mgr.save(2, _state(2))
    return [root / layout.step_dir(2) / f.path for f in read_manifest(Store(str(root)), 2).files]


def _restore_walks_back(root: Path, error: str) -> None:
    """Step 2 is refused naming ``error`` with nothing loaded; the default restore returns step 1."""
    live = {k: torch.zeros_like(v) for k, v in _state(0).items()}
    with CheckpointManager(str(root)) as mgr:
        with pytest.raises(CorruptDataError, match=error):
            mgr.restore(live, step=2)
        assert all(not v.any() for v in live.values())  # nothing was loaded from the bad step
        assert mgr.restore(live) == 1  # walks back to the good one
    assert all(torch.equal(live[k], v) for k, v in _state(1).items())


def test_local_restore_refuses_a_corrupt_part_before_loading(tmp_path) -> None:  # type: ignore[no-untyped-def]
    part = _two_steps(tmp_path / "ckpt")[1]
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    part.write_bytes(bytes(raw))
    _restore_walks_back(tmp_path / "ckpt", "checksum")


def test_local_store_read_matches_streamed_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path / "root"))
    data = os.urandom(3 * MiB + 17)
    store.put("d/x", data)
    assert store.read("d/x") == data == b"".join(store.iter_bytes("d/x"))
    assert store.read("d/x", 5) == data[5:]
    assert store.read("d/x", MiB, 2 * MiB + 3) == data[MiB : 2 * MiB + 3]
    assert store.read("d/x", len(data)) == b""
    with pytest.raises(CorruptDataError, match="d/x"):
        store.read("d/x", 0, len(data) + 1)  # a manifest promising more than the file holds
    with pytest.raises(ObjectNotFoundError, match="d/missing"):
        store.read("d/missing")


def test_local_read_view_maps_the_file_read_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(str(tmp_path / "root"))
    data = os.urandom(2 * MiB + 5)
    store.put("p", data)
    store.put("empty", b"")
    view = store.read_view("p")
    assert isinstance(view, memoryview) and view.readonly and view == data
    os.unlink(tmp_path / "root" / "p")  # retention deleting a part while a restore reads it
    assert view == data
    assert store.read_view("empty") == b""
    with pytest.raises(ObjectNotFoundError, match="nope"):
        store.read_view("nope")


def test_local_restore_refuses_a_truncated_part(tmp_path) -> None:  # type: ignore[no-untyped-def]
    part = _two_steps(tmp_path / "ckpt")[0]
    part.write_bytes(part.read_bytes()[:-100])
    _restore_walks_back(tmp_path / "ckpt", "truncated")


_SAVE = """
import sys, torch
from streamio.checkpoint import CheckpointManager, SaveOptions
with CheckpointManager(sys.argv[1], async_save=False, options=SaveOptions(concurrency=4)) as m:
    m.save(1, {"w": torch.arange(4 << 20, dtype=torch.float32)})
"""


@pytest.mark.slow  # a child process under strace
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to see the fsync calls")
def test_a_local_share_takes_one_directory_fsync_after_every_part_is_linked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every part's name is durable before the marker's is (the marker's put fsyncs the rank directory
    after every part's link), with one directory fsync per share instead of one per part."""
    trace = tmp_path / "trace"
    root = tmp_path / "root"
    calls = "trace=fsync,link,linkat,rename,renameat,renameat2"
    cmd = ["strace", "-f", "-y", "-o", str(trace), "-e", calls, sys.executable, "-c", _SAVE, f"file://{root}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0 and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr
    rank_dir = str(root / "step-000000001" / "rank-00000")
    events = []  # ("link", name): a link or rename made it visible; ("fsync", path); in the order called
    for line in trace.read_text().splitlines():
        if (m := re.search(r"\b(?:link|rename)\w*\(.*\"([^\"]+)\"", line)) is not None:
            events.append(("link", os.path.basename(m.group(1))))
        elif (m := re.search(r"\bfsync\(\d+<([^>]+)>", line)) is not None:
            events.append(("fsync", m.group(1)))
    parts = [i for i, (kind, name) in enumerate(events) if kind == "link" and name.startswith("part-")]
    dir_syncs = [i for i, e in enumerate(events) if e == ("fsync", rank_dir)]
    assert len(parts) == 4 and len(dir_syncs) == 1, events  # was one fsync of the directory per part, and the marker's
    assert dir_syncs[0] > max(parts)
    assert events[dir_syncs[0] - 1][1].startswith("done-")  # the marker's own put
