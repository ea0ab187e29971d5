"""StreamingDataLoader takes the dataset's batch size: given once, to the dataset."""

from __future__ import annotations

from typing import Any

import pytest

from streamio.data.dataset import StreamingDataset
from streamio.data.loader import StreamingDataLoader
from streamio.errors import ConfigError, PlanError
from support.dataset import make_dataset


def keys_of(batch: list[dict[str, Any]]) -> list[str]:
    return [s["__key__"] for s in batch]


@pytest.fixture(scope="module")
def ds_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("ds") / "ten")
    make_dataset(url, None, [10])
    return url


@pytest.mark.parametrize("workers", [0, 2])
def test_without_batch_size_the_loader_uses_the_datasets(ds_url: str, workers: int) -> None:
    ds = StreamingDataset(ds_url, batch_size=5, shuffle=False)
    loader = StreamingDataLoader(ds, num_workers=workers, collate_fn=keys_of)
    assert loader.batch_size == 5
    batches = list(loader)
    assert [len(b) for b in batches] == [5, 5]
    assert loader.state_dict()["dataset"] == ds.state_after(2)  # counted in the dataset's batches


@pytest.mark.parametrize("given", [None, 5])
def test_none_or_the_same_batch_size_is_accepted(ds_url: str, given: int | None) -> None:
    assert StreamingDataLoader(StreamingDataset(ds_url, batch_size=5), batch_size=given).batch_size == 5


def test_positional_batch_size_is_checked_too(ds_url: str) -> None:
    with pytest.raises(PlanError, match="batch_size=2"):
        StreamingDataLoader(StreamingDataset(ds_url, batch_size=5), 2)


def test_a_different_batch_size_names_both_and_the_fix(ds_url: str) -> None:
    with pytest.raises(PlanError) as exc:
        StreamingDataLoader(StreamingDataset(ds_url, batch_size=5), batch_size=8)
    msg = str(exc.value)
    assert "StreamingDataLoader(batch_size=8) differs from the batch_size=5 of StreamingDataset(" in msg
    assert ds_url in msg
    assert "leave batch_size out" in msg and "StreamingDataset(..., batch_size=8)" in msg
    assert isinstance(exc.value, ValueError)  # catchable as the builtin it refines


def test_a_dataset_that_is_not_streaming_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs a StreamingDataset, got list"):
        StreamingDataLoader([1, 2, 3])  # type: ignore[arg-type]


def test_the_default_dataset_batch_size_is_1_and_checked_too(ds_url: str) -> None:
    with pytest.raises(PlanError, match=r"batch_size=3\) differs from the batch_size=1 of"):
        StreamingDataLoader(StreamingDataset(ds_url), batch_size=3)


def test_collate_samples_keeps_meta_as_lists_and_collates_the_rest_as_default_collate() -> None:
    import torch
    from torch.utils.data import default_collate

    from streamio.data.loader import collate_samples

    batch = [{"__key__": f"k{i}", "__index__": i, "bin": b"x" * i, "cls": i, "txt": f"t{i}", "t": torch.full((2,), i)}
             for i in range(3)]
    out = collate_samples(batch)
    assert list(out) == ["__key__", "__index__", "bin", "cls", "txt", "t"]
    assert out["__key__"] == ["k0", "k1", "k2"] and out["__index__"] == [0, 1, 2]  # lists, not tensors
    rest = default_collate([{k: v for k, v in s.items() if not k.startswith("__")} for s in batch])
    assert out["bin"] == rest["bin"] == [b"", b"x", b"xx"] and out["txt"] == rest["txt"]
    assert torch.equal(out["cls"], rest["cls"]) and torch.equal(out["t"], rest["t"])
    assert collate_samples([1, 2]).tolist() == [1, 2]  # not samples: default_collate
