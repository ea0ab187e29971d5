"""Builds small real datasets (uneven shards, tiny ones included) for the StreamingDataset tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from streamio.data.format.index import DatasetIndex, write_index
from streamio.data.write.indexer import build_index
from streamio.data.write.writer import ShardSpec, write_dataset
from streamio.storage import Store

UNEVEN_37 = [
    1, 7, 2, 30, 13, 1, 5, 22, 9, 3, 17, 4, 11, 2, 26, 6, 1, 14, 8,
    19, 3, 12, 5, 24, 2, 10, 7, 1, 16, 4, 9, 21, 3, 6, 15, 2, 8,
]


def key(shard: int, i: int) -> str:
    return f"s{shard:03d}-{i:05d}"


def make_dataset(
    url: str, storage_options: Mapping[str, Any] | None, counts: Sequence[int], *, compression: str | None = None
) -> DatasetIndex:
    """One shard per entry of ``counts`` (that many samples), indexed; sample keys via :func:`key`."""
    store = Store(url, storage_options)
    for shard, n in enumerate(counts):
        samples = (
            {"__key__": key(shard, i), "txt": key(shard, i).encode(), "cls": str(i % 10).encode()} for i in range(n)
        )
        spec = ShardSpec(max_count=max(n, 1), compression=compression, prefix=f"part{shard:03d}")
        write_dataset(samples, store, spec=spec)
        store.delete("index.json")  # one shard per write, its index dropped: the shards add up
    index = build_index(store)
    write_index(store, index)
    return index


def all_keys(counts: Sequence[int]) -> list[str]:
    return [key(s, i) for s, n in enumerate(counts) for i in range(n)]
