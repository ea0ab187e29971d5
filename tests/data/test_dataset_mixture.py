"""StreamingDataset over a mixture: sources in different stores, stated shares, exact elastic resume.

Ranks are simulated in one process (torchrun's RANK/WORLD_SIZE); DataLoader workers are real
processes; one source lives in moto S3 (real HTTP), the other on local disk.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest

import streamio
from streamio.data.dataset import StreamingDataset
from streamio.data.format.index import write_index
from streamio.data.loader import StreamingDataLoader
from streamio.data.options import DatasetOptions
from streamio.data.write.indexer import build_index
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.errors import ConfigError, PlanError, StateMismatchError
from streamio.storage import Store
from streamio.testing import S3Endpoint

A_COUNTS = [9, 4, 12, 7]  # 32 samples
B_COUNTS = [5, 6, 3]  # 14 samples


def _make(url: str, options: Any, prefix: str, counts: list[int]) -> None:
    store = Store(url, options)
    for shard, n in enumerate(counts):
        samples = ({"__key__": f"{prefix}{shard}-{i:03d}", "txt": f"{prefix}{shard}-{i}".encode()} for i in range(n))
        write_dataset(samples, store, spec=ShardSpec(max_count=n, prefix=f"part{shard:03d}"))
        store.delete("index.json")  # one shard per write, its index dropped: the shards add up
    write_index(store, build_index(store))


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str) -> tuple[str, str, dict[str, Any]]:
    s3 = S3Endpoint(moto_endpoint, "unused").new_bucket()
    a = str(tmp_path_factory.mktemp("mix") / "a")
    _make(a, None, "a", A_COUNTS)
    b = f"s3://{s3.bucket}/b"
    _make(b, s3.storage_options(), "b", B_COUNTS)
    return a, b, s3.storage_options()


def _keys(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


def _mixture(a: str, b: str, opts: dict[str, Any], **kw: Any) -> list[streamio.Stream]:
    return [streamio.Stream(a, weight=kw.get("wa", 0.7)), streamio.Stream(b, weight=0.3, storage_options=opts)]


def _read(
    ds: StreamingDataset, workers: int, *, state: Any = None, stop: int | None = None
) -> tuple[list[list[str]], Any]:
    loader = StreamingDataLoader(ds, num_workers=workers, collate_fn=_keys)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    for batch in loader:
        out.append(batch)
        if stop is not None and len(out) == stop:
            break
    return out, loader.state_dict()


def test_each_source_contributes_its_share_exactly(sources: Any, as_rank: Any) -> None:
    a, b, opts = sources
    seen: list[str] = []
    batches = []
    for rank in range(2):
        as_rank(rank, 2)
        ds = StreamingDataset(
            _mixture(a, b, opts), batch_size=4, options=DatasetOptions(policy="drop", epoch_samples=40)
        )
        assert ds.contributions == (28, 12)
        got, _ = _read(ds, 2)
        batches.append(len(got))
        seen += [k for bt in got for k in bt]
    assert len(set(batches)) == 1
    by_source = collections.Counter(k[0] for k in seen)
    assert by_source == {"a": 28, "b": 12}
    assert max(collections.Counter(seen).values()) == 1  # both shares are below the sources' sizes


def test_a_source_smaller_than_its_share_repeats_evenly_and_others_rotate(sources: Any, as_rank: Any) -> None:
    a, b, opts = sources
    as_rank(0, 1)
    mix = [streamio.Stream(a, samples=16), streamio.Stream(b, samples=35, storage_options=opts)]
    epochs = []
    for epoch in (0, 1):
        ds = StreamingDataset(mix, batch_size=1, seed=3)
        ds.set_epoch(epoch)
        epochs.append([k for bt in _read(ds, 0)[0] for k in bt])
    b_counts = collections.Counter(k for k in epochs[0] if k.startswith("b"))
    assert set(b_counts.values()) <= {2, 3} and sum(b_counts.values()) == 35  # 35 / 14: floor or ceil
    a_halves = [{k for k in e if k.startswith("a")} for e in epochs]
    assert len(a_halves[0]) == len(a_halves[1]) == 16 and not a_halves[0] & a_halves[1]  # the next part


def test_a_plain_list_of_urls_is_every_sample_of_each(sources: Any, as_rank: Any) -> None:
    a, b, opts = sources
    as_rank(0, 1)
    ds = StreamingDataset([a, streamio.Stream(b, storage_options=opts)], batch_size=2, shuffle=False)
    keys = [k for bt in _read(ds, 1)[0] for k in bt]
    assert sorted(keys) == sorted({k for k in keys}) and len(keys) == sum(A_COUNTS) + sum(B_COUNTS)
    assert "mixture of 2" in repr(ds)


@pytest.mark.slow
@pytest.mark.parametrize(("world2", "workers2"), [(2, 2), (3, 1), (1, 0)])
def test_mid_epoch_resume_on_any_topology_loses_and_repeats_nothing(
    sources: Any, as_rank: Any, world2: int, workers2: int
) -> None:
    a, b, opts = sources
    kw = {"batch_size": 2, "seed": 11, "options": DatasetOptions(policy="drop", epoch_samples=40)}
    full: list[str] = []
    for rank in range(2):
        as_rank(rank, 2)
        full += [k for bt in _read(StreamingDataset(_mixture(a, b, opts), **kw), 2)[0] for k in bt]
    first: list[str] = []
    states = []
    for rank in range(2):
        as_rank(rank, 2)
        got, state = _read(StreamingDataset(_mixture(a, b, opts), **kw), 2, stop=3)
        first += [k for bt in got for k in bt]
        states.append(state)
    rest: list[str] = []
    uninterrupted_rank0: list[str] = []
    for rank in range(world2):
        as_rank(rank, world2)
        got, _ = _read(StreamingDataset(_mixture(a, b, opts), **kw), workers2, state=states[0])
        rest += [k for bt in got for k in bt]
        if world2 == 2 and workers2 == 2 and rank == 0:
            uninterrupted_rank0 = [k for bt in got for k in bt]
    together = collections.Counter(first + rest)
    if world2 == 2 and workers2 == 2:
        assert together == collections.Counter(full)  # same topology: exactly the uninterrupted epoch
        as_rank(0, 2)
        whole = [k for bt in _read(StreamingDataset(_mixture(a, b, opts), **kw), 2)[0] for k in bt]
        assert whole[6:] == uninterrupted_rank0  # ... in the same order
    else:
        assert max(together.values()) == 1  # nothing repeated
        lost = collections.Counter(full) - together
        assert sum(lost.values()) < world2  # only the new stage's stated 'drop' tail


def test_changing_a_weight_is_a_clear_error(sources: Any, as_rank: Any) -> None:
    a, b, opts = sources
    as_rank(0, 1)
    kw = {"batch_size": 2, "options": DatasetOptions(epoch_samples=40)}
    _, state = _read(StreamingDataset(_mixture(a, b, opts), **kw), 0, stop=2)
    other = StreamingDataset(_mixture(a, b, opts, wa=0.5), **kw)
    with pytest.raises(StateMismatchError, match=r"source '[^']*/a' samples per epoch"):
        other.load_state_dict(state["dataset"] if "dataset" in state else state)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda a, b: [streamio.Stream(a, weight=1, samples=3)], ConfigError, "not both"),
        (lambda a, b: [a, 7], ConfigError, "neither a URL"),
        (lambda a, b: [], ConfigError, "non-empty list"),
        (lambda a, b: [streamio.Stream(a, weight=-1.0)], PlanError, "weight=-1.0"),
        (lambda a, b: [streamio.Stream(a, samples=0)], PlanError, "samples=0"),
    ],
)
def test_bad_mixtures_are_refused_with_a_clear_error(sources: Any, make: Any, error: type, match: str) -> None:
    a, b, _ = sources
    with pytest.raises(error, match=match):
        ds = StreamingDataset(make(a, b), batch_size=1)
        ds.plan()


def test_a_source_may_be_an_indexed_brace_pattern(sources: Any, as_rank: Any) -> None:
    a, _, _ = sources
    as_rank(0, 1)
    ds = StreamingDataset([streamio.Stream(f"{a}/part{{000..003}}-000000.tar", weight=1.0)], batch_size=1)
    assert sum(1 for _ in ds) == sum(A_COUNTS)
