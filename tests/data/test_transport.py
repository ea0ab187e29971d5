"""Batches cross from DataLoader workers through shared-memory rings: same batches, nothing overwritten early."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from typing import Any

import numpy as np
import pytest

from streamio.data.dataloader import transport
from streamio.data.dataloader.allocator import tune_worker_malloc
from streamio.data.dataloader.transport import MIN_RING, SharedBatches, forked_workers
from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.storage import Store

KB = 1024


def batch_of(n: int, size: int, tag: int = 0) -> dict[str, Any]:
    return {
        "__key__": [f"k{i}" for i in range(n)],
        "bin": [bytes([tag + i & 0xFF]) * size for i in range(n)],
        "cls": [b"%d" % i for i in range(n)],
        "__index__": list(range(n)),
    }


def cross(batch: Any) -> Any:
    """What the main process gets: the batch pickled in the worker and unpickled here."""
    return pickle.loads(pickle.dumps(batch))


def test_a_packed_batch_arrives_equal_with_its_keys_in_order() -> None:
    shared = SharedBatches(1)
    batch = batch_of(8, 64 * KB)
    packed = shared.pack(0, batch)
    assert type(packed) is not dict  # it went through the ring
    assert len(pickle.dumps(packed)) < 4 * KB  # offsets cross the pipe, not 512 KB of bytes
    out = cross(packed)
    assert out == batch and list(out) == list(batch)
    assert all(type(x) is bytes for x in out["bin"])


def test_numeric_arrays_cross_through_the_ring_as_new_equal_arrays() -> None:
    shared = SharedBatches(1)
    batch = {"__sequence__": [0, 1], "tokens": np.arange(2 * 4097, dtype=np.int64).reshape(2, 4097),
             "doc_ids": np.zeros((2, 4097), dtype=np.int32), "mask": np.ones(3, dtype=bool), "names": ["a", "b"]}
    packed = shared.pack(0, batch)
    assert type(packed) is not dict and len(pickle.dumps(packed)) < 4 * KB  # offsets cross, not 100 KB
    out = cross(packed)
    assert list(out) == list(batch) and out["names"] == ["a", "b"]
    for key in ("tokens", "doc_ids", "mask"):
        assert out[key].dtype == batch[key].dtype and np.array_equal(out[key], batch[key])
        assert out[key].flags.writeable and not np.shares_memory(out[key], batch[key])


def test_small_batches_and_other_types_cross_as_they_are() -> None:
    shared = SharedBatches(1)
    small = batch_of(4, 100)
    assert shared.pack(0, small) is small
    for other in ([b"x" * 100_000], ("a", b"b"), {"x": [b"a" * 100_000, "str"]}):
        assert shared.pack(0, other) is other


def test_ring_space_is_reused_only_after_the_main_process_copied_it_out() -> None:
    shared = SharedBatches(1)
    size = MIN_RING // 8
    first = [shared.pack(0, batch_of(1, size, tag)) for tag in range(7)]
    assert all(type(p) is not dict for p in first)
    # the ring holds 8 batches of the first one's size (the minimum ring): an 8th and 9th do not fit
    # until the main process has copied the first ones out; they cross the pipe instead
    over = batch_of(1, size, 7)
    held = shared.pack(0, over)
    assert type(held) is not dict
    blocked = batch_of(1, size, 8)
    assert shared.pack(0, blocked) is blocked  # no space: not packed, nothing overwritten
    assert [cross(p)["bin"][0][0] for p in first[:2]] == [0, 1]  # the main process copies two out
    again = [shared.pack(0, batch_of(1, size, 20 + i)) for i in range(2)]
    assert all(type(p) is not dict for p in again)  # ...and exactly that space is reused (wrapping)
    assert [cross(p)["bin"][0][0] for p in first[2:] + [held] + again] == [2, 3, 4, 5, 6, 7, 20, 21]


def test_a_batch_larger_than_the_ring_crosses_the_pipe() -> None:
    shared = SharedBatches(1)
    assert type(shared.pack(0, batch_of(1, 64 * KB))) is not dict  # sizes the ring: 4 MiB
    huge = batch_of(1, MIN_RING + 1)
    assert shared.pack(0, huge) is huge


def test_a_pickled_transport_packs_nothing_and_a_closed_one_says_why() -> None:
    shared = SharedBatches(1)
    copy = cross(shared)  # what a spawn worker would get
    batch = batch_of(8, 64 * KB)
    assert copy.pack(0, batch) is batch
    packed = pickle.dumps(shared.pack(0, batch))
    shared.close()
    with pytest.raises(RuntimeError, match="after its loader's iteration ended"):
        pickle.loads(packed)


def test_only_forked_workers_share_the_rings() -> None:
    assert forked_workers("fork") and not forked_workers("spawn")
    assert not forked_workers(multiprocessing.get_context("forkserver"))
    assert forked_workers(None) == (multiprocessing.get_start_method() == "fork")


@pytest.fixture(scope="module")
def ds_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "big")
    samples = ({"__key__": f"k{i:03d}", "bin": os.urandom(20 * KB + i), "cls": b"%d" % i} for i in range(48))
    write_dataset(samples, Store(url), spec=ShardSpec(max_count=24), overwrite=True)
    return url


def _worker_state(sample: dict[str, Any]) -> dict[str, Any]:
    from streamio.data.dataloader import allocator

    return {**sample, "tuned": allocator._tuned_in == os.getpid()}


def test_a_loader_with_workers_delivers_through_the_rings_what_the_shards_hold(ds_url: str) -> None:
    ds = StreamingDataset(ds_url, batch_size=4, seed=3, transform=_worker_state)
    held = {s["__key__"]: s["bin"] for s in StreamingDataset(ds_url, shuffle=False)}
    loader = StreamingDataLoader(ds, num_workers=2)
    it = iter(loader)
    got = [next(it) for _ in range(12)]
    shared = loader._collate.shared
    assert shared is not None and shared._rings is not None
    assert [r.consumed for r in shared._rings] == [6, 6]  # every batch went through a ring
    assert list(it) == [] and shared._rings is None  # unmapped once the epoch is delivered, not at the next
    delivered = {k: v for b in got for k, v in zip(b["__key__"], b["bin"], strict=True)}
    assert sum(len(b["__key__"]) for b in got) == 48 and delivered == held
    assert all(type(v) is bytes for v in delivered.values())
    assert all(b["tuned"].tolist() == [True] * 4 for b in got)  # workers tuned their allocator


def test_the_allocator_settings_apply_once_per_process() -> None:
    assert tune_worker_malloc() and tune_worker_malloc()


def test_without_glibc_the_allocator_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamio.data.dataloader import allocator

    monkeypatch.setattr(allocator, "_tuned_in", None)
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: "/nonexistent/libc-not-here.so")
    assert tune_worker_malloc() is False
    assert transport  # the module under test imports without glibc-specific code


def test_an_abandoned_iteration_leaves_the_next_one_whole(ds_url: str) -> None:
    ds = StreamingDataset(ds_url, batch_size=4, seed=5)
    loader = StreamingDataLoader(ds, num_workers=2)
    it = iter(loader)
    first = [next(it)["__key__"] for _ in range(3)]
    again = [b["__key__"] for b in loader]  # a new iteration (new workers, new rings) while the old one dies
    del it
    assert again[:3] == first and sorted(k for b in again for k in b) == [f"k{i:03d}" for i in range(48)]
