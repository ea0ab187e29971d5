"""The plugin keeps the managers of the roots it saved to last (streamio.lightning.managers): the
next save to ``last.ckpt`` reads no pointer, yet its swap is still a compare-and-swap; a removed
root, a failed save and a pickled plugin start afresh. moto behind the FaultProxy (real HTTP)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from streamio.checkpoint.root import committed_saves, read_pointer
from streamio.errors import CheckpointConflictError, CheckpointError
from streamio.storage import Store
from streamio.testing import FaultProxy, S3Endpoint

L = pytest.importorskip("lightning")

from streamio.lightning import CheckpointIO  # noqa: E402


def _ckpt(step: int, weight: float = 1.0) -> dict[str, Any]:
    return {"epoch": 0, "global_step": step, "state_dict": {"w": torch.full((64, 64), weight)}}


@pytest.fixture
def proxied(s3: S3Endpoint) -> Iterator[tuple[CheckpointIO, FaultProxy]]:
    with FaultProxy(s3.endpoint_url) as proxy:
        yield CheckpointIO(storage_options=s3.storage_options(proxy.endpoint_url)), proxy


def _pointer_reads(proxy: FaultProxy) -> int:
    return sum(1 for r in proxy.log() if r.method in ("GET", "HEAD") and r.path.endswith("/latest.json"))


def test_a_path_saved_again_reads_no_pointer_and_another_writer_is_still_refused(
        proxied: tuple[CheckpointIO, FaultProxy], s3: S3Endpoint) -> None:
    io, proxy = proxied
    path = s3.url("run/ckpt/last.ckpt")
    io.save_checkpoint(_ckpt(4), path)
    assert _pointer_reads(proxy) > 0  # a root this plugin never saved to: adopted (the pointer read)
    proxy.clear()
    io.save_checkpoint(_ckpt(8, 2.0), path)
    assert _pointer_reads(proxy) == 0 and proxy.count("DELETE") > 0  # the save of step 4 retired
    assert [s.step for s in committed_saves(Store(path, s3.storage_options()))] == [8]

    other = CheckpointIO(storage_options=s3.storage_options())  # another job on the same path
    other.save_checkpoint(_ckpt(9, 3.0), path)
    with pytest.raises(CheckpointConflictError, match=r"latest\.json changed since this job last read it"):
        io.save_checkpoint(_ckpt(12, 4.0), path)
    store = Store(path, s3.storage_options())
    assert read_pointer(store).step == 9  # the other job's save stays current, nothing of it deleted
    assert torch.equal(other.load_checkpoint(path)["state_dict"]["w"], torch.full((64, 64), 3.0))
    io.save_checkpoint(_ckpt(12, 4.0), path)  # the failed save's manager was dropped: this one adopts
    assert read_pointer(store).step == 12 and [s.step for s in committed_saves(store)] == [12]


def test_same_step_again_a_removed_root_and_a_pickled_plugin_start_afresh(
        proxied: tuple[CheckpointIO, FaultProxy], s3: S3Endpoint) -> None:
    io, proxy = proxied
    path = s3.url("run/ckpt/last.ckpt")
    io.save_checkpoint(_ckpt(8), path)
    io.save_checkpoint(_ckpt(8, 2.0), path)  # save_last after top-k at one step: adopted again
    assert torch.equal(io.load_checkpoint(path)["state_dict"]["w"], torch.full((64, 64), 2.0))
    io.remove_checkpoint(path)
    io.save_checkpoint(_ckpt(4, 3.0), path)  # the removed root's pointer is gone: created anew
    assert read_pointer(Store(path, s3.storage_options())).step == 4
    copy = pickle.loads(pickle.dumps(io))  # ddp_spawn pickles the plugin: no live manager travels
    copy.save_checkpoint(_ckpt(5, 4.0), path)
    assert copy.load_checkpoint(path)["global_step"] == 5
    io.teardown()
    with pytest.raises(CheckpointError, match=r"hyper_parameters"):
        io.save_checkpoint({**_ckpt(6), "hyper_parameters": {"f": object()}}, path)
    assert read_pointer(Store(path, s3.storage_options())).step == 5
