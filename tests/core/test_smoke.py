"""The package installs, imports, and its public surface is what we meant it to be."""

from __future__ import annotations

import subprocess
import sys

import streamio
from streamio.storage import Store


def test_public_api_is_pinned() -> None:
    assert sorted(streamio.__all__) == sorted([
        "CacheConfig", "CheckpointManager", "DatasetIndex", "DatasetOptions", "KeepAll", "KeepBest", "KeepEvery",
        "KeepLast", "LocalTier", "Pack", "PartSummary", "PartitionedWrite", "Preemption",
        "PrefetchConfig", "RNGState", "RetentionPolicy", "RetryPolicy", "SaveOptions", "SaveStats", "ShardSpec",
        "Shuffle", "Stream",
        "Store", "StreamingDataLoader", "StreamingDataset", "__version__", "build_index", "errors", "load_index",
        "select", "write_dataset",
    ])
    assert all(hasattr(streamio, name) for name in streamio.__all__)


def test_cli_help_runs_from_the_installed_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "streamio.cli.main", "--help"], capture_output=True, text=True, check=True
    )
    assert "Usage" in out.stdout


def test_store_roundtrip(store: Store) -> None:
    store.put("a/b.bin", b"hello")
    assert store.read("a/b.bin") == b"hello"
    assert store.read("a/b.bin", 1, 3) == b"el"
    assert [o.path for o in store.list()] == ["a/b.bin"]
    assert store.info("a/b.bin").size == 5
